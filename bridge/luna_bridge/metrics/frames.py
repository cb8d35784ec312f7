"""Arrays a ``SimulationLog`` is scored from, extracted once and shared by every metric.

nuPlan's metrics read the ego box centre, the ego footprint corners and the tracked objects of every
sample, plus which lanes the ego occupies (its ``ego_lane_change`` statistics). ``LogFrames`` holds
exactly that, padded over the union of track ids so that metrics can vectorise over frames x tracks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from luna_core.lanes import LaneMap, lane_map
from luna_core.planning import scorer
from luna_core.types import ObjectClass, box_corners, wrap_angle

from luna_bridge.scenario import SimulationLog


@dataclass
class LogFrames:
    t: np.ndarray  # (N,) s
    center: np.ndarray  # (N, 2) ego box centre
    rear_axle: np.ndarray  # (N, 2)
    heading: np.ndarray  # (N,)
    speed: np.ndarray  # (N,) |longitudinal velocity| (nuPlan's dynamic_car_state.speed)
    acceleration: np.ndarray  # (N,) longitudinal
    yaw_rate: np.ndarray  # (N,)
    corners: np.ndarray  # (N, 4, 2) front-left, rear-left, rear-right, front-right
    ego_length: float
    ego_width: float
    track_ids: list[str]  # (M,)
    track_class: list[ObjectClass]  # (M,)
    track_present: np.ndarray  # (N, M) bool
    track_pose: np.ndarray  # (N, M, 3) centre x, y, heading (NaN where absent)
    track_velocity: np.ndarray  # (N, M, 2) map-frame velocity
    track_size: np.ndarray  # (N, M, 2) length, width
    lanes: LaneMap = field(repr=False, default=None)  # type: ignore[assignment]
    center_lanes: list[list[str]] = field(default_factory=list)  # (N,) lane ids containing the centre

    @property
    def num_frames(self) -> int:
        return len(self.t)

    def track_corners(self) -> np.ndarray:
        """(N, M, 4, 2) object footprints (NaN where absent)."""
        p, s = self.track_pose, self.track_size
        return box_corners(p[..., 0], p[..., 1], p[..., 2], s[..., 0], s[..., 1])


def extract_frames(log: SimulationLog) -> LogFrames:
    """Arrays of ``log``; raises ValueError naming the first non-finite ego state."""
    if len(log.ego) == 0:
        raise ValueError(f"simulation log of {log.scenario.name!r} has no ego states")
    ego = log.ego_array()
    bad = np.flatnonzero(~np.all(np.isfinite(ego[:, :4]), axis=1))
    if len(bad):
        raise ValueError(f"simulation log of {log.scenario.name!r}: non-finite ego state at step {bad[0]}")
    vp = log.scenario.vehicle
    heading = ego[:, 2]
    d = vp.rear_axle_to_center
    center = ego[:, :2] + d * np.column_stack([np.cos(heading), np.sin(heading)])
    corners = box_corners(center[:, 0], center[:, 1], heading, vp.length, vp.width)

    ids: list[str] = []
    classes: list[ObjectClass] = []
    index: dict[str, int] = {}
    for frame in log.objects:
        for obj in frame.objects:
            if obj.id not in index:
                index[obj.id] = len(ids)
                ids.append(obj.id)
                classes.append(obj.object_class)
    n, m = len(log.ego), len(ids)
    present = np.zeros((n, m), dtype=bool)
    pose = np.full((n, m, 3), np.nan)
    vel = np.full((n, m, 2), np.nan)
    size = np.full((n, m, 2), np.nan)
    for k, frame in enumerate(log.objects[:n]):
        for obj in frame.objects:
            if not obj.is_finite():
                continue  # a NaN object is absent for the metrics, as a lost track would be
            j = index[obj.id]
            present[k, j] = True
            pose[k, j] = (obj.x, obj.y, obj.heading)
            vel[k, j] = (obj.vx, obj.vy)
            size[k, j] = (obj.length, obj.width)

    lm = lane_map(log.scenario.lane_graph)
    center_lanes = lm.lanes_containing(center)
    return LogFrames(t=np.asarray(log.t, dtype=np.float64)[:n], center=center, rear_axle=ego[:, :2].copy(),
                     heading=wrap_angle(heading), speed=np.abs(ego[:, 3]), acceleration=ego[:, 4],
                     yaw_rate=ego[:, 5], corners=corners, ego_length=vp.length, ego_width=vp.width,
                     track_ids=ids, track_class=classes, track_present=present, track_pose=pose,
                     track_velocity=vel, track_size=size, lanes=lm, center_lanes=center_lanes)


def in_common_or_connected_lanes(frames: LogFrames) -> np.ndarray:
    """(N,) True where the ego footprint lies in one lane or in lanes connected end to end.

    nuPlan's ``timestamps_in_common_or_connected_route_objs``: False means the ego straddles lanes
    (e.g. mid lane change) or has a corner outside every lane, which makes lateral collisions its
    fault and widens the set of tracks its TTC considers. Same test as the planner's scorer.
    """
    return scorer.in_common_or_connected_lanes(frames.lanes, frames.corners)


def driven_lanes(frames: LogFrames) -> list[str | None]:
    """(N,) the lane the ego centre is on (nuPlan's ``ego_driven_route``), None off every lane.

    Where lanes overlap (junction connectors) the previous frame's lane is kept while it still
    contains the centre, otherwise the lane whose direction best matches the ego heading.
    """
    out: list[str | None] = []
    prev: str | None = None
    for k, ids in enumerate(frames.center_lanes):
        if not ids:
            out.append(None)
            prev = None
            continue
        if prev in ids:
            out.append(prev)
            continue
        if len(ids) == 1:
            pick = ids[0]
        else:
            errs = [abs(float(wrap_angle(frames.heading[k] - frames.lanes.centerlines[i].project(
                frames.center[k]).heading))) for i in ids]
            pick = ids[int(np.argmin(errs))]
        out.append(pick)
        prev = pick
    return out
