"""ego_is_comfortable: every comfort quantity of the whole run within nuPlan's bounds.

Quantities are Savitzky-Golay estimates (window 15 samples, order 2) as in nuPlan's state
extractors. The longitudinal acceleration is the derivative of the longitudinal velocity (for the
simulated bicycle this equals its acceleration state; it also works for logs that only carry poses
and speeds); the lateral acceleration is speed x yaw rate.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import savgol_filter

from luna_bridge.metrics.frames import LogFrames
from luna_bridge.metrics.result import MetricResult, series

MIN_LON_ACCEL = -4.05  # m/s^2
MAX_LON_ACCEL = 2.40
MAX_ABS_LAT_ACCEL = 4.89
MAX_ABS_YAW_ACCEL = 1.93  # rad/s^2
MAX_ABS_YAW_RATE = 0.95  # rad/s
MAX_ABS_LON_JERK = 4.13  # m/s^3
MAX_ABS_JERK = 8.37
SAVGOL_WINDOW = 15
SAVGOL_ORDER = 2


def _derivative(y: np.ndarray, dt: float, order: int) -> np.ndarray:
    window = min(SAVGOL_WINDOW, len(y) if len(y) % 2 else len(y) - 1)
    return savgol_filter(y, window, SAVGOL_ORDER, deriv=order, delta=dt)


def comfort_quantities(velocity: np.ndarray, heading: np.ndarray, dt: float) -> dict[str, np.ndarray]:
    """Per-step lon/lat acceleration, jerks, yaw rate and yaw acceleration of an ego trajectory."""
    h = np.unwrap(heading)
    lon_accel = _derivative(velocity, dt, 1)
    yaw_rate = _derivative(h, dt, 1)
    yaw_accel = _derivative(h, dt, 2)
    lat_accel = np.abs(velocity) * yaw_rate
    lon_jerk = _derivative(lon_accel, dt, 1)
    jerk = _derivative(np.hypot(lon_accel, lat_accel), dt, 1)
    return {"lon_acceleration": lon_accel, "lat_acceleration": lat_accel, "yaw_rate": yaw_rate,
            "yaw_acceleration": yaw_accel, "lon_jerk": lon_jerk, "jerk": jerk}


def within_comfort_bounds(q: dict[str, np.ndarray]) -> dict[str, bool]:
    return {"lon_acceleration": bool(np.all((q["lon_acceleration"] >= MIN_LON_ACCEL)
                                            & (q["lon_acceleration"] <= MAX_LON_ACCEL))),
            "lat_acceleration": bool(np.all(np.abs(q["lat_acceleration"]) <= MAX_ABS_LAT_ACCEL)),
            "yaw_rate": bool(np.all(np.abs(q["yaw_rate"]) <= MAX_ABS_YAW_RATE)),
            "yaw_acceleration": bool(np.all(np.abs(q["yaw_acceleration"]) <= MAX_ABS_YAW_ACCEL)),
            "lon_jerk": bool(np.all(np.abs(q["lon_jerk"]) <= MAX_ABS_LON_JERK)),
            "jerk": bool(np.all(np.abs(q["jerk"]) <= MAX_ABS_JERK))}


def ego_is_comfortable(frames: LogFrames, velocity: np.ndarray, dt: float) -> MetricResult:
    """1 if all six quantities stay within bounds over the run, else 0. Time series: longitudinal
    acceleration per step (the quantity most often violated)."""
    if frames.num_frames < SAVGOL_ORDER + 2:
        return MetricResult("ego_is_comfortable", 1.0, {"too_short": True})
    q = comfort_quantities(velocity, frames.heading, dt)
    ok = within_comfort_bounds(q)
    stats: dict[str, object] = {f"{k}_within_bound": v for k, v in ok.items()}
    stats.update({f"max_abs_{k}": float(np.max(np.abs(v))) for k, v in q.items()})
    return MetricResult("ego_is_comfortable", 1.0 if all(ok.values()) else 0.0, stats,
                        series(q["lon_acceleration"]))
