"""ego_is_comfortable: every comfort quantity of the whole run within nuPlan's bounds.

The quantities and bounds are the planner scorer's (``luna_core.planning.scorer``): Savitzky-Golay
estimates (window 15, order 2) as in nuPlan's state extractors; the longitudinal acceleration is the
derivative of the longitudinal velocity (for the simulated bicycle this is its acceleration state;
it also works for logs that carry only poses and speeds), the lateral acceleration speed x yaw rate.
"""

from __future__ import annotations

import numpy as np

from luna_core.planning.scorer import SAVGOL_ORDER, comfort_quantities, comfort_within_bounds

from luna_bridge.metrics.frames import LogFrames
from luna_bridge.metrics.result import MetricResult, series


def ego_is_comfortable(frames: LogFrames, velocity: np.ndarray, dt: float) -> MetricResult:
    """1 if all six quantities stay within bounds over the run, else 0. Time series: longitudinal
    acceleration per step (the quantity most often violated)."""
    if frames.num_frames < SAVGOL_ORDER + 2:
        return MetricResult("ego_is_comfortable", 1.0, {"too_short": True})
    q = comfort_quantities(np.asarray(velocity, dtype=np.float64), frames.heading, dt)
    ok = {k: bool(v) for k, v in comfort_within_bounds(q).items()}
    stats: dict[str, object] = {f"{k}_within_bound": v for k, v in ok.items()}
    stats.update({f"max_abs_{k}": float(np.max(np.abs(v))) for k, v in q.items()})
    return MetricResult("ego_is_comfortable", 1.0 if all(ok.values()) else 0.0, stats,
                        series(q["lon_acceleration"]))
