"""Reflection lessons weighted explicitly in the decision distribution (an extension of LUNA-AD Sec. III-E).

In the paper a reflection item (Q_md, A_refl) (Eq. 29) reaches later decisions only as one of the K
retrieved examples in the student's prompt. Measured here (docs/reflection.md, sessions 30-31), one
such example among K = 3 barely moves the default student; two copies of one revision do. With a
lesson weight w > 0 a retrieved lesson also acts on the distribution itself:

    pi'(a) = (1 - w) pi_hat(a) + w q(a)

q: the decisions the retrieved reflection items recommend (each item's recommended codes equally
likely, items weighted by their cosine similarity to the scene), restricted to the actions possible
now. Without a reflection item among the examples the decision is the student's, unchanged; w = 0 is
the paper's behaviour (every retrieved reflection item an example, but for a repeated revision,
retrieved once: below). An item whose answer does not parse, or whose recommendations are all
impossible now, gives no lesson (its text was validated when it was written; the bank is a file).

The default w = 0.5 (a lesson weighs as much as the student's own belief) was set before measuring and
is the only weight measured (docs/reflection.md, sessions 32-33). A bank without reflection items decides
as before.

A lesson is about its cause, so it acts only where the scene has one like it (``LessonCause``): the
object the failed decision hit or was held behind (as the grounded revision names it, "CK instead: hits
v3 in 2.1 s"), else the revision's decisive object, else the red or yellow light it names. Alike: the
same kind of object in the same lane relation, on the same side (ahead / behind), moving within
``CAUSE_SPEED_TOLERANCE`` of it. An item whose cause cannot be read (e.g. a reason an LLM reworded)
stays an example in the prompt only. With w > 0 a reflection item whose cause the scene lacks is not
retrieved at all (``absent_causes``; the next item takes its place): as an example in the prompt it moved
the student where its lesson did not apply (docs/reflection.md, session 34). A reflection item with the
same query and answer as a better retrieved one is one failure written twice (a deterministic rerun
reproduces it): it is retrieved once (``repeated_reflections``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from luna_core.prompts.parsers import MalformedModelOutput, action_set_of, parse_ranked_answer
from luna_core.scene import CLASS_WORD, CUTTING_IN_TEXT, LEFT_LANE, OBJECT_LINE, RIGHT_LANE, SAFE_ID_CHARS
from luna_core.types import ACTION_INDEX, NUM_ACTIONS, MemoryItem, SceneDescriptor


DEFAULT_LESSON_WEIGHT = 0.5  # w; 0 = the paper's (a lesson is only an example in the prompt)
# Set before measuring: a stalled car (0 m/s) and a crawling queue (<= 2 m/s) are alike, a car moving
# with the ego's traffic is not.
CAUSE_SPEED_TOLERANCE = 2.0  # m/s

# The renderings this reads are luna_core.scene.render_traffic_state (the query, its OBJECT_LINE) and
# luna_core.hindsight.HindsightVerdict.answer with teacher.brief_rationale (the revision).
_ID = f"([{SAFE_ID_CHARS}]*[{SAFE_ID_CHARS.replace('.', '')}])"  # an object id, not a sentence's final period
_EXECUTED_OBJECT = re.compile(r"\binstead: (?:hits " + _ID + r" in|blocked behind " + _ID + r")")
_DECISIVE_OBJECT = re.compile(r"^(?:Vehicle|Pedestrian|Cyclist|Obstacle) " + _ID + r" \d+ m (?:ahead|behind)")
_LIGHT = re.compile(r"^(Red|Yellow) light\b")


@dataclass(frozen=True)
class Lesson:
    """What a retrieved reflection item contributes to one decision."""

    item_id: str
    similarity: float  # cosine similarity of the item to the scene
    recommended: tuple[str, ...]  # the revision's codes that are possible now, best first


@dataclass(frozen=True)
class LessonCause:
    """What a reflection item's failure was about, as its query described it (module docstring)."""

    kind: str  # "vehicle", "pedestrian", "cyclist", "static object"; "light" for a traffic light
    relation: str  # the lane relation ("same lane", "left lane", "junction", ...); a light's phase ("Red")
    ahead: bool = True
    speed: float = 0.0  # m/s
    cutting_in: bool = False  # it moved from its adjacent lane into the ego lane

    def present_in(self, scene: SceneDescriptor) -> bool:
        """Whether ``scene`` has a cause like this one."""
        if self.kind == "light":
            return scene.traffic_light.value == self.relation
        return any(CLASS_WORD[o.object_class] == self.kind and o.lane_relation == self.relation
                   and (math.cos(o.bearing) >= 0.0) == self.ahead
                   and abs(o.speed - self.speed) <= CAUSE_SPEED_TOLERANCE
                   and (o.cutting_in or not self.cutting_in) for o in scene.objects)


def _described_object(query: str, object_id: str, entered_ego_lane: bool = False) -> LessonCause | None:
    """The query's object ``object_id`` as a cause; ``entered_ego_lane``: the failed decision hit it or was
    held behind it, so one in an adjacent lane then moved into the ego lane."""
    for m in OBJECT_LINE.finditer(query):
        if m["id"] == object_id:
            relation = m["relation"].removesuffix(CUTTING_IN_TEXT)
            cutting_in = relation != m["relation"] or (entered_ego_lane and relation in (LEFT_LANE, RIGHT_LANE))
            return LessonCause(m["kind"], relation, math.cos(math.radians(int(m["bearing"]))) >= 0.0,
                               float(m["speed"] or 0.0), cutting_in)
    return None


@lru_cache(maxsize=4096)  # retrieval and the lessons read the same few items at every decision
def _reading(query: str, answer: str) -> tuple[LessonCause | None, tuple[str, ...]]:
    """A reflection item's cause (None when it cannot be read) and its recommended codes, best first
    (none when the answer does not parse)."""
    try:
        parsed = parse_ranked_answer(answer, action_set_of(query), kind="reflection")
    except MalformedModelOutput:
        return None, ()
    if not parsed.ranked:
        return None, ()
    first = parsed.explanations.get(parsed.ranked[0], "")
    executed = _EXECUTED_OBJECT.search(first)
    if executed and (cause := _described_object(query, executed[1] or executed[2], True)) is not None:
        return cause, tuple(parsed.ranked)
    if light := _LIGHT.match(first):
        return LessonCause("light", light[1]), tuple(parsed.ranked)
    decisive = _DECISIVE_OBJECT.match(first)
    return (_described_object(query, decisive[1]) if decisive else None), tuple(parsed.ranked)


def cause_of(item: MemoryItem) -> LessonCause | None:
    """The cause a reflection item's revision names (module docstring); None when it cannot be read."""
    return _reading(item.query, item.answer)[0]


def repeated_reflections(retrieved: Sequence[tuple[MemoryItem, float]]) -> set[str]:
    """Ids of the reflection items whose query and answer a better-ranked reflection item already has."""
    seen, repeated = set(), set()
    for item, _ in retrieved:
        if item.source == "reflection":
            key = (item.query, item.answer)
            if key in seen:
                repeated.add(item.id)
            seen.add(key)
    return repeated


def absent_causes(retrieved: Sequence[tuple[MemoryItem, float]], scene: SceneDescriptor) -> set[str]:
    """Ids of the reflection items among ``retrieved`` whose cause can be read and ``scene`` lacks."""
    return {item.id for item, _ in retrieved if item.source == "reflection"
            and (cause := cause_of(item)) is not None and not cause.present_in(scene)}


def lessons_of(retrieved: Sequence[tuple[MemoryItem, float]], scene: SceneDescriptor,
               mask: np.ndarray | None) -> list[Lesson]:
    """The lessons among the (item, similarity) examples a decision used for ``scene``: reflection
    items whose cause the scene has; ``mask`` (10,) marks the actions possible now (None = all)."""
    lessons = []
    for item, similarity in retrieved:
        if item.source != "reflection" or similarity <= 0.0:
            continue
        cause, recommended = _reading(item.query, item.answer)
        if cause is None or not cause.present_in(scene):
            continue
        codes = tuple(c for c in recommended if mask is None or mask[ACTION_INDEX[c]])
        if codes:
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
