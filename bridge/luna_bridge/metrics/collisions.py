"""no_ego_at_fault_collisions with nuPlan's collision classification.

At the first step a track's box overlaps the ego footprint the collision is classified (later
overlaps with the same track are ignored: a collision is counted once) by
``luna_core.collision_kinds``, the rules the progress monitor also uses for its reports:
STOPPED_EGO and ACTIVE_REAR are not at fault, STOPPED_TRACK and ACTIVE_FRONT are, ACTIVE_LATERAL is at
fault only if the ego straddles lanes or leaves the lanes then. The statistics count every collision
(``number_of_collisions``, what the monitor reports as I_coll) beside the at-fault ones.

Score: the product over track groups of max(0, 1 - n_at_fault / (threshold + 1)), thresholds 0 for
vehicles and VRUs (one collision scores 0) and 1 for static objects (one collision scores 0.5).
Box overlap is ``luna_core.geometry`` (SAT; touching counts as a collision, as shapely's
``intersects`` in nuPlan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from luna_core.collision_kinds import CollisionType, at_fault, collision_type
from luna_core.geometry import proposals_vs_objects
from luna_core.types import ObjectClass

from luna_bridge.metrics.frames import LogFrames, in_common_or_connected_lanes
from luna_bridge.metrics.result import MetricResult, series

THRESHOLD_VRU = 0
THRESHOLD_VEHICLE = 0
THRESHOLD_OBJECT = 1


@dataclass(frozen=True)
class Collision:
    step: int
    track_id: str
    object_class: ObjectClass
    kind: CollisionType
    at_fault: bool


def track_group(object_class: ObjectClass) -> str:
    if object_class.is_vru:
        return "vru"
    return "vehicle" if object_class is ObjectClass.VEHICLE else "object"


def overlap_matrix(frames: LogFrames) -> np.ndarray:
    """(N, M) ego-footprint x track overlaps (False where the track is absent)."""
    if not frames.track_ids:
        return np.zeros((frames.num_frames, 0), dtype=bool)
    tracks = np.nan_to_num(np.swapaxes(frames.track_corners(), 0, 1))  # (M, N, 4, 2)
    hit = proposals_vs_objects(frames.corners[None], tracks, np.swapaxes(frames.track_present, 0, 1),
                               backend="numpy")
    return np.swapaxes(hit[0], 0, 1)


def classify(frames: LogFrames, k: int, j: int) -> CollisionType:
    """nuPlan's collision type of ego at step ``k`` with track ``j``."""
    return collision_type(frames.corners[k], frames.rear_axle[k], float(frames.heading[k]), float(frames.speed[k]),
                          frames.track_corners()[k, j], frames.track_pose[k, j, :2],
                          float(np.hypot(*frames.track_velocity[k, j])))


def find_collisions(frames: LogFrames) -> list[Collision]:
    """Every first-contact collision of the run, in step order (tracks in first-seen order)."""
    hits = overlap_matrix(frames)
    lane_ok = in_common_or_connected_lanes(frames)
    collided: set[int] = set()
    out: list[Collision] = []
    for k, j in zip(*np.nonzero(hits)):
        if j in collided:
            continue
        collided.add(int(j))
        kind = classify(frames, int(k), int(j))
        out.append(Collision(int(k), frames.track_ids[j], frames.track_class[j], kind, at_fault(kind, bool(lane_ok[k]))))
    return out


def no_ego_at_fault_collisions(frames: LogFrames, collisions: list[Collision]) -> MetricResult:
    """Time series: at-fault collisions starting at each step."""
    at_fault = [c for c in collisions if c.at_fault]
    counts = {g: sum(1 for c in at_fault if track_group(c.object_class) == g) for g in ("vru", "vehicle", "object")}
    score = 1.0
    for group, thr in (("vru", THRESHOLD_VRU), ("vehicle", THRESHOLD_VEHICLE), ("object", THRESHOLD_OBJECT)):
        score *= max(0.0, 1.0 - counts[group] / (thr + 1))
    per_step = np.zeros(frames.num_frames)
    for c in at_fault:
        per_step[c.step] += 1
    stats: dict[str, object] = {"number_of_at_fault_collisions": len(at_fault),
                                "number_of_collisions": len(collisions)}
    stats.update({f"at_fault_collisions_with_{g}": n for g, n in counts.items()})
    for kind in CollisionType:
        stats[f"collisions_{kind.value}"] = sum(1 for c in collisions if c.kind is kind)
    return MetricResult("no_ego_at_fault_collisions", score, stats, series(per_step))
