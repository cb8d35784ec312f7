"""Reflection lessons weighted explicitly in the decision distribution (an extension of LUNA-AD Sec. III-E).

In the paper a reflection item (Q_md, A_refl) (Eq. 29) reaches later decisions only as one of the K
retrieved examples in the student's prompt. Measured here (docs/reflection.md, sessions 30-31), one
such example among K = 3 barely moves the default student; two copies of one revision do. With a
lesson weight w > 0 a retrieved lesson also acts on the distribution itself:

    pi'(a) = (1 - w) pi_hat(a) + w q(a)

q: the decisions the retrieved reflection items recommend (each item's recommended codes equally
likely, items weighted by their cosine similarity to the scene), restricted to the actions possible
now. Without a reflection item among the examples the decision is the student's, unchanged; w = 0 is
the paper's behaviour. An item whose answer does not parse, or whose recommendations are all
impossible now, gives no lesson (its text was validated when it was written; the bank is a file).

The default w = 0.5 (a lesson weighs as much as the student's own belief) was set before measuring and
is the only weight measured (docs/reflection.md, session 32). A bank without reflection items decides
as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from luna_core.prompts.parsers import MalformedModelOutput, action_set_of, parse_ranked_answer
from luna_core.types import ACTION_INDEX, NUM_ACTIONS, MemoryItem


DEFAULT_LESSON_WEIGHT = 0.5  # w; 0 = the paper's (a lesson is only an example in the prompt)


@dataclass(frozen=True)
class Lesson:
    """What a retrieved reflection item contributes to one decision."""

    item_id: str
    similarity: float  # cosine similarity of the item to the scene
    recommended: tuple[str, ...]  # the revision's codes that are possible now, best first


def recommended_codes(item: MemoryItem) -> tuple[str, ...]:
    """The codes a reflection item recommends, best first; () when its answer does not parse."""
    try:
        return tuple(parse_ranked_answer(item.answer, action_set_of(item.query), kind="reflection").ranked)
    except MalformedModelOutput:
        return ()


def lessons_of(retrieved: Sequence[tuple[MemoryItem, float]], mask: np.ndarray | None) -> list[Lesson]:
    """The lessons among the (item, similarity) examples a decision used; ``mask`` (10,) marks the
    actions possible now (None = all)."""
    lessons = []
    for item, similarity in retrieved:
        if item.source != "reflection":
            continue
        codes = tuple(c for c in recommended_codes(item) if mask is None or mask[ACTION_INDEX[c]])
        if codes and similarity > 0.0:
            lessons.append(Lesson(item.id, float(similarity), codes))
    return lessons


def weigh_lessons(probabilities: np.ndarray, lessons: Sequence[Lesson], weight: float) -> np.ndarray:
    """pi' = (1 - w) pi_hat + w q (module docstring); ``probabilities`` unchanged without lessons or
    with w = 0."""
    if weight <= 0.0 or not lessons:
        return probabilities
    q = np.zeros(NUM_ACTIONS)
    for lesson in lessons:
        for code in lesson.recommended:
            q[ACTION_INDEX[code]] += lesson.similarity / len(lesson.recommended)
    q /= q.sum()
    return (1.0 - weight) * np.asarray(probabilities, dtype=np.float64) + weight * q
