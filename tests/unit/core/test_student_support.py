"""Helpers shared by the student, distillation and evaluation tests (no tests here): real scene queries
from the prompt manager, memory items with known distributions."""

from __future__ import annotations

import numpy as np

from luna_core.scene import scene_vector
from luna_core.prompts import Knowledge, PromptManager, format_ranked_answer
from luna_core.types import (ACTION_CODES, ObjectClass, ObjectDescription, RoadSection, SceneDescriptor,
                             MemoryItem)

# The real prompt manager with a short decision-making instruction: the default one is ~460 tokens,
# which would make every forward pass in these tests several times slower on two shared cores.
PROMPTS = PromptManager(Knowledge(decision_making=(
    "You recommend driving decisions for the ego vehicle. Answer with 'Recommended decisions:' and the "
    "ranked action codes, then 'Explanations:' with one line per code.")))


def scene(n_objects: int = 2, speed: float = 8.0, left: bool = True, right: bool = False) -> SceneDescriptor:
    objects = [ObjectDescription(id=f"veh{i}", object_class=ObjectClass.VEHICLE, distance=10.0 + 7.5 * i,
                                 bearing=0.05 * i, heading=0.0, speed=6.0 + i, length=4.5, width=1.9,
                                 lane_relation="same lane" if i % 2 == 0 else "left lane")
               for i in range(n_objects)]
    return SceneDescriptor(stamp=0.0, road_section=RoadSection.NORMAL_MULTI_LANE, num_lanes=2,
                           ego_lane_index=2, ego_speed=speed, objects=objects, has_left_lane=left,
                           has_right_lane=right)


def query(n_objects: int = 2, speed: float = 8.0) -> str:
    return PROMPTS.decision_query(scene(n_objects, speed))


def distribution(top: str, mass: float = 0.7) -> np.ndarray:
    p = np.full(len(ACTION_CODES), (1.0 - mass) / (len(ACTION_CODES) - 1))
    p[ACTION_CODES.index(top)] = mass
    return p


def answer(codes: list[str], why: str) -> str:
    return format_ranked_answer(codes, {c: f"{why} ({c})" for c in codes})


def memory_item(i: int, top: str = "CK", n_objects: int = 1) -> MemoryItem:
    sc = scene(n_objects, speed=5.0 + i)
    second = "DK" if top != "DK" else "CK"
    return MemoryItem(id=f"m{i}", query=PROMPTS.decision_query(sc),
                      answer=answer([top, second], f"keep a safe gap to veh0 at {5 + i} m/s."),
                      distribution=distribution(top), scene_vector=scene_vector(sc))
