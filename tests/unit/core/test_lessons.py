"""Reflection lessons weighted into the decision distribution (luna_core.lessons): the mixture itself, and
HeuristicSystem.decide with a real (untrained) student and a real MiniLM bank holding a reflection item."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core import types as T
from luna_core.heuristic import HeuristicConfig, HeuristicSystem
from luna_core.hindsight import HindsightVerdict
from luna_core.lessons import (CAUSE_SPEED_TOLERANCE, Lesson, LessonCause, cause_of, lessons_of,
                               repeated_reflections, weigh_lessons)
from luna_core.memory.bank import MemoryBank
from luna_core.prompts import PromptManager
from luna_core.student import DualHeadStudent
from luna_core.teacher import ActionOutcome
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir

torch.set_num_threads(1)  # the CI machine is shared

# A grounded revision as luna_core.hindsight writes it, about samples.scene()'s lead veh-1 (7.8 m/s, same lane)
STOP_ANSWER = ("Recommended decisions: SK,DK\nExplanations:\n"
               "- SK: Vehicle veh-1 19 m ahead (same lane) at 8 m/s; clear, 12 m progress. CK instead: hits veh-1 in "
               "2.1 s.\n- DK: Vehicle veh-1 19 m ahead (same lane) at 8 m/s; clear, 15 m progress.")


def item(item_id: str, answer: str, source: str = "reflection", scene: T.SceneDescriptor | None = None) -> T.MemoryItem:
    return T.MemoryItem(id=item_id, query=PromptManager().decision_query(scene or samples.scene()), answer=answer,
                        source=source)


def with_lead(speed: float, relation: str = "same lane", bearing: float = 0.05) -> T.SceneDescriptor:
    scene = samples.scene()
    scene.objects[0] = T.ObjectDescription("car-9", T.ObjectClass.VEHICLE, 40.0, bearing, 0.0, speed, 4.6, 1.9,
                                           relation)
    return scene


def p_of(**codes: float) -> np.ndarray:
    p = np.zeros(T.NUM_ACTIONS)
    for code, value in codes.items():
        p[T.ACTION_INDEX[code]] = value
    return p


def test_a_lesson_moves_the_distribution_towards_what_it_recommends():
    student = p_of(CK=0.8, AK=0.2)
    lesson = Lesson("refl-1", 0.9, ("SK", "DK"))
    assert weigh_lessons(student, [lesson], 0.0) is student  # w = 0: the paper's behaviour
    assert weigh_lessons(student, [], 0.5) is student  # no lesson retrieved: the student's own
    mixed = weigh_lessons(student, [lesson], 0.5)
    np.testing.assert_allclose(mixed, p_of(CK=0.4, AK=0.1, SK=0.25, DK=0.25))
    # two lessons: each item's codes weighted by its similarity to the scene
    two = weigh_lessons(student, [lesson, Lesson("refl-2", 0.3, ("CL",))], 1.0)
    np.testing.assert_allclose(two, p_of(SK=0.375, DK=0.375, CL=0.25))
    assert two.sum() == pytest.approx(1.0)


def test_only_parsed_reflection_items_with_a_possible_recommendation_are_lessons():
    mask = np.ones(T.NUM_ACTIONS, dtype=bool)
    mask[T.ACTION_INDEX["SK"]] = False  # e.g. an action the scene rules out
    retrieved = [(item("refl-ok", STOP_ANSWER), 0.9),
                 (item("teacher-1", STOP_ANSWER, source="teacher"), 0.95),  # a teacher example is no lesson
                 (item("refl-bad", "I would stop."), 0.8),  # an answer that does not parse
                 (item("refl-sk", "Recommended decisions: SK\nExplanations:\n- SK: Vehicle veh-1 19 m ahead "
                       "(same lane) at 8 m/s; clear, 12 m progress."), 0.7)]  # only SK, masked
    assert cause_of(retrieved[2][0]) is None  # an answer that does not parse
    scene = samples.scene()
    assert lessons_of(retrieved, scene, mask) == [Lesson("refl-ok", 0.9, ("DK",))]
    assert [lesson.recommended for lesson in lessons_of(retrieved, scene, None)] == [("SK", "DK"), ("SK",)]


def test_a_lesson_names_the_object_its_failed_decision_hit_else_its_decisive_object_or_light():
    assert cause_of(item("r", STOP_ANSWER)) == LessonCause("vehicle", "same lane", True, 7.8)
    # "blocked behind" names the cause too; the id is read without the sentence's period
    blocked = STOP_ANSWER.replace("hits veh-1 in 2.1 s.", "blocked behind ped-7.")
    assert cause_of(item("r", blocked)) == LessonCause("pedestrian", "junction", True, 1.2)
    # what the executed decision did names no object: the revision's decisive object
    ttc = STOP_ANSWER.replace("hits veh-1 in 2.1 s.", "TTC below 1 s.")
    assert cause_of(item("r", ttc)) == LessonCause("vehicle", "same lane", True, 7.8)
    # an object the query does not describe falls back to the decisive object as well
    assert cause_of(item("r", STOP_ANSWER.replace("hits veh-1", "hits on2"))) == LessonCause("vehicle", "same lane",
                                                                                            True, 7.8)
    cone = samples.scene()
    cone.objects.append(T.ObjectDescription("cone-2", T.ObjectClass.STATIC, 9.0, 0.0, 0.0, 0.0, 0.5, 0.5,
                                            "same lane"))
    static = "Recommended decisions: CL\nExplanations:\n- CL: Obstacle cone-2 9 m ahead (same lane); clear."
    assert cause_of(item("r", static, scene=cone)) == LessonCause("static object", "same lane", True, 0.0)
    light = "Recommended decisions: SK\nExplanations:\n- SK: Yellow light; vehicle veh-1 19 m ahead (same lane)."
    assert cause_of(item("r", light)) == LessonCause("light", "Yellow")
    # a reason reworded (e.g. by an LLM) names no cause: the item stays an example in the prompt only
    reworded = "Recommended decisions: SK,DK\nExplanations:\n- SK: Stop for the car ahead.\n- DK: Slow down."
    assert cause_of(item("r", reworded)) is None
    assert lessons_of([(item("r", reworded), 0.9)], samples.scene(), None) == []


def test_the_cause_is_read_from_what_the_hindsight_check_writes():
    # the revision as luna_core.hindsight renders it (not a hand-written copy): a change of either
    # rendering that the cause reader does not follow fails here
    scene = samples.scene()
    verdict = HindsightVerdict(executed="CK", outcomes={
        "SK": ActionOutcome(0.9, progress=12.0), "DK": ActionOutcome(0.8, progress=15.0),
        "CK": ActionOutcome(0.0, collision=True, reason="collides with veh-1 after 2.1 s",
                            issue="hits veh-1 in 2.1 s")},
        safe=["SK", "DK"], unsafe={"CK": "collides with veh-1 after 2.1 s"}, revise=True, listed=["SK", "DK"],
        scene=scene)
    revision = T.MemoryItem(id="refl-h", query=PromptManager().decision_query(scene), answer=verdict.answer(),
                            source="reflection")
    assert "CK instead: hits veh-1 in 2.1 s" in revision.answer
    assert cause_of(revision) == LessonCause("vehicle", "same lane", True, 7.8)
    assert lessons_of([(revision, 0.9)], scene, None) == [Lesson("refl-h", 0.9, ("SK", "DK"))]


def test_a_lesson_acts_only_where_the_scene_has_a_cause_like_its_own():
    cause = LessonCause("vehicle", "same lane", True, 0.0)  # a stalled car ahead in the ego lane
    assert cause.present_in(with_lead(0.0)) and cause.present_in(with_lead(CAUSE_SPEED_TOLERANCE))
    assert not cause.present_in(with_lead(12.6))  # a lead moving with the ego's traffic
    assert not cause.present_in(with_lead(0.0, relation="left lane"))
    assert not cause.present_in(with_lead(0.0, bearing=3.0))  # behind the ego
    assert LessonCause("light", "Yellow").present_in(samples.scene())
    assert not LessonCause("light", "Red").present_in(samples.scene())
    # the stalled-car lesson written in one scene, retrieved in another
    stalled = item("refl-stalled", STOP_ANSWER.replace("veh-1", "car-9").replace("at 8 m/s", "at 0 m/s"),
                   scene=with_lead(0.0))
    assert lessons_of([(stalled, 0.92)], with_lead(12.6), None) == []
    assert lessons_of([(stalled, 0.92)], with_lead(1.0), None) == [Lesson("refl-stalled", 0.92, ("SK", "DK"))]


def test_a_car_that_moved_in_from_an_adjacent_lane_is_a_cut_in_cause():
    # at the failed decision car-9 drove in the left lane; keeping the lane then hit it: it cut in afterwards
    cut_in = STOP_ANSWER.replace("veh-1", "car-9")
    written = item("refl-cut", cut_in, scene=with_lead(6.0, relation="left lane", bearing=0.3))
    assert cause_of(written) == LessonCause("vehicle", "left lane", True, 6.0, cutting_in=True)
    cruising, cutting = (with_lead(6.0, relation="left lane", bearing=0.3) for _ in range(2))
    cutting.objects[0].cutting_in = True
    assert lessons_of([(written, 0.95)], cruising, None) == []  # a left-lane car that keeps its lane
    assert lessons_of([(written, 0.95)], cutting, None) == [Lesson("refl-cut", 0.95, ("SK", "DK"))]
    # an object the query already shows cutting in is a cut-in cause whatever names it
    decisive = "Recommended decisions: DK\nExplanations:\n- DK: Vehicle car-9 40 m ahead (left lane) at 6 m/s; clear."
    assert cause_of(item("refl-seen", decisive, scene=cutting)) == LessonCause("vehicle", "left lane", True, 6.0, True)
    assert cause_of(item("refl-lane", decisive, scene=cruising)).cutting_in is False
    # a lead in the ego lane that the failed decision hit is no cut-in
    assert cause_of(item("r", STOP_ANSWER)).cutting_in is False


def test_a_revision_written_twice_counts_once():
    first, twin, other = item("refl-1", STOP_ANSWER), item("refl-2", STOP_ANSWER), item("refl-3", STOP_ANSWER + " ")
    teacher = item("teacher-1", STOP_ANSWER, source="teacher")
    assert repeated_reflections([(first, 0.9), (teacher, 0.9), (twin, 0.9), (other, 0.8)]) == {"refl-2"}
    assert repeated_reflections([(teacher, 0.9), (item("teacher-2", STOP_ANSWER, source="teacher"), 0.9)]) == set()


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("lessons")
    bank_path, _ = make_bank(root)
    scene = samples.scene()
    scene.ego_speed = 7.0  # between the teacher items' 4..10 m/s: retrieved with them at K = 3
    with MemoryBank.open(bank_path, writable=True) as bank:
        bank.append(T.MemoryItem(id="refl-stop", query=PromptManager().decision_query(scene), answer=STOP_ANSWER,
                                 source="reflection"))
    student = DualHeadStudent.from_pretrained(make_student_dir(root), device="cpu")
    return student, MemoryBank.open(bank_path, writable=False), scene


def test_decide_weighs_a_retrieved_lesson_and_says_so(parts):
    student, bank, scene = parts
    plain = HeuristicSystem(student, PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.0)).decide(scene)
    weighted = HeuristicSystem(student, PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.5)).decide(scene)
    assert plain.retrieved_ids == weighted.retrieved_ids and plain.retrieved_ids[0] == "refl-stop"
    assert len(weighted.retrieved_similarities) == 3 and weighted.retrieved_similarities[0] == pytest.approx(1.0)
    assert plain.student_probabilities is None  # w = 0: the student's distribution is the decision
    np.testing.assert_allclose(weighted.student_probabilities, plain.probabilities, atol=1e-6)
    expected = 0.5 * plain.probabilities + 0.5 * p_of(SK=0.5, DK=0.5)
    np.testing.assert_allclose(weighted.probabilities, expected, atol=1e-6)
    assert set(weighted.candidate_set[:2]) == {"SK", "DK"}  # each >= 0.25 against an untrained student's spread


def test_decide_without_a_retrieved_lesson_is_the_students(parts):
    student, bank, scene = parts
    far = samples.scene()
    far.ego_speed = 4.0
    config = HeuristicConfig(k=1, lesson_weight=0.5)
    d = HeuristicSystem(student, PromptManager(), bank, config).decide(far)
    assert d.retrieved_ids == ["item-0"] and d.student_probabilities is None


def test_a_reflection_item_whose_cause_the_scene_lacks_is_neither_lesson_nor_example(parts):
    student, bank, scene = parts
    faster = samples.scene()
    faster.ego_speed = 7.0
    faster.objects[0].speed = 7.8 + 2.0 * CAUSE_SPEED_TOLERANCE  # the lead the lesson was about is not like this one
    d = HeuristicSystem(student, PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.5)).decide(faster)
    assert "refl-stop" not in d.retrieved_ids and len(d.retrieved_ids) == 3  # the next item in its place
    assert d.student_probabilities is None
    # w = 0, the paper's: every retrieved reflection item is an example in the prompt
    paper = HeuristicSystem(student, PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.0)).decide(faster)
    assert "refl-stop" in paper.retrieved_ids
    # nor is it kept from the previous decision's examples (retrieval_margin) once its cause has gone
    system = HeuristicSystem(student, PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.5,
                                                                           retrieval_margin=1.0))
    assert system.decide(scene).retrieved_ids[0] == "refl-stop"
    assert "refl-stop" not in system.decide(faster).retrieved_ids


def test_retrieval_replaces_a_repeated_revision_with_the_next_item(tmp_path):
    bank_path, teacher_ids = make_bank(tmp_path)
    scene = samples.scene()
    scene.ego_speed = 7.0
    with MemoryBank.open(bank_path, writable=True) as bank:
        for item_id in ("refl-stop", "refl-stop-again"):
            bank.append(T.MemoryItem(id=item_id, query=PromptManager().decision_query(scene), answer=STOP_ANSWER,
                                     source="reflection"))
    with MemoryBank.open(bank_path, writable=False) as bank:
        assert {i.id for i, _ in bank.retrieve(PromptManager().decision_query(scene), 2)} == {"refl-stop",
                                                                                          "refl-stop-again"}
        system = HeuristicSystem(DualHeadStudent.from_pretrained(make_student_dir(tmp_path), device="cpu"),
                                 PromptManager(), bank, HeuristicConfig(k=3, lesson_weight=0.5))
        retrieved = system.retrieve(scene, PromptManager().decision_query(scene))
    ids = [i.id for i, _ in retrieved]
    assert len(ids) == 3 and len({"refl-stop", "refl-stop-again"} & set(ids)) == 1
    assert set(ids[1:]) <= set(teacher_ids)
