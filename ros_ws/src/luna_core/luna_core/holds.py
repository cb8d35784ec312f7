"""What legitimately holds the ego at one scene: the permissive condition of Eq. 23, extended.

LUNA-AD's stall warning (Eq. 23) claims a stall when the ego barely moves although the traffic light
permits it to go. A light is not the only thing that may hold a vehicle: a stopped or slower leader
close ahead in the ego lane, or a pedestrian or cyclist on (or about to enter) the ego path, hold it
just as legitimately, and waiting for them is no failure. :func:`hold_of` reads them from the scene
descriptor xi_t (Table I), which already says which objects are in the ego lane, so the progress
monitor needs no map:

* **light**: the phase of the light governing the ego path is Red or Yellow (Eq. 23 as published);
* **leader**: an object of the ego lane ahead of the ego, no faster than the ego (or than v_th while
  the ego stands), whose bumper gap is within the ego's stopping distance
  ``hold_gap + v headway + v^2 / (2 hold_deceleration)`` (the IDM's desired gap with a standstill
  distance that covers how far back drivers stop); ``stopped`` when its speed along the ego heading is
  at most ``stopped_speed`` (a parked or broken-down car, or a queue that does not move);
* **vru**: a pedestrian or cyclist ahead within ``vru_distance`` whose lateral offset from the ego
  axis is within ``vru_half_width``, or who moves towards the axis and reaches it within
  ``vru_crossing_time``.

Bumper gaps and lateral offsets come from the descriptor's polar coordinates (centre to centre, along
the ego heading), which is exact for boxes aligned with the ego and conservative enough otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from luna_core.scene import SAME_LANE
from luna_core.types import ObjectClass, SceneDescriptor, TrafficLightPhase

#: Light phases under which forward progress is permitted (Eq. 23).
PERMISSIVE_PHASES = frozenset({TrafficLightPhase.GREEN, TrafficLightPhase.NONE})

LIGHT, LEADER, VRU = "light", "leader", "vru"


@dataclass(frozen=True)
class HoldParameters:
    """When a leader or a VRU holds the ego (progress-monitor node parameters; defaults as below)."""

    hold_gap: float = 8.0  # m: bumper gap within which a standing ego counts as queued behind a leader
    hold_headway: float = 1.5  # s: time gap added per m/s of ego speed (the IDM headway)
    hold_deceleration: float = 3.0  # m/s^2: braking assumed for the stopping distance
    stopped_speed: float = 0.2  # m/s: a leader no faster than this along the ego heading is stopped
    vru_distance: float = 15.0  # m ahead within which a VRU on or towards the ego path holds the ego
    vru_half_width: float = 3.0  # m: lateral offset from the ego axis counted as on the ego path
    vru_crossing_time: float = 3.0  # s: a VRU reaching the path within this long holds the ego too

    def __post_init__(self) -> None:
        for name in ("hold_gap", "hold_headway", "hold_deceleration", "stopped_speed", "vru_distance",
                     "vru_half_width", "vru_crossing_time"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0) or (name == "hold_deceleration" and value == 0.0):
                raise ValueError(f"HoldParameters.{name} must be a finite number >= 0 (deceleration > 0), "
                                 f"got {value!r}")


@dataclass(frozen=True)
class Hold:
    """Why the ego may stand at one scene: ``kind`` is ``light``, ``leader`` or ``vru``."""

    kind: str
    object_id: str = ""  # the leader or VRU ("" for a light)
    stopped: bool = False  # a leader that stands (being held by it for long is "blocked")
    detail: str = ""  # for diagnostics, e.g. "vehicle v3 4.2 m ahead at 0.0 m/s"


def stopping_distance(speed: float, params: HoldParameters) -> float:
    """Bumper gap (m) within which a leader holds an ego driving at ``speed`` (m/s)."""
    v = max(speed, 0.0)
    return params.hold_gap + v * params.hold_headway + v * v / (2.0 * params.hold_deceleration)


def hold_of(scene: SceneDescriptor, speed_threshold: float, params: HoldParameters = HoldParameters()) -> Hold | None:
    """What holds the ego at ``scene`` (a red or yellow light first, then the closest leader, then a
    VRU), or None when nothing does and a standing ego would be stalling. ``speed_threshold`` is v_th
    of Eq. 23: a leader slower than it counts as holding a standing ego."""
    if scene.traffic_light not in PERMISSIVE_PHASES:
        return Hold(LIGHT, detail=f"the light is {scene.traffic_light.value}")
    v_ego = max(scene.ego_speed, 0.0)
    reach = stopping_distance(v_ego, params)
    leaders = []
    for o in scene.objects:
        ahead = o.distance * math.cos(o.bearing)
        if o.lane_relation != SAME_LANE or ahead <= 0.0 or o.object_class.is_vru:
            continue
        gap = ahead - (scene.ego_length + o.length) / 2.0
        along = o.speed * math.cos(o.heading)  # the leader's speed along the ego heading
        if gap <= reach and along <= max(v_ego, speed_threshold):
            leaders.append((gap, o, along))
    if leaders:
        gap, o, along = min(leaders, key=lambda item: item[0])
        kind = "static object" if o.object_class is ObjectClass.STATIC else o.object_class.value
        return Hold(LEADER, o.id, along <= params.stopped_speed,
                    f"{kind} {o.id} {max(gap, 0.0):.1f} m ahead at {along:.1f} m/s")
    for o in sorted(scene.objects, key=lambda o: o.distance):
        ahead = o.distance * math.cos(o.bearing)
        if not o.object_class.is_vru or not 0.0 < ahead <= params.vru_distance:
            continue
        lateral = o.distance * math.sin(o.bearing)  # + left of the ego axis
        lateral_speed = o.speed * math.sin(o.heading)  # + to the left
        off_path = abs(lateral) - params.vru_half_width
        towards = lateral * lateral_speed < 0.0
        if off_path <= 0.0 or (towards and off_path <= abs(lateral_speed) * params.vru_crossing_time):
            return Hold(VRU, o.id, False, f"{o.object_class.value} {o.id} {ahead:.1f} m ahead, "
                                          f"{abs(lateral):.1f} m to the {'left' if lateral > 0 else 'right'}")
    return None
