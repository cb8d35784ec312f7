"""Intelligent Driver Model (Treiber et al.), vectorised, with parameters as data.

a = a_max * (1 - (v / v0)^delta - (s* / s)^2),  s* = s0 + v T + v (v - v_lead) / (2 sqrt(a_max b)),
with the actual gap s clamped below at s0 (as nuPlan does, to avoid a division by zero) and the
result clipped to [-b, a_max]. No leader = an infinite gap. Used by the simulator's reactive agents
(``NUPLAN_AGENT``) and by IDM proposals (``pdm_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class IDMParameters:
    target_velocity: float  # v0 (m/s)
    min_gap: float  # s0 (m)
    headway: float  # T (s)
    accel_max: float  # a_max (m/s^2)
    decel_max: float  # b (m/s^2), positive
    exponent: float = 4.0  # delta

    def with_target_velocity(self, target_velocity: float) -> "IDMParameters":
        return replace(self, target_velocity=target_velocity)


#: nuPlan's reactive IDM agents.
NUPLAN_AGENT = IDMParameters(target_velocity=10.0, min_gap=1.0, headway=1.5, accel_max=1.0, decel_max=2.0)


def pdm_policy(target_velocity: float) -> IDMParameters:
    """One of PDM-Closed's proposal policies (target = a fraction of the speed limit)."""
    return IDMParameters(target_velocity=target_velocity, min_gap=1.0, headway=1.5, accel_max=1.5,
                         decel_max=3.0, exponent=10.0)


def idm_acceleration(velocity: np.ndarray | float, gap: np.ndarray | float,
                     lead_velocity: np.ndarray | float, params: IDMParameters,
                     target_velocity: np.ndarray | float | None = None) -> np.ndarray:
    """IDM acceleration, broadcast over arrays.

    ``gap``: bumper-to-bumper distance to the leader (m), ``np.inf`` without one;
    ``target_velocity`` overrides ``params.target_velocity`` per element (e.g. per-lane limits).
    """
    v = np.asarray(velocity, dtype=np.float64)
    s = np.maximum(np.asarray(gap, dtype=np.float64), params.min_gap)
    v_lead = np.asarray(lead_velocity, dtype=np.float64)
    v0 = np.maximum(np.asarray(params.target_velocity if target_velocity is None else target_velocity,
                               dtype=np.float64), 1e-3)
    s_star = params.min_gap + v * params.headway + v * (v - v_lead) / (
        2.0 * np.sqrt(params.accel_max * params.decel_max))
    free = (np.maximum(v, 0.0) / v0) ** params.exponent
    with np.errstate(invalid="ignore"):
        interaction = np.where(np.isinf(s), 0.0, (s_star / s) ** 2)
    accel = params.accel_max * (1.0 - free - interaction)
    return np.clip(accel, -params.decel_max, params.accel_max)


def idm_step(progress: np.ndarray, velocity: np.ndarray, gap: np.ndarray, lead_velocity: np.ndarray,
             params: IDMParameters, dt: float = 0.1,
             target_velocity: np.ndarray | float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Forward-Euler step along a path: returns (progress, velocity), velocity never below 0."""
    accel = idm_acceleration(velocity, gap, lead_velocity, params, target_velocity)
    v = np.asarray(velocity, dtype=np.float64)
    return np.asarray(progress, dtype=np.float64) + v * dt, np.maximum(v + accel * dt, 0.0)


def idm_profile(velocity: float, gap: float, lead_velocity: float, params: IDMParameters,
                steps: int, dt: float = 0.1, lead_accel: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Roll IDM forward ``steps`` times behind a leader moving at constant acceleration (or none:
    ``gap = inf``). Returns progress and velocity arrays (steps + 1,) starting at 0 and ``velocity``."""
    s = np.zeros(steps + 1)
    v = np.zeros(steps + 1)
    v[0] = velocity
    lead_s, lead_v = gap, lead_velocity
    for k in range(steps):
        g = lead_s - s[k] if np.isfinite(lead_s) else np.inf
        s[k + 1], v[k + 1] = (float(a) for a in idm_step(s[k], v[k], g, lead_v, params, dt))
        if np.isfinite(lead_s):
            lead_s += lead_v * dt
            lead_v = max(lead_v + lead_accel * dt, 0.0)
    return s, v
