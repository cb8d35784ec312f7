"""nuPlan's collision types at first contact, shared by the progress monitor and the closed-loop metrics.

The monitor reports every overlap of the ego with an object (Algorithm 1: I_coll); nuPlan's
``no_ego_at_fault_collisions`` counts only the ones the ego caused. Both classify a contact with the
same rules, so a collision the monitor reports and the metrics do not count says why:

* STOPPED_EGO: ego speed <= 0.05 m/s (not at fault: something ran into a standing ego);
* STOPPED_TRACK: the object's speed <= 0.05 m/s (at fault);
* ACTIVE_REAR: the object's centre is behind the ego, more than 150 deg off its heading as seen from
  the rear axle (not at fault);
* ACTIVE_FRONT: the ego's front edge touches the object (at fault);
* ACTIVE_LATERAL: otherwise; at fault only if the ego straddles lanes or leaves them at that step,
  which needs the map (the metrics decide it; the monitor, without a map, reports the type only).
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from luna_core.geometry import boxes_overlap
from luna_core.types import wrap_angle

STOPPED_SPEED = 0.05  # m/s, nuPlan's stopped threshold for collisions
BEHIND_ANGLE = float(np.deg2rad(150.0))


class CollisionType(str, Enum):
    STOPPED_EGO = "STOPPED_EGO"
    STOPPED_TRACK = "STOPPED_TRACK"
    ACTIVE_REAR = "ACTIVE_REAR"
    ACTIVE_FRONT = "ACTIVE_FRONT"
    ACTIVE_LATERAL = "ACTIVE_LATERAL"


#: Types that are at fault whatever the lanes; ACTIVE_LATERAL depends on them (``at_fault``).
AT_FAULT = frozenset({CollisionType.STOPPED_TRACK, CollisionType.ACTIVE_FRONT})
NOT_AT_FAULT = frozenset({CollisionType.STOPPED_EGO, CollisionType.ACTIVE_REAR})


def collision_type(ego_corners: np.ndarray, ego_rear_axle: np.ndarray, ego_heading: float, ego_speed: float,
                   track_corners: np.ndarray, track_center: np.ndarray, track_speed: float) -> CollisionType:
    """nuPlan's type of a first contact between the ego box ``ego_corners`` (4, 2; counter-clockwise
    from front-left, as ``types.box_corners``) and an object box ``track_corners`` (4, 2)."""
    if ego_speed <= STOPPED_SPEED:
        return CollisionType.STOPPED_EGO
    if track_speed <= STOPPED_SPEED:
        return CollisionType.STOPPED_TRACK
    rel = np.asarray(track_center, dtype=np.float64) - np.asarray(ego_rear_axle, dtype=np.float64)
    if abs(float(wrap_angle(np.arctan2(rel[1], rel[0]) - ego_heading))) > BEHIND_ANGLE:
        return CollisionType.ACTIVE_REAR
    c = np.asarray(ego_corners, dtype=np.float64)
    front_edge = np.stack([c[0], c[3], c[3], c[0]])  # a zero-width box: the front bumper segment
    if bool(boxes_overlap(front_edge, np.asarray(track_corners, dtype=np.float64), backend="numpy")):
        return CollisionType.ACTIVE_FRONT
    return CollisionType.ACTIVE_LATERAL


def at_fault(kind: CollisionType, ego_in_common_lanes: bool) -> bool:
    """nuPlan's at-fault rule: ACTIVE_LATERAL is at fault when the ego is not within one lane (or
    connected lanes) at that step."""
    return kind in AT_FAULT or (kind is CollisionType.ACTIVE_LATERAL and not ego_in_common_lanes)


def describe(kind: CollisionType) -> str:
    """How the metrics will count this type, for reports."""
    if kind in AT_FAULT:
        return f"{kind.value}, at fault"
    if kind in NOT_AT_FAULT:
        return f"{kind.value}, not at fault by nuPlan's rules"
    return f"{kind.value}, at fault only if the ego was not within its lane"
