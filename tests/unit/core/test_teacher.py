"""The analytical system: Eq. 10 aggregation, failure recording, summariser validation, template
rationales, simulation-grounded voters. Model answers come from a scripted fake chat model (these
tests need exact answers); the end-to-end run with a real model is in tests/unit/offline/test_collect.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from luna_core.llm import BudgetExceeded, Completion, LLMUnavailable
from luna_core.prompts import knowledge as K
from luna_core.teacher import (ActionOutcome, LLMVoterPool, ScoredVoterPool, Teacher, TeacherConfig, aggregate,
                               Ballot, answer_codes, brief_rationale, key_objects, ranking)
from luna_core.types import ACTION_INDEX, validate_distribution
from tests.unit.core.test_scene import VEH, W, car, near_junction_scene

CX = 85.0 + VEH.rear_axle_to_center


class FakeScriptedModel:
    """Answers each agent kind from its own script, in call order; an Exception in a script is raised."""

    name = "fake-scripted"

    def __init__(self, votes=(), confidences=(), summaries=()) -> None:
        self.scripts = {K.ACTION_VOTING: list(votes), K.CONFIDENCE_ASSESSMENT: list(confidences),
                        K.SUMMARIZATION: list(summaries)}
        self.calls: list[dict] = []

    def chat(self, messages, temperature=0.0, top_k=None, seed=None, max_tokens=256):
        self.calls.append({"system": messages[0]["content"], "temperature": temperature, "top_k": top_k,
                           "seed": seed, "user": messages[-1]["content"]})
        answer = self.scripts[messages[0]["content"]].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Completion(answer, 10, 5, 0.0, "stop", self.name)


def vote(code: str) -> str:
    return f"Step 1: near a junction.\nStep 2: vehicle lead ahead.\nStep 3: choose {code}.\nDecision: {code}"


def conf(c: float | str) -> str:
    return f"The reasoning matches the scene.\nConfidence: {c}"


SUMMARY = ("Recommended decisions: DK,CK\nExplanations:\n- DK: Vehicle lead ahead at 10.00 m is slower, so "
           "slowing down keeps a safe gap before the red light.\n- CK: Holding the speed is possible while the "
           "gap is large.")


def scene():
    return near_junction_scene([car("lead", CX + 10.0, W, v=4.0)])


def teacher(model, m: int, summarizer=True) -> Teacher:
    cfg = TeacherConfig(num_voters=m, top_k=40)
    return Teacher(LLMVoterPool(model, config=cfg), model if summarizer else None, config=cfg)


def test_fake_model_eq10_distribution_summary_and_recorded_failures():
    model = FakeScriptedModel(votes=[vote("DK"), vote("DK"), vote("CK"), vote("AL")],
                              confidences=[conf(0.9), conf(0.5), conf(0.6)], summaries=[SUMMARY])
    r = teacher(model, 4).run(scene(), seed=7)
    assert r.ok and r.rationale_source == "summary_llm"
    p = validate_distribution(r.distribution)
    assert p[ACTION_INDEX["DK"]] == pytest.approx(1.4 / 2.0) and p[ACTION_INDEX["CK"]] == pytest.approx(0.6 / 2.0)
    assert r.ranked == ["DK", "CK"] and r.answer == SUMMARY
    assert r.voting.dropped_voters == 1
    [f] = r.failures
    assert (f.stage, f.voter, f.problem) == ("vote", 3, "masked_action")  # no left lane here
    # Voters sample at 0.7 with top-k and distinct seeds; assessments are deterministic and isolated.
    votes = [c for c in model.calls if c["system"] == K.ACTION_VOTING]
    assert {c["temperature"] for c in votes} == {0.7} and {c["top_k"] for c in votes} == {40}
    assert len({c["seed"] for c in votes}) == 4
    assessments = [c for c in model.calls if c["system"] == K.CONFIDENCE_ASSESSMENT]
    assert {c["temperature"] for c in assessments} == {0.0}
    for a, own in zip(assessments, ("DK", "DK", "CK")):
        assert a["user"].count("Decision:") == 1 and f"Decision: {own}" in a["user"]
    item = r.memory_item("frame-1", 1.0)
    assert item.distribution is r.distribution and item.query.startswith("[Traffic state]")
    json.dumps(r.record())


@pytest.mark.parametrize("bad_vote, bad_conf, problem", [
    (vote("DK"), conf(1.7), "out_of_range"),
    ("步骤三：减速。决策：DK", conf(0.5), "language"),
    (vote("DK")[:30], conf(0.5), "truncated"),
    ("", conf(0.5), "empty"),
    (vote("ZZ"), conf(0.5), "unknown_action"),
])
def test_fake_model_parse_failures_drop_the_voter_and_continue(bad_vote, bad_conf, problem):
    good_first = bad_conf == conf(0.5)  # a vote failure skips its assessment
    confidences = [conf(0.8)] + ([] if good_first else [bad_conf])
    model = FakeScriptedModel(votes=[vote("CK"), bad_vote], confidences=confidences,
                              summaries=[SUMMARY.replace("DK,CK", "CK").split("\n- CK")[0]
                                         .replace("- DK", "- CK")])
    r = teacher(model, 2).run(scene())
    assert r.ok and r.ranked == ["CK"] and r.voting.dropped_voters == 1
    assert [f.problem for f in r.failures] == [problem]
    assert r.failures[0].voter == 1


def test_fake_model_endpoint_errors_are_recorded_and_budget_stops():
    model = FakeScriptedModel(votes=[LLMUnavailable("endpoint down"), vote("SK")], confidences=[conf(0.4)],
                              summaries=[LLMUnavailable("still down")])
    r = teacher(model, 2).run(scene())
    assert r.ok and r.ranked == ["SK"] and r.rationale_source == "template"
    assert [(f.stage, f.problem) for f in r.failures] == [("vote", "LLMUnavailable"), ("summary", "LLMUnavailable")]
    budget = FakeScriptedModel(votes=[BudgetExceeded("cap")])
    with pytest.raises(BudgetExceeded):
        teacher(budget, 1).run(scene())


def test_fake_model_all_voters_fail_fails_the_frame_with_a_reason():
    model = FakeScriptedModel(votes=["no idea", vote("XX")])
    r = teacher(model, 2).run(scene())
    assert not r.ok and r.distribution is None and "no voter produced a valid ballot (2 dropped" in r.reason
    with pytest.raises(ValueError, match="no teacher result"):
        r.memory_item("f", 0.0)


@pytest.mark.parametrize("summary, problem", [
    (SUMMARY.replace("keeps a safe gap", "keeps a safe gap (confidence 0.9)"), "leak"),
    (SUMMARY.replace("DK,CK", "CK,DK").replace("- DK", "- XX").replace("- CK", "- DK").replace("- XX", "- CK")
     .replace("Vehicle lead", "Vehicle lead."), "ranking"),
    ("Recommended decisions: DK,CK\nExplanations:\n- DK: Vehicle lead ahead", "truncated"),
])
def test_fake_model_invalid_summary_falls_back_to_a_faithful_template(summary, problem):
    model = FakeScriptedModel(votes=[vote("DK"), vote("CK")], confidences=[conf(0.9), conf(0.3)],
                              summaries=[summary])
    r = teacher(model, 2).run(scene())
    assert r.ok and r.rationale_source == "template" and r.ranked == ["DK", "CK"]
    assert [(f.stage, f.problem) for f in r.failures] == [("summary", problem)]
    # The template names the decisive object (the red light and the lead) for the first code only.
    assert r.answer == ("Recommended decisions: DK,CK\nExplanations:\n"
                        "- DK: Red light; vehicle lead 10 m ahead (same lane) at 4 m/s.\n- CK: Cruise x Lane Keep.")


def test_brief_rationale_names_the_decisive_object_and_outcome():
    s = near_junction_scene([car("lead", CX + 10.0, W, v=4.0), car("right-behind", CX - 6.0, 0.0),
                             car("right-ahead", CX + 8.0, 0.0)])
    assert [o.id for o in key_objects(s, "CK")] == ["lead"]
    cut = near_junction_scene([car("lead", CX + 10.0, W, v=4.0), car("cut", CX + 6.0, 0.6, heading=0.2)])
    assert [o.id for o in key_objects(cut, "DK")] == ["lead", "cut"]
    assert [o.id for o in key_objects(s, "CR")] == ["lead", "right-ahead", "right-behind"]
    hit = ActionOutcome(0.0, collision=True, progress=12.0, reason="collides with lead after 2.1 s",
                        issue="hits lead in 2.1 s")
    assert brief_rationale(s, "AK", hit) == "Red light; vehicle lead 10 m ahead (same lane) at 4 m/s; hits lead in 2.1 s."
    clear = ActionOutcome(0.7, progress=41.2, reason="makes 41 m of progress in 6 s, ending at 9.0 m/s")
    assert brief_rationale(s, "DK", clear, decisive_object=False) == "Clear, 41 m progress."
    assert brief_rationale(near_junction_scene([]), "SK") == "Red light; road clear."
    assert brief_rationale(s, "SK", decisive_object=False) == "Stop x Lane Keep."


def test_template_answer_recommends_the_candidate_set_briefly():
    p = np.zeros(10)
    p[[ACTION_INDEX["CK"], ACTION_INDEX["DK"], ACTION_INDEX["AK"], ACTION_INDEX["CL"], ACTION_INDEX["SK"]]] = \
        [0.4, 0.25, 0.15, 0.12, 0.08]
    assert answer_codes(p, TeacherConfig()) == ["CK", "DK", "AK"]  # >= 0.1, at most 3
    assert answer_codes(p, TeacherConfig(answer_gamma=0.5)) == ["CK"]  # never empty


def test_eq10_edge_cases():
    p, notes = aggregate([Ballot(0, "CK", 0.0), Ballot(1, "DK", 0.0), Ballot(2, "DK", 0.0)])
    assert p[ACTION_INDEX["DK"]] == pytest.approx(2 / 3) and notes == ["all confidences were 0; ballots weighted equally"]
    assert ranking(p) == ["DK", "CK"]
    with pytest.raises(ValueError):
        aggregate([])


class FakeScorer:
    """A scripted ActionScorer standing in for the simulator rollouts (not available here)."""

    def __init__(self, outcomes):
        self.outcomes = outcomes
        self.calls = []

    def score(self, scene, context, actions):
        self.calls.append((context, list(actions)))
        if isinstance(self.outcomes, Exception):
            raise self.outcomes
        return self.outcomes


def test_fake_scorer_simulation_grounded_voters():
    scorer = FakeScorer({"AK": ActionOutcome(0.2, collision=True, reason="collided with lead after 1.9 s"),
                         "CK": ActionOutcome(0.8, reason="no collision, 30.5 m progress"),
                         "DK": ActionOutcome(0.9, progress=22.0, reason="no collision, 22.0 m progress"),
                         "SK": ActionOutcome(1.3), "CR": ActionOutcome(math.nan)})
    cfg = TeacherConfig(num_voters=40)
    r = Teacher(ScoredVoterPool(scorer, cfg), config=cfg).run(scene(), {"scenario": "s1", "time": 2.0}, seed=3)
    assert r.ok and scorer.calls[0][0] == {"scenario": "s1", "time": 2.0}
    assert scorer.calls[0][1] == ["AK", "AR", "CK", "CR", "DK", "DR", "SK"]  # masked actions never scored
    # invalid scores and actions without scores are recorded, never voted for
    assert {f.problem for f in r.failures} == {"out_of_range", "missing"}
    voted = {b.action for b in r.voting.ballots}
    assert voted <= {"AK", "CK", "DK"} and "DK" in voted
    p = r.distribution
    assert p[ACTION_INDEX["DK"]] > p[ACTION_INDEX["CK"]] > p[ACTION_INDEX["AK"]]
    assert all(b.confidence == scorer.outcomes[b.action].score for b in r.voting.ballots)
    assert r.rationale_source == "template" and r.answer.startswith("Recommended decisions: DK")
    assert "- DK: Red light; vehicle lead 10 m ahead (same lane) at 4 m/s; clear, 22 m progress." in r.answer
    again = Teacher(ScoredVoterPool(scorer, cfg), config=cfg).run(scene(), {}, seed=3)
    assert np.array_equal(again.distribution, r.distribution)  # seeded
    broken = Teacher(ScoredVoterPool(FakeScorer(RuntimeError("simulator crashed")), cfg), config=cfg).run(scene())
    assert not broken.ok and broken.failures[0].stage == "scorer" and "simulator crashed" in broken.failures[0].reason


def test_fake_model_parallel_voters_give_the_same_result_as_sequential():
    def run(parallel: int):
        model = FakeScriptedModel(votes=[vote("DK")] * 4, confidences=[conf(0.5)] * 4, summaries=[SUMMARY])
        cfg = TeacherConfig(num_voters=4, parallel=parallel)
        return Teacher(LLMVoterPool(model, config=cfg), config=cfg).run(scene(), seed=1), model

    (seq, m1), (par, m2) = run(1), run(4)
    assert np.array_equal(seq.distribution, par.distribution) and seq.answer == par.answer
    assert sorted(c["seed"] for c in m1.calls) == sorted(c["seed"] for c in m2.calls)  # seeds per voter index
    assert [b.voter for b in par.voting.ballots] == [0, 1, 2, 3]
