"""time_to_collision_within_bound (nuPlan).

At every step the ego box and the relevant tracks are projected at constant speed along their
headings every 0.1 s up to 3 s; the TTC is the first projected step with an overlap (inf if none).
Relevant tracks: present, not yet collided (any collision, from its first step on), and ahead of
the ego (within 30 deg of its heading) or, when the ego straddles lanes / is off the lanes / is in
a junction, anywhere except behind (> 150 deg). TTC is 0 at steps with an at-fault collision and
inf while the ego is stopped (<= 0.005 m/s). Score 1 if the least TTC of the run exceeds 0.95 s.
"""

from __future__ import annotations

import numpy as np

from luna_core.collision_kinds import BEHIND_ANGLE
from luna_core.geometry import proposals_vs_objects
from luna_core.types import ObjectClass, box_corners, wrap_angle

from luna_bridge.metrics.collisions import Collision
from luna_bridge.metrics.frames import LogFrames, in_common_or_connected_lanes
from luna_bridge.metrics.result import MetricResult, series

TTC_STEP = 0.1  # s
TTC_HORIZON = 3.0  # s
LEAST_MIN_TTC = 0.95  # s
AHEAD_ANGLE = np.deg2rad(30.0)
TTC_STOPPED_SPEED = 0.005  # m/s


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
    steps = np.arange(TTC_STEP, TTC_HORIZON - 1e-9, TTC_STEP)  # 0.1 .. 2.9 s as nuPlan's arange
    for k in range(n):
        if k in at_fault_steps:
            ttc[k] = 0.0
            continue
        if frames.speed[k] <= TTC_STOPPED_SPEED:
            continue
        rel = frames.track_pose[k, :, :2] - frames.rear_axle[k]
        angle = np.abs(wrap_angle(np.arctan2(rel[:, 1], rel[:, 0]) - frames.heading[k]))
        wide = (not lane_ok[k]) or bool(junction_lanes.intersection(rear_lanes[k]))
        relevant = frames.track_present[k] & (collided_from > k) & (
            (angle < AHEAD_ANGLE) | (wide & (angle <= BEHIND_ANGLE)))
        idx = np.flatnonzero(relevant)
        if len(idx) == 0:
            continue
        h = frames.heading[k]
        ego_c = frames.center[k] + frames.speed[k] * steps[:, None] * np.array([np.cos(h), np.sin(h)])
        ego_boxes = box_corners(ego_c[:, 0], ego_c[:, 1], h, frames.ego_length, frames.ego_width)
        pose = frames.track_pose[k, idx]
        speed = np.where(static[idx], 0.0, np.hypot(*frames.track_velocity[k, idx].T))
        dxy = speed[:, None] * np.column_stack([np.cos(pose[:, 2]), np.sin(pose[:, 2])])  # (R, 2)
        tc = pose[None, :, :2] + steps[:, None, None] * dxy[None]  # (S, R, 2)
        size = frames.track_size[k, idx]
        track_boxes = box_corners(tc[..., 0].T, tc[..., 1].T, pose[:, 2:3], size[:, 0:1], size[:, 1:2])
        hit = proposals_vs_objects(ego_boxes[None], track_boxes, backend="numpy")[0].any(axis=0)  # (S,)
        if hit.any():
            ttc[k] = float(steps[int(np.argmax(hit))])
    return ttc


def time_to_collision_within_bound(frames: LogFrames, collisions: list[Collision]) -> MetricResult:
    """Time series: TTC per step (s; null where no projected collision within 3 s)."""
    ttc = time_to_collision(frames, collisions)
    least = float(ttc.min()) if len(ttc) else float("inf")
    return MetricResult("time_to_collision_within_bound", 1.0 if least > LEAST_MIN_TTC else 0.0,
                        {"min_time_to_collision": least}, series(ttc))
