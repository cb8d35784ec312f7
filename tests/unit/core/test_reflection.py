"""Reflection: the hindsight check first (nothing unchecked is written), the optional LLM rewrite with
its strict validation against the check, memory update, durable outbox with backoff, the bank audit.

The LLM here is a scripted fake chat model (no reasoning model runs here; the validation is what is
tested); the real-endpoint path over HTTP is tests/ros/test_reflection_endpoint.py.
"""

import dataclasses

import numpy as np
import pytest

from luna_core import types as T
from luna_core.llm.base import Completion, LLMUnavailable
from luna_core.memory.bank import InvalidItemError, MemoryBank
from luna_core.memory.embedders import MiniLMEmbedder, SceneVectorEmbedder
from luna_core.prompts import PromptManager, action_set_of, parse_ranked_answer
from luna_core.reflection import Outbox, ReflectionRequest, ReflectionSystem, audit_reflections, outbox_summary
from luna_core.scene import scene_vector
from tests import samples
from tests.unit.core.test_hindsight import FRONT, car, observe


class ScriptedFakeModel:
    """Answers from a list; raises LLMUnavailable while ``down``."""

    name = "scripted-fake"

    def __init__(self, answers):
        self.answers = list(answers)
        self.down = False
        self.seen = []

    def chat(self, messages, temperature=0.0, top_k=None, seed=None, max_tokens=None):
        if self.down:
            raise LLMUnavailable("connection refused")
        self.seen.append(messages)
        return Completion(text=self.answers.pop(0), prompt_tokens=10, completion_tokens=10, latency=0.01)



@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()  # loaded once for the module


@pytest.fixture
def bank(tmp_path, embedder):
    with MemoryBank.create(tmp_path / "bank", embedder) as b:
        yield b


def _request(collision=True, observation="collision", explanation_latency=3.2, scene=None):
    """A reflection request about the executed CK: after a collision with the stalled car ahead (a car
    drives alongside in the left lane), or after standing behind a parked car ("blocked")."""
    query = PromptManager().decision_query(samples.scene())  # action set AK, AL, CK, CL, DK, DL, SK
    failure = T.FailureEvent(14.0, "CK", 13.0, ["stalled"] if collision else [], False,
                             "" if collision else "parked", {"stalled": "STOPPED_TRACK"} if collision else {})
    expl = T.DecisionExplanation(14.5, 13.0, 14.0, query, ["CK", "DK"],
                                 "Recommended decisions: CK,DK\nExplanations:\n- CK: Cruise x Lane Keep: hold.",
                                 explanation_latency)
    obs = {"collision": lambda: observe(lambda t: [car("beside", 1.0 + 8.0 * t, 3.5, 8.0), car("stalled", 35.0)],
                                        speed=8.0),
           "blocked": lambda: observe(lambda t: [car("parked", FRONT + 0.5 + 2.25)]),
           "following": lambda: observe(lambda t: [car("lead", 30.0 + 8.0 * t, 0.0, 8.0)], speed=8.0),
           None: lambda: None}[observation]()
    if scene is not None:  # the node's recorder pairs the decision with the scene published for it
        obs = dataclasses.replace(obs, scene=scene)
    return ReflectionRequest.from_events(expl, failure, obs)


def test_grounded_revision_becomes_reflection_item_without_distribution(bank):
    req = _request()
    assert req.explanation_latency == 3.2 and req.failure.collision_kinds == {"stalled": "STOPPED_TRACK"}
    result = ReflectionSystem(None, PromptManager(), bank).reflect(req)
    assert not result.normal and result.memory_item_id and not result.error
    item = bank.get(result.memory_item_id)
    assert item.source == "reflection" and item.distribution is None and item.query == req.query
    ranked = parse_ranked_answer(item.answer, action_set_of(req.query), kind="reflection").ranked
    assert ranked[0] in ("DK", "SK") and "CL" not in ranked and "CK" not in ranked
    assert "CK instead: " in item.answer and result.hindsight.startswith(f"revise to {ranked[0]}")


def test_a_scene_vector_bank_keys_the_revision_by_the_scene_of_the_revised_decision(tmp_path):
    scene = samples.scene()
    with MemoryBank.create(tmp_path / "sv", SceneVectorEmbedder()) as sv:
        result = ReflectionSystem(None, PromptManager(), sv).reflect(_request(scene=scene))
        assert result.memory_item_id and not result.error, result.error
        item = sv.get(result.memory_item_id)
        assert item.source == "reflection" and np.allclose(item.scene_vector, scene_vector(scene))
        assert sv.retrieve(scene_vector(scene), k=1)[0][0].id == item.id
        # Recorded without its scene (no luna/scene heard): nothing to key it by, refused with the reason.
        with pytest.raises(InvalidItemError, match="scene_vector"):
            ReflectionSystem(None, PromptManager(), sv).reflect(_request())
        assert len(sv) == 1


def test_llm_rewrite_that_agrees_with_hindsight_is_written_with_the_hindsight_in_its_prompt(bank):
    verdict = ReflectionSystem(None, PromptManager(), bank).grounding(_request()).verdict
    rewrite = (f"Recommended decisions: {verdict.best}\nExplanations:\n- {verdict.best}: the stalled car ahead "
               "leaves no room and the left lane is taken.")
    model = ScriptedFakeModel([rewrite])
    result = ReflectionSystem(model, PromptManager(), bank).reflect(_request())
    assert result.memory_item_id and bank.get(result.memory_item_id).answer == rewrite
    text = model.seen[0][-1]["content"]
    assert "collided" in text and "What each decision would have led to" in text  # Eq. 29 inputs + hindsight
    assert f"is {verdict.best}: rank it first" in text and "- CL: collides with beside" in text


@pytest.mark.parametrize("answer,why", [
    ("Recommended decisions: CL\nExplanations:\n- CL: Cruise x Left Lane-Change: go around.", "ranks CL first"),
    ("Recommended decisions: {best},CL\nExplanations:\n- {best}: slow down.\n- CL: go around.", "unsafe in hindsight: CL"),
    ("normal", "not allowed after a collision"),
    ("Recommended decisions: {best}\nExplanations:\n- {best}: Accelerate x Lane Keep: brake.", "is named"),
])
def test_an_llm_revision_that_collides_or_contradicts_hindsight_is_rejected_and_nothing_written(bank, answer, why):
    best = ReflectionSystem(None, PromptManager(), bank).grounding(_request()).verdict.best
    system = ReflectionSystem(ScriptedFakeModel([answer.format(best=best)] * 3), PromptManager(), bank)
    outbox = Outbox(bank.path + "-outbox")
    outbox.put(_request())
    results = [system.process(outbox, p) for _ in range(3) for p in outbox.due()]
    final = [r for r in results if r is not None]
    assert len(final) == 1 and final[0].error.startswith("invalid reflection") and why in final[0].error
    assert len(bank) == 0 and len(outbox) == 0


def test_a_near_miss_goes_through_the_outbox_and_a_decision_as_good_as_any_is_normal(bank, tmp_path):
    # The monitor reported a near miss with the leader; in hindsight CK behind a leader 30 m ahead at the
    # ego's speed was as good as any decision: 'normal', nothing written.
    req = _request(collision=False, observation="following")
    req = dataclasses.replace(req, blocked_by="", near_misses={"lead": 0.7})
    outbox = Outbox(tmp_path / "outbox")
    outbox.put(req)
    outbox.close()
    reopened = Outbox(tmp_path / "outbox")  # read back from the journal
    pending = reopened.due()[0]
    reopened.close()
    assert pending.request.near_misses == {"lead": 0.7} and pending.request.failure.near_miss
    result = ReflectionSystem(None, PromptManager(), bank).reflect(pending.request)
    assert result.normal and not result.memory_item_id and not result.error
    assert "as good as any" in result.hindsight and len(bank) == 0
    assert outbox_summary(tmp_path / "outbox")["near_misses"] == 1


def test_blocked_behind_a_parked_car_is_normal_and_never_writes_accelerate(bank):
    result = ReflectionSystem(None, PromptManager(), bank).reflect(_request(collision=False, observation="blocked"))
    assert result.normal and not result.memory_item_id and len(bank) == 0
    assert "as good as any" in result.hindsight


def test_nothing_is_written_without_a_hindsight_observation(bank):
    result = ReflectionSystem(ScriptedFakeModel([]), PromptManager(), bank).reflect(_request(observation=None))
    assert result.error.startswith("no hindsight check: the request carries no hindsight observation")
    assert len(bank) == 0


def test_outbox_survives_restart_and_retries_until_endpoint_returns(bank, tmp_path):
    best = ReflectionSystem(None, PromptManager(), bank).grounding(_request()).verdict.best
    model = ScriptedFakeModel([f"Recommended decisions: {best}\nExplanations:\n- {best}: keep the gap."])
    model.down = True
    system = ReflectionSystem(model, PromptManager(), bank)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put(_request())
    pending = outbox.due()
    assert system.process(outbox, pending[0], backoff_base=0.0) is None  # endpoint down: stays queued
    outbox.close()
    reopened = Outbox(tmp_path / "outbox")  # a restart: the acknowledged request (and its observation) is there
    assert len(reopened) == 1 and reopened.due()[0].request.observation is not None
    model.down = False
    result = system.process(reopened, reopened.due()[0])
    assert result is not None and result.memory_item_id
    reopened.close()
    assert len(Outbox(tmp_path / "outbox")) == 0  # done is durable too


def test_audit_finds_no_unsafe_item_in_a_grounded_bank_and_flags_a_planted_one(bank, tmp_path):
    system = ReflectionSystem(None, PromptManager(), bank)
    outbox = Outbox(tmp_path / "outbox")
    request = _request()
    outbox.put(request)
    assert system.process(outbox, outbox.due()[0]).memory_item_id
    outbox.close()
    assert audit_reflections(bank, tmp_path / "outbox") == (1, [])
    # An item that says CL for the same situation (as an unchecked reflection could have written):
    bank.append(T.MemoryItem(id="refl-planted", query=request.query, source="reflection",
                             answer="Recommended decisions: CL\nExplanations:\n- CL: go around."))
    reopened = Outbox(tmp_path / "outbox")
    reopened.put(ReflectionRequest(**{**request.__dict__, "id": "planted"}))
    reopened.close()
    checked, findings = audit_reflections(bank, tmp_path / "outbox")
    assert checked == 2 and [f.item_id for f in findings] == ["refl-planted"]
    assert findings[0].problem.startswith("unsafe in hindsight: CL collides with beside")


def test_outbox_summary_counts_requests_outcomes_and_explanation_latency(bank, tmp_path):
    system = ReflectionSystem(None, PromptManager(), bank)
    outbox = Outbox(tmp_path / "outbox")
    for request in (_request(), _request(collision=False, observation="blocked", explanation_latency=5.0),
                    _request(observation=None)):
        outbox.put(request)
    for pending in outbox.due()[:2]:
        system.process(outbox, pending)
    outbox.close()
    s = outbox_summary(tmp_path / "outbox")
    assert (s["requests"], s["collisions"], s["blocked"], s["without_hindsight_observation"]) == (3, 2, 1, 1)
    assert (s["written"], s["normal"], s["pending"]) == (1, 1, 1)
    assert s["explanation_latency_max_s"] == 5.0


def test_demo_summary_reports_reflections_and_flags_an_unsafe_live_bank_item(tmp_path, embedder, monkeypatch):
    from luna_bringup.demo import _reflection_report

    monkeypatch.setenv("LUNA_DATA", str(tmp_path / "data"))
    request = _request()
    with MemoryBank.create(tmp_path / "data" / "memory_bank", embedder) as live:
        outbox = Outbox(tmp_path / "data" / "reflection_outbox")
        outbox.put(request)
        ReflectionSystem(None, PromptManager(), live).process(outbox, outbox.due()[0])
        outbox.close()
    lines, unsafe = _reflection_report(tmp_path / "data")
    text = "\n".join(lines)
    assert unsafe == 0 and "revisions written 1" in text and "Explanation latency: mean 3.2 s" in text
    assert "Hindsight audit of the run's bank: 1 reflection item(s), 0 unsafe" in text
    # What an unchecked reflection could write: an item no hindsight check stands behind.
    with MemoryBank.open(tmp_path / "data" / "memory_bank", writable=True) as live:
        live.append(T.MemoryItem(id=f"refl-{request.id}-x", query=request.query, source="reflection",
                                 answer="Recommended decisions: AK\nExplanations:\n- AK: go."))
    lines, unsafe = _reflection_report(tmp_path / "data")
    assert unsafe == 1 and any(line.startswith(f"- UNSAFE refl-{request.id}-x") for line in lines)


@pytest.mark.parametrize("kind", ["collision", "near miss"])
def test_a_collision_no_decision_could_avoid_any_more_revises_the_latest_earlier_decision_that_could(bank, kind):
    import numpy as np

    query = PromptManager().decision_query(samples.scene())
    failure = T.FailureEvent(14.0, "CK", 13.0, ["stalled"], False) if kind == "collision" else \
        T.FailureEvent(14.0, "CK", 13.0, near_misses={"stalled": 0.3})
    expl = T.DecisionExplanation(14.5, 13.0, 14.0, query, ["CK"], "Recommended decisions: CK\nExplanations:\n- CK: go.")
    hopeless = observe(lambda t: [car("stalled", FRONT + 1.0 + 2.25)], speed=8.0)  # 1 m behind it at 8 m/s
    in_time = observe(lambda t: [car("stalled", FRONT + 30.0 + 2.25)], speed=8.0)  # 2 s earlier: 30 m
    p = np.zeros(T.NUM_ACTIONS)
    p[T.ACTION_INDEX["AK"]] = 1.0
    before = T.DecisionDistribution(11.0, p, ["AK"], query=query)
    system = ReflectionSystem(None, PromptManager(), bank)
    alone = system.reflect(ReflectionRequest.from_events(expl, failure, hopeless))
    assert not alone.memory_item_id and alone.hindsight.startswith("no safe alternative")
    assert not alone.normal  # nothing was safe: no grounded revision, not 'normal'
    result = system.reflect(ReflectionRequest.from_events(expl, failure, hopeless, earlier=[(before, in_time)]))
    assert result.memory_item_id and result.hindsight.startswith("from the decision at 11.0 s, 2.0 s before")
    item = bank.get(result.memory_item_id)
    ranked = parse_ranked_answer(item.answer, action_set_of(query), kind="reflection").ranked
    assert "AK" not in ranked and item.query == query
