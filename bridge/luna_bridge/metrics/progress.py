"""ego_progress_along_expert_route and ego_is_making_progress.

nuPlan measures progress along the baselines of the roadblocks the expert drove through. Here the
baseline is the route centreline from the lane of the expert's first pose (``luna_core.lanes``'
route-lane search along the scenario's route roads): parallel lanes of one road have nearly equal
arc length, so projecting the ego onto that one centreline measures the same roadblock progress.
"""

from __future__ import annotations

import numpy as np

from luna_core.lanes import Polyline, lane_map, route_lanes_from_pose

from luna_bridge.metrics.frames import LogFrames
from luna_bridge.metrics.result import MetricResult, series
from luna_bridge.scenario import SimulationLog

PROGRESS_THRESHOLD = 2.0  # m, nuPlan's score_progress_threshold
MIN_PROGRESS_RATIO = 0.2  # ego_is_making_progress


def _expert_rows(log: SimulationLog) -> np.ndarray:
    """Indices of the finite expert poses within the simulated window (the logged history before
    t = 0 is planner input, not expert progress)."""
    e = log.scenario.expert
    ok = np.isfinite(e.x) & np.isfinite(e.y) & np.isfinite(e.heading)
    ok &= (e.t >= -1e-9) & (e.t <= log.scenario.duration + 1e-9)
    return np.flatnonzero(ok)


def expert_centers(log: SimulationLog) -> np.ndarray:
    """(K, 2) box centres of the expert poses in the simulated window."""
    e = log.scenario.expert
    ok = _expert_rows(log)
    d = log.scenario.vehicle.rear_axle_to_center
    return np.column_stack([e.x[ok] + d * np.cos(e.heading[ok]), e.y[ok] + d * np.sin(e.heading[ok])])


def expert_baseline(log: SimulationLog) -> Polyline | None:
    """The route centreline the expert drove along, None if the expert is on no lane."""
    e = log.scenario.expert
    ok = _expert_rows(log)
    if len(ok) == 0:
        return None
    i = ok[0]
    found = route_lanes_from_pose(log.scenario.lane_graph, log.scenario.route,
                                  float(e.x[i]), float(e.y[i]), float(e.heading[i]))
    if found is None:
        return None
    return lane_map(log.scenario.lane_graph).route_centerline(found[0])


def ego_progress_along_expert_route(log: SimulationLog, frames: LogFrames) -> MetricResult:
    """min(1, max(ego, 2 m) / max(expert, 2 m)), or 0 if the ego drove more than 2 m backwards.

    Time series: ego progress per step (m) along the expert's baseline."""
    baseline = expert_baseline(log)
    if baseline is None:  # nuPlan: no route information, the planner gets the score
        return MetricResult("ego_progress_along_expert_route", 1.0,
                            {"expert_progress": 0.0, "ego_progress": 0.0, "ratio": 1.0, "no_route": True})
    ego_s = baseline.project(frames.center).s
    per_step = np.concatenate([[0.0], np.diff(ego_s)])
    ego_progress = float(ego_s[-1] - ego_s[0])
    expert_s = baseline.project(expert_centers(log)).s
    expert_progress = float(expert_s[-1] - expert_s[0]) if len(expert_s) else 0.0
    if ego_progress < -PROGRESS_THRESHOLD:
        ratio = 0.0
    else:
        ratio = min(1.0, max(ego_progress, PROGRESS_THRESHOLD) / max(expert_progress, PROGRESS_THRESHOLD))
    return MetricResult("ego_progress_along_expert_route", ratio,
                        {"expert_progress": expert_progress, "ego_progress": ego_progress, "ratio": ratio},
                        series(per_step))


def ego_is_making_progress(progress: MetricResult) -> MetricResult:
    ok = progress.statistics["ratio"] >= MIN_PROGRESS_RATIO
    return MetricResult("ego_is_making_progress", 1.0 if ok else 0.0, {"ratio": progress.statistics["ratio"]})
