"""Reflection lessons weighted into the decision distribution (luna_core.lessons): the mixture itself, and
HeuristicSystem.decide with a real (untrained) student and a real MiniLM bank holding a reflection item."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core import types as T
from luna_core.heuristic import HeuristicConfig, HeuristicSystem
from luna_core.lessons import Lesson, lessons_of, recommended_codes, weigh_lessons
from luna_core.memory.bank import MemoryBank
from luna_core.prompts import PromptManager
from luna_core.student import DualHeadStudent
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir

torch.set_num_threads(1)  # the CI machine is shared

STOP_ANSWER = ("Recommended decisions: SK,DK\nExplanations:\n- SK: Vehicle stalled 20 m ahead (same lane); clear.\n"
               "- DK: Vehicle stalled 20 m ahead (same lane); clear. CK instead: hits stalled in 2.1 s.")


def item(item_id: str, answer: str, source: str = "reflection") -> T.MemoryItem:
    return T.MemoryItem(id=item_id, query=PromptManager().decision_query(samples.scene()), answer=answer,
                        source=source)


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
                 (item("refl-sk", "Recommended decisions: SK\nExplanations:\n- SK: stop."), 0.7)]  # only SK, masked
    assert recommended_codes(retrieved[2][0]) == ()
    assert lessons_of(retrieved, mask) == [Lesson("refl-ok", 0.9, ("DK",))]
    assert [lesson.recommended for lesson in lessons_of(retrieved, None)] == [("SK", "DK"), ("SK",)]


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
