"""Decision-following objective and the final arbitration (LUNA-AD Eq. 19-22, CALMM-Drive Eq. 3-5, 8).

J_dec (CALMM-Drive Eq. 4), for the states x_tau, v_tau of one trajectory over the T future steps of the
scoring horizon (tau = 1..T at dt; the current state is not under the planner's control and is left out):

    J_lane  = max(1 - (1/T) sum_tau |x_tau - (x^r)_tau| / d_max, 0)
    J_speed = max(1 - (1/T) sum_tau 1(v_tau not in V) inf_{v in V} |v_tau - v| dt, 0)
    J_dec   = J_lane * J_speed

(x^r)_tau is the foot point of x_tau on the action's reference centreline (``reference_paths``), so
the lane term is the mean lateral deviation on a d_max scale. With T counted in steps (T = 40 in
CALMM-Drive Table III) the speed term is 1 - dt * (mean speed deviation): zero at a mean deviation of
1 / dt = 10 m/s, the same 10 m/s scale as the language-guided Diffusion-ES speed term.

The speed interval V^k (Eq. 5) from the ego speed v_t at the DECISION's stamp (latched for the
decision's life, ``luna_core.decision``: recomputing it from the current speed at every replan would let
repeated C or A decisions compound speed):
    A: [max(lambda v_t, v_bar), +inf)     C: [gamma v_t, max(lambda v_t, v_bar))     D: [0, gamma v_t)
    S (Stop, our definition; CALMM-Drive has no Stop): V_tau = [0, max(v_t - b_stop (e + tau dt), 0)],
      the speeds at or below a comfortable stop at b_stop (2 m/s^2 by default) begun at the decision
      (e s before this plan), so any trajectory that is stopping at least that firmly follows the
      decision, and one that is still moving at the end of the ramp is penalised by how much faster
      it goes. Stop follows the current lane (lateral K).
With a known speed limit v_lim of the action's lane every bound is capped at v_lim: no decision asks for
more than the limit (A at the limit means holding it). Likewise, with a leader ahead on the action's
path, the bounds are capped per step at the speed IDM (PDM-Closed's policy) drives behind it
(``speed_cap``): no decision demands more than a safe following speed, so braking for a stopping lead
keeps J_dec (a C interval latched at the decision's speed otherwise penalised it, by omega_dec = 5).
Cruise and Decelerate (and Stop, already slower) also get the capped upper bound: they mean "follow",
and a trajectory that keeps its speed towards a slower leader leaves them (the constant-velocity
forecast alone sees no collision with a lead that is only beginning to stop). Accelerate keeps its
open upper bound: it says the ego may close on the leader, which the decider may foresee moving off
(capping it too held the oracle behind leaders that pulled away: -5.5 CLS on synthetic-hard R); only
its lower bound is capped.

J_a = J_dec^omega_dec * J_gen^omega_gen (LUNA-AD Eq. 20); J_gen is the shared PDM-style scorer
(``luna_core.planning.scorer``), evaluated elsewhere and passed in. Without a decision (fallback, and
the "Diffusion-ES without decisions" baseline) the objective is J_gen alone.

Selection (Eq. 22): a* = argmax_{a in C_t} pi(a)^omega_prob * J~_a(X*_a), with
J~_a = J_dec^omega~_dec * J_gen^omega~_gen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from luna_core.types import ACTION_INDEX, candidate_set


@dataclass(frozen=True)
class ObjectiveConfig:
    """All weights of Eq. 19-22 and CALMM-Drive Eq. 4-5 (defaults: the papers' values)."""

    gamma_p: float = 0.1  # candidate-set threshold (Eq. 19)
    omega_dec: float = 5.0  # Eq. 20
    omega_gen: float = 1.0
    omega_prob: float = 1.0  # Eq. 22
    omega_dec_tilde: float = 0.1
    omega_gen_tilde: float = 0.3
    lam: float = 1.25  # lambda: coefficient of the higher reference speed (Eq. 5)
    gamma: float = 0.75  # coefficient of the lower reference speed
    v_bar: float = 2.0  # minimum higher reference speed (m/s)
    d_max: float = 5.0  # maximum accepted lateral deviation (m)
    dt: float = 0.1  # time resolution of the scored states (s)
    horizon_steps: int = 40  # T
    stop_deceleration: float = 2.0  # b_stop of our Stop interval (m/s^2)

    def __post_init__(self) -> None:
        for name in ("omega_dec", "omega_gen", "omega_prob", "omega_dec_tilde", "omega_gen_tilde",
                     "d_max", "dt", "v_bar", "stop_deceleration"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"ObjectiveConfig.{name} must be finite and >= 0, got {value}")
        if self.d_max <= 0.0 or self.dt <= 0.0:
            raise ValueError(f"ObjectiveConfig.d_max and dt must be positive, got {self.d_max}, {self.dt}")
        if not 0.0 < self.gamma < 1.0 < self.lam:
            raise ValueError(f"ObjectiveConfig needs 0 < gamma < 1 < lambda, got gamma={self.gamma}, "
                             f"lambda={self.lam}")
        if not 0.0 <= self.gamma_p <= 1.0:
            raise ValueError(f"ObjectiveConfig.gamma_p must be in [0, 1], got {self.gamma_p}")
        if self.horizon_steps < 1:
            raise ValueError(f"ObjectiveConfig.horizon_steps must be >= 1, got {self.horizon_steps}")


def _check_code(action: str) -> None:
    if action not in ACTION_INDEX:
        raise ValueError(f"unknown action code {action!r}")


def speed_interval(action: str, v0: float, config: ObjectiveConfig = ObjectiveConfig(), speed_limit: float = 0.0,
                   elapsed: float = 0.0, speed_cap: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """V^k (Eq. 5, plus our Stop) as per-step bounds (lo, hi), each (T,) for tau = 1..T.

    ``v0``: the ego speed (m/s) at the decision's stamp; ``speed_limit`` (m/s, 0 = unknown) caps every
    bound; ``elapsed``: s from the decision's stamp to this plan (where Stop's ramp has got to);
    ``speed_cap`` (T,) m/s (inf where nothing leads) caps both bounds per step, the upper one except for
    Accelerate (see the module docstring)."""
    lo, hi = _interval(action, v0, config, speed_limit, elapsed)
    if speed_cap is not None:
        cap = np.asarray(speed_cap, dtype=np.float64)
        lo = np.minimum(lo, cap)
        if action[0] != "A":
            hi = np.minimum(hi, cap)
    return lo, hi


def _interval(action: str, v0: float, config: ObjectiveConfig, speed_limit: float,
              elapsed: float) -> tuple[np.ndarray, np.ndarray]:
    _check_code(action)
    v0 = max(float(v0), 0.0)  # reversing counts as standing still for the interval
    steps = config.horizon_steps
    high = max(config.lam * v0, config.v_bar)
    lon = action[0]
    if lon == "A":
        lo, hi = high, math.inf
    elif lon == "C":
        lo, hi = config.gamma * v0, high
    elif lon == "D":
        lo, hi = 0.0, config.gamma * v0
    else:  # "S"
        tau = max(float(elapsed), 0.0) + np.arange(1, steps + 1) * config.dt
        return np.zeros(steps), np.maximum(v0 - config.stop_deceleration * tau, 0.0)
    if speed_limit > 0.0:
        lo, hi = min(lo, speed_limit), min(hi, speed_limit)
    return np.full(steps, lo), np.full(steps, hi)


def lane_following(lateral_offset: np.ndarray, config: ObjectiveConfig = ObjectiveConfig()) -> np.ndarray:
    """J_lane (B,) from lateral offsets (B, T) to the reference centreline."""
    d = np.abs(np.asarray(lateral_offset, dtype=np.float64))
    return np.maximum(1.0 - d.mean(axis=-1) / config.d_max, 0.0)


def speed_following(speed: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                    config: ObjectiveConfig = ObjectiveConfig()) -> np.ndarray:
    """J_speed (B,) from speeds (B, T) and the interval bounds (T,).

    The distance to a half-open interval is the distance to its closure (inf over V of |v_tau - v|).
    """
    v = np.asarray(speed, dtype=np.float64)
    deviation = np.maximum(lo - v, 0.0) + np.maximum(v - hi, 0.0)
    return np.maximum(1.0 - deviation.mean(axis=-1) * config.dt, 0.0)


def decision_following(action: str, lateral_offset: np.ndarray, speed: np.ndarray, v0: float,
                       config: ObjectiveConfig = ObjectiveConfig(), speed_limit: float = 0.0,
                       elapsed: float = 0.0, speed_cap: np.ndarray | None = None) -> np.ndarray:
    """J_dec (B,) of CALMM-Drive Eq. 4 for states (B, T) against ``action``'s lane and speed targets.

    ``lateral_offset`` is measured from the action's own reference path (K for Stop); ``v0``,
    ``speed_limit`` and ``elapsed`` define the speed interval (``speed_interval``).
    """
    lo, hi = speed_interval(action, v0, config, speed_limit, elapsed, speed_cap)
    lateral_offset = np.asarray(lateral_offset, dtype=np.float64)
    speed = np.asarray(speed, dtype=np.float64)
    if lateral_offset.shape[-1] != config.horizon_steps or speed.shape[-1] != config.horizon_steps:
        raise ValueError(f"decision_following expects {config.horizon_steps} future steps, got offsets "
                         f"{lateral_offset.shape} and speeds {speed.shape}")
    return lane_following(lateral_offset, config) * speed_following(speed, lo, hi, config)


def _power(base: np.ndarray, exponent: float) -> np.ndarray:
    # 0 ** 0 = 1 keeps a zero-weighted term neutral even where it is zero.
    return np.power(np.clip(np.asarray(base, dtype=np.float64), 0.0, 1.0), exponent)


def action_objective(j_dec: np.ndarray | None, j_gen: np.ndarray,
                     config: ObjectiveConfig = ObjectiveConfig()) -> np.ndarray:
    """J_a = J_dec^omega_dec * J_gen^omega_gen (Eq. 20); J_gen^omega_gen alone when ``j_dec`` is None."""
    score = _power(j_gen, config.omega_gen)
    return score if j_dec is None else _power(j_dec, config.omega_dec) * score


def selection_score(probability: float | np.ndarray, j_dec: float | np.ndarray, j_gen: float | np.ndarray,
                    config: ObjectiveConfig = ObjectiveConfig()) -> np.ndarray:
    """pi(a)^omega_prob * J_dec^omega~_dec * J_gen^omega~_gen (the bracket of Eq. 22a)."""
    return (_power(probability, config.omega_prob) * _power(j_dec, config.omega_dec_tilde)
            * _power(j_gen, config.omega_gen_tilde))


def candidate_actions(probabilities: Sequence[float] | np.ndarray,
                      config: ObjectiveConfig = ObjectiveConfig()) -> list[str]:
    """C_t of Eq. 19 at ``config.gamma_p``, most likely first (never empty)."""
    return candidate_set(probabilities, config.gamma_p)


def select(actions: Sequence[str], probabilities: Sequence[float], j_dec: Sequence[float],
           j_gen: Sequence[float], config: ObjectiveConfig = ObjectiveConfig(),
           admissible: Sequence[bool] | None = None) -> tuple[int, np.ndarray]:
    """Eq. 22: the index of a* among ``actions`` (each with its best trajectory's J_dec, J_gen) and
    every candidate's Eq. 22 score. Ties go to the earlier (more likely) action. With ``admissible``,
    a* is the best of the admissible candidates when there is one (the safety-first arbitration of
    ``DecisionGuidedConfig.safety_first``); the scores are every candidate's all the same."""
    if not actions:
        raise ValueError("Eq. 22 selection needs at least one candidate action")
    if not len(actions) == len(probabilities) == len(j_dec) == len(j_gen):
        raise ValueError(f"select: {len(actions)} actions but {len(probabilities)} probabilities, "
                         f"{len(j_dec)} J_dec and {len(j_gen)} J_gen values")
    scores = selection_score(np.asarray(probabilities), np.asarray(j_dec), np.asarray(j_gen), config)
    if admissible is not None:
        allowed = np.asarray(admissible, dtype=bool)
        if allowed.shape != scores.shape:
            raise ValueError(f"select: {len(actions)} actions but {allowed.size} admissibility flags")
        if allowed.any():
            return int(np.argmax(np.where(allowed, scores, -np.inf))), scores
    return int(np.argmax(scores)), scores
