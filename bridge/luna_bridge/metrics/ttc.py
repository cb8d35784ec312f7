"""time_to_collision_within_bound (nuPlan): the least TTC of the run (``luna_core.ttc``) must exceed 0.95 s.

At every step the relevant tracks (``luna_core.ttc.relevant_tracks``; the map says whether the ego
straddles lanes, is off them or is in a junction) that are present and not yet collided (any collision,
from its first step on) are projected with the ego for 3 s. TTC is 0 at steps with an at-fault
collision and inf while the ego is stopped (<= 0.005 m/s).
"""

from __future__ import annotations

import numpy as np

from luna_core.ttc import LEAST_MIN_TTC, TTC_STOPPED_SPEED, projected_ttc, projection_steps, relevant_tracks
from luna_core.types import ObjectClass

from luna_bridge.metrics.collisions import Collision
from luna_bridge.metrics.frames import LogFrames, in_common_or_connected_lanes
from luna_bridge.metrics.result import MetricResult, series


def time_to_collision(frames: LogFrames, collisions: list[Collision]) -> np.ndarray:
    """(N,) TTC per step in seconds (inf where no projected collision)."""
    n = frames.num_frames
    ttc = np.full(n, np.inf)
    if not frames.track_ids:
        for c in collisions:
            ttc[c.step] = 0.0 if c.at_fault else ttc[c.step]
        return ttc
    lane_ok = in_common_or_connected_lanes(frames)
    junction_lanes = {i for i, lane in frames.lanes.graph.lanes.items() if lane.in_junction}
    rear_lanes = frames.lanes.lanes_containing(frames.rear_axle)
    first_collision = {c.track_id: c.step for c in collisions}
    at_fault_steps = {c.step for c in collisions if c.at_fault}
    collided_from = np.array([first_collision.get(i, n + 1) for i in frames.track_ids])
    static = np.array([c is ObjectClass.STATIC for c in frames.track_class])
    steps = projection_steps()  # 0.1 .. 2.9 s
    for k in range(n):
        if k in at_fault_steps:
            ttc[k] = 0.0
            continue
        if frames.speed[k] <= TTC_STOPPED_SPEED:
            continue
        wide = (not lane_ok[k]) or bool(junction_lanes.intersection(rear_lanes[k]))
        relevant = frames.track_present[k] & (collided_from > k) & relevant_tracks(
            frames.rear_axle[k], frames.heading[k], frames.track_pose[k, :, :2], wide)
        idx = np.flatnonzero(relevant)
        if len(idx) == 0:
            continue
        speed = np.where(static[idx], 0.0, np.hypot(*frames.track_velocity[k, idx].T))
        ttc[k] = float(projected_ttc(frames.center[k], frames.heading[k], frames.speed[k], frames.ego_length,
                                     frames.ego_width, frames.track_pose[k, idx], speed, frames.track_size[k, idx],
                                     steps).min())
    return ttc


def time_to_collision_within_bound(frames: LogFrames, collisions: list[Collision]) -> MetricResult:
    """Time series: TTC per step (s; null where no projected collision within 3 s)."""
    ttc = time_to_collision(frames, collisions)
    least = float(ttc.min()) if len(ttc) else float("inf")
    return MetricResult("time_to_collision_within_bound", 1.0 if least > LEAST_MIN_TTC else 0.0,
                        {"min_time_to_collision": least}, series(ttc))
