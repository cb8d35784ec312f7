"""The stack's one way to build a stop: constant deceleration to standstill, joining the path's centreline.

* ``stop_along`` builds every stop trajectory: along a given path (a lane centreline, the last valid
  plan) or, without one, straight ahead. The decision-guided planner's "Stop" warm starts, its
  off-map stop and the simulator's stop after a planner failure call it.
* ``comfortable_stop`` is what the stack drives when planning fails or its inputs are unusable (the
  planner node): it looks up the route centreline from the ego's lane (off the map or without a
  route: none) and stops along it at the planner's 0.1 s resolution over 8 s.
"""

from __future__ import annotations

import numpy as np

from luna_core.lanes import Polyline
from luna_core.types import EgoState, LaneGraph, Route, Trajectory

COMFORTABLE_DECELERATION = 3.0  # m/s^2, inside nuPlan's comfort bound of 4.05
LATERAL_BLEND_DISTANCE = 10.0  # m of travel over which a stop joins the centreline from the ego's offset


def stop_along(ego: EgoState, path: Polyline | None, deceleration: float = COMFORTABLE_DECELERATION,
               horizon: float = 8.0, dt: float = 0.1) -> Trajectory:
    """Brake at ``deceleration`` (m/s^2) to standstill along ``path`` from the ego's foot point, or
    straight ahead without a path; poses every ``dt`` for ``horizon`` seconds from ``ego.stamp``."""
    t = np.arange(int(round(horizon / dt)) + 1) * dt
    v0 = max(ego.velocity, 0.0)
    t_stop = v0 / deceleration if deceleration > 0 else 0.0
    tc = np.minimum(t, t_stop)
    s = v0 * tc - 0.5 * deceleration * tc ** 2
    v = np.maximum(v0 - deceleration * t, 0.0)
    a = np.where(t < t_stop, -deceleration, 0.0)
    if path is not None and path.length > 0.5:
        foot_s = float(path.project(np.array([ego.x, ego.y])).s)
        poses = path.interpolate(foot_s + s)
        # Join the centreline gradually: a stop cannot move sideways, and a slow or standing ego
        # asked to reach a foot point beside it steers hard at full lock (seen as loops).
        offset = np.array([ego.x, ego.y]) - path.interpolate(np.array([foot_s]))[0, :2]
        fade = np.clip(1.0 - s / LATERAL_BLEND_DISTANCE, 0.0, 1.0)
        poses[:, :2] += fade[:, None] * offset
        poses[0] = (ego.x, ego.y, ego.heading)
    else:
        poses = np.column_stack([ego.x + s * np.cos(ego.heading), ego.y + s * np.sin(ego.heading),
                                 np.full_like(s, ego.heading)])
    return Trajectory(ego.stamp, t, poses[:, 0], poses[:, 1], poses[:, 2], v, a)


def comfortable_stop(ego: EgoState, graph: LaneGraph | None, route: Route | None,
                     deceleration: float = COMFORTABLE_DECELERATION) -> Trajectory:
    """A stop along the route centreline when the map allows one, else straight ahead."""
    path = None
    if graph is not None and route is not None and graph.lanes and ego.is_finite():
        from luna_core.planning.reference_paths import OffMapError, reference_paths
        try:
            path = reference_paths(graph, route, ego, ahead=max(ego.velocity, 0.0) ** 2 / deceleration + 20.0)[
                "K"].centerline
        except OffMapError:
            path = None
    return stop_along(ego, path, deceleration)
