"""Prompt manager (P_av, P_ca, P_sum, P_md, P_refl) and the strict parsers of model answers."""

from __future__ import annotations

import pytest

from luna_core.prompts import (MalformedModelOutput, PromptManager, action_set_of, allowed_actions,
                               format_ranked_answer, parse_confidence, parse_ranked_answer, parse_reflection,
                               parse_summary, parse_vote, traffic_state_text)
from luna_core.prompts import knowledge as K
from luna_core.prompts.compact import compact_query
from luna_core.prompts.parsers import action_name_errors, complete_sentences, repair_action_names
from luna_core.types import FailureEvent, MemoryItem
from tests.unit.core.test_scene import car, near_junction_scene

PM = PromptManager()
ALLOWED = ["AK", "AR", "CK", "CR", "DK", "DR", "SK"]
GOOD_SUMMARY = ("Recommended decisions: DK,CK\nExplanations:\n- DK: Vehicle v1 ahead in the same lane at 8.54 m "
                "is slower, so slowing down keeps the gap.\n- CK: Holding the speed is acceptable while the gap "
                "stays above 8 m.")


def problem(fn, *args, **kw) -> MalformedModelOutput:
    with pytest.raises(MalformedModelOutput) as info:
        fn(*args, **kw)
    return info.value


# ---- parse_vote ----------------------------------------------------------------------------------

def test_vote_parses_the_decision_line():
    text = "Step 1: ...\nStep 2: v1 ahead.\nStep 3: slow down.\n**Decision: DK**"
    assert parse_vote(text, ALLOWED) == "DK"
    assert parse_vote("Decision: CK\nDecision: CK.", ALLOWED) == "CK"  # restated, consistent


@pytest.mark.parametrize("text, expected", [
    ("", "empty"), ("   \n", "empty"),
    ("Step 1: the road is clear and the light is", "truncated"),  # cut before the decision
    ("Step 1: scene analysis of the traffic around the ego vehicle. Step 2: none. Step 3: go.", "missing"),
    ("Decision: XK", "unknown_action"), ("Decision: SL", "unknown_action"),
    ("Decision: AL", "masked_action"),  # no left lane in the action set
    ("Decision: CK\nDecision: DK", "ambiguous"),
    ("Decision: CK or DK", "format"),
    ("步骤一：分析场景。步骤三：减速。决策：减速保持车道", "language"),
    ("Schritt 3: Entscheidung über die Fahrstraßenänderung für äußerst große Lücke ÄÖÜ ß",
     "language"),
    ("Etape 3 : la voie est libre, je garde la voie.", "missing"),  # French in ASCII: no decision line
])
def test_vote_rejects_malformed_answers(text, expected):
    err = problem(parse_vote, text, ALLOWED)
    assert err.kind == "vote" and err.problem == expected
    assert expected in str(err)


def test_vote_rejects_non_text():
    assert problem(parse_vote, None).problem == "format"


# ---- parse_confidence ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("Looks right.\nConfidence: 0.85", 0.85), ("Confidence: 1", 1.0),
                                         ("Confidence: 0.0.", 0.0), ("Confidence: .5", 0.5)])
def test_confidence_parses(text, value):
    assert parse_confidence(text) == value


@pytest.mark.parametrize("text, expected", [
    ("Confidence: 1.7", "out_of_range"), ("Confidence: -0.2", "out_of_range"),
    ("Confidence: 85%", "format"), ("Confidence: high", "format"), ("Confidence: nan", "format"),
    ("Confidence: 0.6\nConfidence: 0.9", "ambiguous"), ("", "empty"),
    ("The reasoning is", "truncated"), ("置信度：0.8，这个决策是合理的，因为前车", "language"),
])
def test_confidence_rejects_malformed_answers(text, expected):
    err = problem(parse_confidence, text)
    assert (err.kind, err.problem) == ("confidence", expected)


# ---- summaries / ranked answers ------------------------------------------------------------------

def test_summary_parses_and_normalises():
    ranked, explanation = parse_summary(GOOD_SUMMARY, ALLOWED)
    assert ranked == ["DK", "CK"]
    assert explanation.startswith("- DK: Vehicle v1") and explanation.endswith("above 8 m.")
    answer = parse_ranked_answer(GOOD_SUMMARY.replace("DK,CK", "DK , CK"), ALLOWED)
    assert answer.text == GOOD_SUMMARY  # one canonical form
    assert format_ranked_answer(answer.ranked, answer.explanations) == GOOD_SUMMARY


@pytest.mark.parametrize("text, expected", [
    ("", "empty"),
    ("Sure! Here is my recommendation:\n" + GOOD_SUMMARY, "format"),  # preamble before the format
    (GOOD_SUMMARY.replace("DK,CK", "DK,XX"), "unknown_action"),
    (GOOD_SUMMARY.replace("DK,CK", "DL,CK").replace("- DK", "- DL"), "masked_action"),
    (GOOD_SUMMARY.replace("DK,CK", "DK,DK"), "format"),
    ("Recommended decisions: DK,CK", "truncated"),
    (GOOD_SUMMARY.split("\n- CK")[0], "truncated"),  # CK never explained
    (GOOD_SUMMARY[:-12], "truncated"),  # last rationale cut mid-sentence
    (GOOD_SUMMARY.replace("keeps the gap.", "keeps the gap (confidence 0.8)."), "leak"),
    (GOOD_SUMMARY.replace("Vehicle v1", "Most voting agents agree that vehicle v1"), "leak"),
    ("Recommended decisions: DK,CK\nExplanations:\n- CK: Hold it.\n- DK: Slow.", "format"),  # wrong order
    ("推荐决策：DK,CK\n解释：前车较慢，减速以保持安全距离。", "language"),
])
def test_summary_rejects_malformed_answers(text, expected):
    err = problem(parse_summary, text, ALLOWED)
    assert (err.kind, err.problem) == ("summary", expected)


# ---- reflection ----------------------------------------------------------------------------------

def test_reflection_normal_and_revised():
    query = PM.decision_query(near_junction_scene())
    assert parse_reflection("normal", query, collision=False).normal
    assert parse_reflection(" 'normal' \n", query, collision=False).normal
    revised = parse_reflection(GOOD_SUMMARY, query, collision=True)
    assert not revised.normal and revised.ranked == ["DK", "CK"] and revised.text == GOOD_SUMMARY


def test_reflection_rejects_normal_after_collision_and_actions_outside_the_query():
    query = PM.decision_query(near_junction_scene())
    assert problem(parse_reflection, "normal", query, collision=True).problem == "normal_after_collision"
    bad = GOOD_SUMMARY.replace("DK,CK", "DK,CL").replace("- CK", "- CL")
    assert problem(parse_reflection, bad, query, collision=True).problem == "masked_action"
    assert problem(parse_reflection, "It was normal, I think.", query, collision=False).problem == "format"
    assert problem(parse_reflection, "", query, collision=False).problem == "empty"
    assert problem(action_set_of, "no action set here").kind == "query"


# ---- prompt manager -------------------------------------------------------------------------------

def test_decision_query_structure_and_traffic_state():
    scene = near_junction_scene([car("v1", 95.0, 3.5)])
    q = PM.decision_query(scene)
    assert action_set_of(q) == allowed_actions(scene) == ALLOWED
    state = traffic_state_text(q)
    assert state.startswith("Road section: Multi-Lane Near Junction") and state.endswith("Recent decisions: CK, DK.")
    assert "Action set" not in state and PM.traffic_state_text(q) == state
    assert problem(traffic_state_text, "free text").problem == "missing"


def test_md_messages_put_compact_examples_first_and_the_query_last():
    q = PM.decision_query(near_junction_scene())
    queries = [PM.decision_query(near_junction_scene([car(f"v{i}", 90.0, 3.0 + i)])) for i in range(3)]
    examples = [MemoryItem(id=f"m{i}", query=queries[i], answer=f"A{i}\n") for i in range(3)]
    msgs = PM.md_messages(q, examples)
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert msgs[0]["content"] == K.DECISION_MAKING
    assert [m["content"] for m in msgs[1:7]] == [compact_query(queries[0]), "A0", compact_query(queries[1]), "A1",
                                                 compact_query(queries[2]), "A2"]
    assert msgs[-1] == {"role": "user", "content": compact_query(q)}
    assert len(PM.md_messages(q, [])) == 2
    bad = MemoryItem(id="corrupt", query="free text without a traffic state", answer="A")
    assert problem(PM.md_messages, q, [bad]).kind == "query"


def test_compact_query_keeps_the_facts_in_fewer_characters():
    scene = near_junction_scene([car("v1", 95.0, 3.5), car("v2", 80.0, -3.5)])
    full = PM.decision_query(scene)
    short = compact_query(full)
    assert len(short) < 0.7 * len(full)
    lines = short.splitlines()
    assert lines[0].startswith("Road section: Multi-Lane Near Junction (junction ahead in 15.0)")
    assert "Lanes: 2, ego in lane 1." in lines and "Objects:" in lines and "Traffic light: Red." in lines
    # every object keeps its line; numbers to 0.1, no units, no spaces inside the number list
    full_objects = [ln for ln in traffic_state_text(full).splitlines() if ln.startswith("- ")]
    short_objects = [ln for ln in lines if ln.startswith("- ")]
    assert [ln.split(",")[0] for ln in short_objects] == [ln.split(",")[0] for ln in full_objects]
    assert short_objects[0] == "- v1 vehicle, same lane: 8.5,0,0,6.0,4.5x1.9."
    assert not any(unit in short for unit in (" m/s", " m.", " deg", "[Traffic state]", "Which decisions"))
    assert action_set_of(short) == ALLOWED and lines[-1] == "Action set: " + " ".join(ALLOWED)
    assert compact_query(full + "\n") == short  # deterministic, trailing text ignored
    assert problem(compact_query, "[Traffic state]\nx\n[End of traffic state]\n").problem == "missing"


def test_explanation_prefix_matches_the_summary_format():
    prefix = PM.explanation_prefix(["DK", "CK"])
    assert prefix == "Recommended decisions: DK,CK\n"
    assert GOOD_SUMMARY.startswith(prefix)  # the student's Eq. 26 prefix continues like A_sum
    with pytest.raises(ValueError):
        PM.explanation_prefix(["ZZ"])
    with pytest.raises(ValueError):
        PM.explanation_prefix([])


def test_agent_prompts_use_only_their_dependency_sets():
    scene = near_junction_scene()
    q_av = PM.voting_query(scene)
    av = PM.av_messages(q_av)
    assert av[0]["content"] == K.ACTION_VOTING and "Step 3" in av[0]["content"] and av[1]["content"] == q_av
    ca = PM.ca_messages(q_av, "Step 3: slow.\nDecision: DK")
    assert ca[0]["content"] == K.CONFIDENCE_ASSESSMENT
    assert q_av in ca[1]["content"] and "Decision: DK" in ca[1]["content"] and "Confidence:" in ca[1]["content"]
    summ = PM.sum_messages(q_av, [("A1\nDecision: DK", "ok\nConfidence: 0.9"),
                                  ("A2\nDecision: CK", "meh\nConfidence: 0.4")], ["DK", "CK"])
    body = summ[1]["content"]
    assert "Analysis 2:" in body and "Confidence: 0.4" in body and "Required ranking: DK,CK" in body
    assert "Pr(D)" in summ[0]["content"]
    refl = PM.refl_messages(PM.decision_query(scene), GOOD_SUMMARY,
                            FailureEvent(3.0, "DK", colliding_ids=["v7"], stall=False))
    assert refl[0]["content"] == K.REFLECTION and "'normal'" in refl[0]["content"]
    assert "Executed decision: DK. Outcome: the ego vehicle collided with object(s) v7." in refl[1]["content"]
    assert "[Traffic state]" in refl[1]["content"] and GOOD_SUMMARY in refl[1]["content"]
    stall = PM.failure_text(FailureEvent(3.0, "SK", stall=True))
    assert "no progress" in stall
    near = PM.failure_text(FailureEvent(3.0, "CK", near_misses={"cut-in": 0.4}))
    assert near == ("Executed decision: CK. Outcome: the ego vehicle nearly collided: its time to collision with "
                    "object(s) cut-in (0.4 s) fell below 1 s.")


# ---- action names and sentence boundaries (explanations, Eq. 25-28) ------------------------------

# What the demo's explanations said (issue 16): codes named with another action's name.
WRONG_NAMES = ("Recommended decisions: CK,AK\nExplanations:\n- CK: Cruise x Left Lane-Change: keep lane 2 at "
               "7.65 m/s.\n- AK: Decelerate x Lane: the car ahead is far.")


def test_a_wrong_action_name_in_an_explanation_is_caught_by_the_parser_and_repaired_from_the_code():
    assert action_name_errors(WRONG_NAMES) == [("CK", "Cruise x Left Lane-Change"), ("AK", "Decelerate x Lane")]
    p = problem(parse_ranked_answer, WRONG_NAMES, ALLOWED, kind="reflection")
    assert p.problem == "action_name" and "CK is named 'Cruise x Left Lane-Change'; CK is Cruise x Lane Keep" in str(p)
    repaired, count = repair_action_names(WRONG_NAMES)
    assert count == 2 and action_name_errors(repaired) == []
    assert "- CK: Cruise x Lane Keep: keep lane 2 at 7.65 m/s." in repaired
    assert "- AK: Accelerate x Lane Keep: the car ahead is far." in repaired
    assert parse_ranked_answer(repaired, ALLOWED, kind="reflection").ranked == ["CK", "AK"]
    # Right names in any of the notations pass untouched; codes without a name are not checked.
    right = "- DK: Decelerate x Lane Keep: slow. SK (Stop × Lane-Keep) too; AR, CR also possible."
    assert action_name_errors(right) == [] and repair_action_names(right) == (right, 0)


def test_an_explanation_cut_by_the_budget_ends_at_its_last_complete_sentence():
    prefix = "Recommended decisions: CK,DK\n"
    cut = prefix + "Explanations:\n- CK: Cruise x Lane Keep: hold 7.65 m/s behind v3. Key objects: vehicle v3 ah"
    assert complete_sentences(cut, keep=len(prefix)) == \
        prefix + "Explanations:\n- CK: Cruise x Lane Keep: hold 7.65 m/s behind v3."
    assert complete_sentences(prefix + "Explanations:\n- CK: Cruise x La", keep=len(prefix)) == prefix
    whole = prefix + "Explanations:\n- CK: fine."
    assert complete_sentences(whole, keep=len(prefix)) == whole
