"""The comfortable stop trajectory used when a planner fails (exception, NaN, malformed output)."""

from __future__ import annotations

import numpy as np

from luna_core.lanes import Polyline
from luna_core.types import EgoState, Trajectory

COMFORTABLE_DECELERATION = 3.0  # m/s^2, inside nuPlan's comfort bound of 4.05


def stop_trajectory(ego: EgoState, path: Polyline | None = None, deceleration: float = COMFORTABLE_DECELERATION,
                    horizon: float = 8.0, dt: float = 0.1) -> Trajectory:
    """Brake at a constant ``deceleration`` to standstill along ``path`` (e.g. the last valid plan)
    or, without one, straight ahead; poses every ``dt`` for ``horizon`` seconds from ``ego.stamp``."""
    t = np.arange(int(round(horizon / dt)) + 1) * dt
    v0 = max(ego.velocity, 0.0)
    v = np.maximum(v0 - deceleration * t, 0.0)
    t_stop = v0 / deceleration
    s = np.where(t < t_stop, v0 * t - 0.5 * deceleration * t ** 2, v0 * t_stop - 0.5 * deceleration * t_stop ** 2)
    a = np.where(t < t_stop, -deceleration, 0.0)
    if path is not None and path.length > 0.5:
        s0 = float(path.project(np.array([ego.x, ego.y])).s)
        poses = path.interpolate(s0 + s)
        poses[0] = (ego.x, ego.y, ego.heading)
    else:
        poses = np.column_stack([ego.x + s * np.cos(ego.heading), ego.y + s * np.sin(ego.heading),
                                 np.full_like(s, ego.heading)])
    return Trajectory(ego.stamp, t, poses[:, 0], poses[:, 1], poses[:, 2], v, a)
