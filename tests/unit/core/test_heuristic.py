"""HeuristicSystem.decide on bad input: scene checks and the context-window policy, with a real (untrained)
student and a real MiniLM memory bank."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from luna_core import types as T
from luna_core.heuristic import HeuristicConfig, HeuristicSystem, InvalidSceneError, check_scene
from luna_core.memory.bank import MemoryBank
from luna_core.prompts import PromptManager
from luna_core.student import ContextOverflowError, DualHeadStudent
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir

torch.set_num_threads(1)  # the CI machine is shared


def crowded_scene(n_objects: int) -> T.SceneDescriptor:
    scene = samples.scene()
    scene.objects = [T.ObjectDescription(f"veh{i}", T.ObjectClass.VEHICLE, 10.0 + 3.0 * i, 0.01 * i, 0.0, 8.0,
                                         4.6, 1.9, "same lane") for i in range(n_objects)]
    return scene


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> HeuristicSystem:
    root = tmp_path_factory.mktemp("heuristic")
    bank_path, _ = make_bank(root)
    student = DualHeadStudent.from_pretrained(make_student_dir(root), device="cpu")
    return HeuristicSystem(student, PromptManager(), MemoryBank.open(bank_path, writable=False), HeuristicConfig(k=3))


@pytest.mark.parametrize("spoil, named", [
    (lambda s: setattr(s.objects[1], "distance", math.nan), "objects[1] ('ped-7') distance is nan"),
    (lambda s: setattr(s.objects[0], "speed", math.inf), "objects[0] ('veh-1') speed is inf"),
    (lambda s: setattr(s, "ego_speed", math.nan), "ego_speed is nan"),
    (lambda s: setattr(s, "junction_distance", math.nan), "junction_distance is nan"),
    (lambda s: s.exit_points.append((math.nan, 0.0)), "exit_points[2]"),
    (lambda s: setattr(s, "ego_lane_index", 4), "ego lane 4 of 3 lanes"),
    (lambda s: setattr(s, "stamp", math.nan), "stamp is nan"),
])
def test_check_scene_names_the_bad_field(spoil, named):
    check_scene(samples.scene())  # the sample is fine
    scene = samples.scene()
    spoil(scene)
    with pytest.raises(InvalidSceneError) as info:
        check_scene(scene)
    assert named in str(info.value)


def test_decide_refuses_a_nan_scene_and_decides_an_empty_one(system):
    bad = samples.scene()
    bad.objects[0].distance = math.nan
    with pytest.raises(InvalidSceneError, match="distance is nan"):
        system.decide(bad)
    empty = T.SceneDescriptor(stamp=3.0, road_section=T.RoadSection.NORMAL_MULTI_LANE, num_lanes=0,
                              ego_lane_index=0)  # no objects, no lane information
    d = system.decide(empty)
    assert d.probabilities.sum() == pytest.approx(1.0)
    kept = [c for c, p in zip(T.ACTION_CODES, d.probabilities) if p > 0.0]
    assert kept == ["AK", "CK", "DK", "SK"]  # no lane on either side: only lane keeping
    assert "Objects: none relevant." in d.query and (d.examples_dropped, d.objects_dropped) == (0, 0)


def test_a_prompt_longer_than_the_window_drops_examples_then_far_objects(system):
    encoder = system.student.encoder
    scene = crowded_scene(12)
    full = system.decide(scene)
    assert len(full.retrieved_ids) == 3 and (full.examples_dropped, full.objects_dropped) == (0, 0)
    bare = encoder.fit(system.prompts.decision_query(scene), [])
    old = encoder.max_tokens
    try:
        encoder.max_tokens = len(bare.input_ids) + 10  # the query fits, no example does
        d = system.decide(scene)
        assert (d.retrieved_ids, d.examples_dropped, d.objects_dropped) == ([], 3, 0)
        encoder.max_tokens = len(bare.input_ids) - 40  # the query itself must lose objects
        d = system.decide(scene)
        assert d.examples_dropped == 3 and d.objects_dropped >= 1
        assert abs(d.probabilities.sum() - 1.0) < 1e-9 and np.isfinite(d.probabilities).all()
        assert "veh11" in d.query  # the published query is the full one; the student read a shorter one
        encoder.max_tokens = 60  # not even the instructions fit: a clear error, never a cut instruction
        with pytest.raises(ContextOverflowError, match="budget"):
            system.decide(scene)
    finally:
        encoder.max_tokens = old


def test_retrieval_keeps_the_previous_items_within_the_margin(system):
    slow, fast = samples.scene(), samples.scene()
    slow.ego_speed, fast.ego_speed = 4.0, 10.0  # the bank's items have ego speeds 4, 6, 8, 10 m/s
    exact = HeuristicSystem(system.student, system.prompts, system.bank, HeuristicConfig(k=2, retrieval_margin=0.0))
    sticky = HeuristicSystem(system.student, system.prompts, system.bank, HeuristicConfig(k=2, retrieval_margin=1.0))

    def top(scene: T.SceneDescriptor) -> list[str]:
        return [item.id for item, _ in system.bank.retrieve(system.prompts.decision_query(scene), 2)]

    assert top(slow) != top(fast)  # otherwise this test could not tell the policies apart
    assert exact.decide(slow).retrieved_ids == top(slow) and exact.decide(fast).retrieved_ids == top(fast)
    assert sticky.decide(slow).retrieved_ids == top(slow)
    held = sticky.decide(fast)
    assert held.retrieved_ids == top(slow)  # nearly as similar (margin 1): the cached examples stay
    # so the second prompt shares the system message and both examples with the first one
    items = [system.bank.get(i) for i in held.retrieved_ids]
    system.student.predict(system.prompts.decision_query(slow), items)
    _, prompt = system.student.predict(held.query, items)
    assert prompt.cached_prefix_tokens > 0.5 * prompt.prompt_tokens


def test_reset_forgets_the_previous_items(system):
    slow, fast = samples.scene(), samples.scene()
    slow.ego_speed, fast.ego_speed = 4.0, 10.0
    sticky = HeuristicSystem(system.student, system.prompts, system.bank, HeuristicConfig(k=2, retrieval_margin=1.0))

    def ids(scene: T.SceneDescriptor) -> list[str]:  # retrieval only: no student forward pass
        return [item.id for item, _ in sticky.retrieve(scene, system.prompts.decision_query(scene))]

    first = ids(slow)
    assert ids(fast) == first  # kept within the margin
    sticky.reset()  # a new episode: the exact top K again
    assert ids(fast) == [item.id for item, _ in system.bank.retrieve(system.prompts.decision_query(fast), 2)] != first


def test_items_below_the_similarity_floor_are_not_shown(system):
    scene = samples.scene()
    scene.ego_speed = 7.3  # between the bank's items (4, 6, 8, 10 m/s): no item is the scene itself
    query = system.prompts.decision_query(scene)
    ranked = system.bank.retrieve(query, 3)
    scores = [score for _, score in ranked]
    assert scores[0] > scores[1] > scores[2]  # otherwise a floor between them could not be placed

    def floored(floor: float, margin: float = 0.0) -> HeuristicSystem:
        return HeuristicSystem(system.student, system.prompts, system.bank,
                               HeuristicConfig(k=3, retrieval_margin=margin, min_similarity=floor))

    between = (scores[0] + scores[1]) / 2
    d = floored(between).decide(scene)
    assert d.retrieved_ids == [ranked[0][0].id] and d.retrieved_similarities == [round(scores[0], 6)]
    assert scores[0] < 1.0
    none = floored((scores[0] + 1.0) / 2).decide(scene)  # far from every item: decided without examples
    assert none.retrieved_ids == [] and none.examples_dropped == 0
    assert abs(none.probabilities.sum() - 1.0) < 1e-9
    assert floored(-1.0).decide(scene).retrieved_ids == [item.id for item, _ in ranked]  # -1: all K
    # the previous decision's items are kept (any margin) only while each is above the floor
    sticky = floored(between, margin=1.0)
    sticky.decide(scene)
    far = samples.scene()
    far.ego_speed = 10.0
    kept = sticky.retrieve(far, system.prompts.decision_query(far))
    assert all(score >= between for _, score in kept)


@pytest.mark.slow
def test_explanation_ends_at_a_sentence_names_no_action_wrongly_and_reports_its_latency(system):
    from luna_core.prompts.parsers import action_name_errors

    decision = system.decide(samples.scene())
    assert system.on_cpu and system.explanation_budget() == HeuristicConfig().explanation_cpu_max_tokens
    for budget in (8, 24):
        e = system.explain(decision, samples.failure(), max_tokens=budget)
        prefix = "Recommended decisions: " + ",".join(decision.candidate_set) + "\n"
        assert e.text.startswith(prefix)
        body = e.text[len(prefix):].rstrip()
        # Whatever the (untrained) student generated: cut by the budget, it ends at a sentence end.
        assert e.stop_reason == "eos" or body == "" or body[-1] in ".!?"
        # "max_time" only when the explanation really ran out of its wall-clock budget (a loaded machine)
        assert e.stop_reason in ("eos", "max_tokens", "max_time") and e.latency > 0.0
        assert e.stop_reason != "max_time" or e.latency >= system.config.explanation_max_time
        assert action_name_errors(e.text) == []
