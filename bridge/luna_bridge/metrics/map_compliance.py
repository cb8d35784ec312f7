"""Map-based nuPlan metrics: drivable_area_compliance, driving_direction_compliance,
speed_limit_compliance."""

from __future__ import annotations

import numpy as np

from luna_bridge.metrics.frames import LogFrames, driven_lanes
from luna_bridge.metrics.result import MetricResult, series

DRIVABLE_AREA_TOLERANCE = 0.3  # m a footprint corner may stick out of the drivable area
DIRECTION_COMPLIANCE_THRESHOLD = 2.0  # m of oncoming progress within the horizon tolerated fully
DIRECTION_VIOLATION_THRESHOLD = 6.0  # m beyond which the score is 0 (0.5 in between)
DIRECTION_HORIZON = 1.0  # s
MAX_OVERSPEED = 2.23  # m/s, nuPlan's max_overspeed_value_threshold


def drivable_area_compliance(frames: LogFrames) -> MetricResult:
    """0 if any footprint corner is ever more than 0.3 m outside the drivable area, else 1.

    Time series: the largest corner distance to the drivable area per step (m)."""
    dist = frames.lanes.distance_to_drivable_area(frames.corners).max(axis=1)
    worst = float(dist.max())
    ok = worst <= DRIVABLE_AREA_TOLERANCE
    return MetricResult("drivable_area_compliance", 1.0 if ok else 0.0,
                        {"max_distance_outside": worst,
                         "violating_steps": int(np.sum(dist > DRIVABLE_AREA_TOLERANCE))}, series(dist))


def driving_direction_compliance(frames: LogFrames, dt: float) -> MetricResult:
    """Progress along the driven lane's centreline summed over the last 1 s; the worst (most
    negative) window scores 1 below 2 m of oncoming driving, 0.5 below 6 m, else 0.

    As in nuPlan, progress restarts at 0 whenever the ego enters another lane or is off every lane.
    """
    lanes = driven_lanes(frames)
    progress = np.zeros(frames.num_frames)
    prev_lane: str | None = None
    prev_s: float | None = None
    for k, lane_id in enumerate(lanes):
        if lane_id is None:
            prev_lane, prev_s = None, None
            continue
        s = float(frames.lanes.centerlines[lane_id].project(frames.center[k]).s)
        if lane_id == prev_lane and prev_s is not None:
            progress[k] = s - prev_s
        prev_lane, prev_s = lane_id, s
    n_horizon = int(round(DIRECTION_HORIZON / dt))
    csum = np.concatenate([[0.0], np.cumsum(progress)])
    idx = np.arange(frames.num_frames)
    window = csum[idx + 1] - csum[np.maximum(idx - n_horizon, 0)]  # samples ind-n .. ind inclusive
    worst_oncoming = max(0.0, -float(window.min()))
    if worst_oncoming < DIRECTION_COMPLIANCE_THRESHOLD:
        score = 1.0
    elif worst_oncoming < DIRECTION_VIOLATION_THRESHOLD:
        score = 0.5
    else:
        score = 0.0
    return MetricResult("driving_direction_compliance", score,
                        {"min_progress_in_horizon": -worst_oncoming}, series(window))


def lane_speed_limit(frames: LogFrames, lane_id: str) -> float:
    """Speed limit (m/s) of a lane; junction connectors take the largest limit of the lanes they
    connect (nuPlan's rule for lane connectors). 0 when unknown."""
    graph = frames.lanes.graph
    lane = graph.lanes[lane_id]
    if not lane.in_junction:
        return lane.speed_limit
    limits = [graph.lanes[i].speed_limit for i in (*lane.predecessors, *lane.successors) if i in graph.lanes]
    limits = limits or [lane.speed_limit]
    return max(limits) if all(v > 0 for v in limits) else 0.0


def speed_limit_compliance(frames: LogFrames, dt: float) -> MetricResult:
    """max(0, 1 - sum(over-speed) dt / (2.23 m/s x scenario duration)); lanes with an unknown
    limit (0) never count as a violation. Time series: over-speed per step (m/s)."""
    over = np.zeros(frames.num_frames)
    for k, lane_id in enumerate(driven_lanes(frames)):
        if lane_id is None:
            continue
        limit = lane_speed_limit(frames, lane_id)
        if limit > 0:
            over[k] = max(0.0, frames.speed[k] - limit)
    duration = float(frames.t[-1] - frames.t[0])
    if duration <= 0.0 or not np.any(over > 0):
        score = 1.0
    else:
        score = max(0.0, 1.0 - float(np.sum(over)) * dt / (MAX_OVERSPEED * duration))
    return MetricResult("speed_limit_compliance", score,
                        {"max_overspeed": float(over.max()), "violating_steps": int(np.sum(over > 0))},
                        series(over))
