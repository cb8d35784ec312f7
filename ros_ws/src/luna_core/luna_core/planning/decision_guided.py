"""The decision-guided planner of LUNA-AD (Sec. III-D, Eq. 19-22) on Diffusion-ES.

Each call (``plan`` / ``plan_detailed``):

1. the cycle's ``PlanningContext`` (``planning.context``; built here from the input, or handed in when
   several planners plan the same cycle): the input sanitised (the ego state is the latest finite one
   of the history; objects follow ``usable_objects``, what was wrong in the reasons), the local lane
   map, the constant-velocity forecast and the scoring context;
2. its reference paths per lateral decision (``reference_paths``); off the map -> comfortable stop;
3. the decision in force (``luna_core.decision``): validated once, with the candidate set C_t as
   published (Eq. 19) and the speed intervals V^k latched from the ego speed at the decision's stamp;
   a lane change without a lane on its side gives its probability to keeping the lane at its speed
   (``blocked_lateral_to_keep``; or is dropped). No decision, a stale one (older than
   ``decision_timeout``, 2 T_d) or an invalid one -> the fallback objective: one search under J_gen
   alone, warm-started by PDM-Closed's proposals along the current lane (exactly the "Diffusion-ES
   without decisions" baseline, which is this class with ``use_decisions=False``);
4. one batched Diffusion-ES over all candidate actions, each under J_a = J_dec^omega_dec *
   J_gen^omega_gen (Eq. 20-21), warm-started by IDM proposals along the action's reference lane at
   target speeds inside its speed interval (Stop: braking profiles), blended smoothly from the ego's
   current lateral position, plus the previous cycle's plan (consistency);
5. Eq. 22: a* = argmax pi(a)^omega_prob * J~_a(X*_a), safety first (``safety_first``): when some
   candidate's X*_a keeps nuPlan's time-to-collision bound, a* is the best of those, so a likely
   manoeuvre whose best trajectory closes within 0.9 s of a car (a lane change into a gap too short)
   does not win on its probability (J_gen^0.3 alone leaves it 0.89 of a safe one's score); with
   hysteresis: while the same decision is in force, another action must beat the previous cycle's a*
   by ``switch_margin`` (no flipping between manoeuvres on near-ties);
6. if every candidate's best has J_gen = 0 (at-fault collision, off the drivable area or against
   traffic), PDM-Closed's fallback: the least-bad trajectory among the searched members and PDM-Closed's
   own proposals (the best weighted score among those without an at-fault collision; if everything
   collides, PDM-Closed's own pick), and an emergency brake only when that one runs into an at-fault
   collision within ``emergency_time`` at low speed.

J_gen is the shared PDM-style scorer (``planning.scorer``, nuPlan's CLS weights: the speed limit counts
4) on LQR + bicycle rollouts over 40 steps of 0.1 s. Progress is normalised as PDM-Closed normalises it,
by the best feasible progress of the proposals (the warm starts, scored first) and fixed for the call
(``PlannerObjective``). The published trajectory is the chosen member for
the scored 4 s and an IDM continuation along the action's lane behind the forecast objects for the rest
of the 8 s, so no part of it drives through an object the scorer never saw.

The time budget is handled by ``diffusion_es`` (anytime): past the budget the best found so far is
published and the result says which stage was cut. ``deterministic=True`` drops the budget (fixed
stage sizes: the population, warm starts and iterations of ``search``) for reproducible batch runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from luna_core.assets import resolve
from luna_core.control import StateIndex, simulate_proposals, state_from_ego
from luna_core.decision import (DEFAULT_DECISION_PERIOD, DecisionInForce, DecisionTiming, DecisionTimingError,
                                 DecisionTracker)
from luna_core.geometry import AUTOCASTS, default_device, is_device_name
from luna_core.idm import pdm_policy
from luna_core.planning.diffusion import (TrajectoryDiffusionPrior, history_from_states, to_ego_frame,
                                          to_map_frame)
from luna_core.planning.diffusion_es import (DiffusionESConfig, ESResult, Evaluation, StageTimer, densify,
                                             diffusion_es)
from luna_core.planning.fallback import stop_along
from luna_core.planning.context import PlanningContext, build_planning_context
from luna_core.planning.context import PlannerInputError  # noqa: F401 (raised by plan_detailed; imported from here)
from luna_core.planning.objectives import (ObjectiveConfig, action_objective, decision_following, select,
                                           speed_interval)
from luna_core.planning.pdm_closed import emergency_brake_trajectory
from luna_core.planning.proposals import following_speed_cap, idm_proposals, idm_rollout
from luna_core.planning.reference_paths import ReferencePath
from luna_core.planning.scorer import (CLS_WEIGHTS, PROGRESS_EPSILON, ObjectBoxes, ProposalScores, ScorerWeights,
                                       ScoringContext, score_proposals)
from luna_core.types import EgoState, PlannerInput, Trajectory, VehicleParameters, wrap_angle


# How each cycle ended, as reported in PlanResult.mode (the planner node's diagnostics, eval results).
MODE_DECISION = "decision"  # Eq. 19-22 with a valid, fresh decision
MODE_NO_DECISION = "no_decision"  # configured without decisions (the Diffusion-ES baseline)
MODE_FALLBACK = "fallback"  # decision missing, stale or invalid: J_gen only
MODE_LEAST_BAD = "least_bad"  # nothing feasible: PDM-Closed's least-bad scored trajectory
MODE_EMERGENCY = "emergency_brake"  # the least-bad one runs into an at-fault collision soon: brake
MODE_STOP = "comfortable_stop"  # off the map: no reference path to plan along
PLAN_MODES = (MODE_DECISION, MODE_NO_DECISION, MODE_FALLBACK, MODE_LEAST_BAD, MODE_EMERGENCY, MODE_STOP)


@dataclass(frozen=True)
class DecisionGuidedConfig:
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    search: DiffusionESConfig = field(default_factory=DiffusionESConfig)
    scorer_weights: ScorerWeights = CLS_WEIGHTS
    model_path: str = ""  # diffusion prior folder (config.json + model.safetensors); "" = the bundled default
    # Torch device of the denoiser: "cpu", "cuda", "cuda:<n>" or "auto" (CUDA when present). The search's
    # noise is drawn on the CPU whatever the device, so devices differ only by float rounding.
    device: str = "cpu"
    # The denoiser's matrix products under torch autocast ("bfloat16": a ~1.6-1.9x faster cycle on a CPU with
    # AVX512-BF16 or AMX); it changes the samples, so it is off unless chosen (docs/benchmarks.md).
    autocast: str = "none"
    time_budget: float = 0.4  # s per call; the planner node replans every 0.5 s
    # Deterministic mode for batch evaluation: no wall-clock budget, every stage runs at its full
    # configured size, so the result does not depend on the machine's load (same input, same output).
    deterministic: bool = False
    decision_period: float = DEFAULT_DECISION_PERIOD  # s, T_d of the decisions this planner follows
    decision_timeout: float = 0.0  # s; 0 = 2 T_d (``luna_core.decision.DecisionTiming``)
    use_decisions: bool = True  # False: the "Diffusion-ES without decisions" baseline
    output_horizon: float = 8.0  # s of the published trajectory
    comfortable_deceleration: float = 2.0  # m/s^2 of the comfortable stop
    # Warm starts: IDM target speeds per action (spread over its interval) x lateral blend times.
    warm_speeds: int = 5
    keep_blend_times: tuple[float, ...] = (1.5, 2.5, 3.5)  # s to reach the lane centre (K, Stop)
    change_blend_times: tuple[float, ...] = (3.0, 4.5, 6.0)  # s to reach the target lane (L, R)
    fallback_offsets: tuple[float, ...] = (0.0, -1.0, 1.0)  # PDM-Closed's proposal offsets (m), centreline first
    fallback_speed_fractions: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)  # of the speed limit
    # Eq. 22 hysteresis: while one decision is in force, another action replaces the previous cycle's
    # a* only if its Eq. 22 score is higher by this fraction.
    switch_margin: float = 0.1
    # Safety-first arbitration (our addition to Eq. 22): a* only among the candidates whose X*_a keeps the
    # TTC bound, when any does. False: the paper's Eq. 22 over every candidate.
    safety_first: bool = True
    # A candidate lane change the map does not allow here (no lane on that side) gives its probability to
    # the keep-lane action of its speed mode (CL -> CK), so its speed intent still counts; False drops it
    # and Eq. 22 weighs the rest as published.
    blocked_lateral_to_keep: bool = True
    # PDM-Closed's emergency brake (``pdm_closed``): the least-bad trajectory collides at fault within
    # this time (s) while the ego is at most this fast (m/s).
    emergency_time: float = 2.0
    emergency_max_speed: float = 5.0
    tail_blend_time: float = 2.0  # s over which the IDM tail joins its lane centre
    # Flat overrides of the two most-tuned nested settings (the planner node's parameters):
    # search.population and objective.gamma_p; None keeps the nested value.
    population: int | None = None
    gamma_p: float | None = None

    def __post_init__(self) -> None:
        if self.population is not None:
            object.__setattr__(self, "search", replace(self.search, population=int(self.population)))
        if self.gamma_p is not None:
            object.__setattr__(self, "objective", replace(self.objective, gamma_p=float(self.gamma_p)))
        try:
            self.timing  # noqa: B018 - checks decision_period and decision_timeout
        except DecisionTimingError as exc:
            raise ValueError(f"DecisionGuidedConfig: {exc}") from None
        if not (self.time_budget > 0.0 and self.output_horizon > 0.0
                and self.comfortable_deceleration > 0.0 and self.tail_blend_time > 0.0):
            raise ValueError("DecisionGuidedConfig: time_budget, output_horizon, "
                             "comfortable_deceleration and tail_blend_time must be positive")
        if not is_device_name(self.device):
            raise ValueError(f"DecisionGuidedConfig: device must be cpu, cuda, cuda:<n> or auto, got {self.device!r}")
        if self.autocast not in AUTOCASTS:
            raise ValueError(f"DecisionGuidedConfig: autocast must be one of {', '.join(AUTOCASTS)}, got {self.autocast!r}")
        if not (self.switch_margin >= 0.0 and self.emergency_time >= 0.0 and self.emergency_max_speed >= 0.0):
            raise ValueError("DecisionGuidedConfig: switch_margin, emergency_time and emergency_max_speed "
                             "must be >= 0")

    @property
    def timing(self) -> DecisionTiming:
        """T_d and the timeout of the decisions this planner follows."""
        return DecisionTiming(self.decision_period, self.decision_timeout)


@dataclass
class CandidateResult:
    """One searched objective: a candidate action (or "" for the J_gen-only search) and its X*_a."""

    action: str
    probability: float
    trajectory: Trajectory | None  # None if the search found nothing for it
    j_dec: float
    j_gen: float
    j_a: float  # Eq. 20 value of X*_a
    selection_score: float  # Eq. 22 bracket (J_gen for the J_gen-only search)
    origin: str  # which Diffusion-ES stage found X*_a
    ttc: float = 0.0  # J_gen's TTC term of X*_a: 1 if it keeps the time-to-collision bound, else 0


@dataclass
class PlanResult:
    trajectory: Trajectory
    action: str | None  # a* (None in the J_gen-only modes and when falling back)
    mode: str
    reasons: list[str]
    candidates: list[CandidateResult]
    elapsed: float  # s spent in the call
    budget: float
    budget_cut: str  # non-empty if the search stopped early because of the budget
    stages_done: list[str]
    decision_stamp: float | None = None
    flipped: bool = False  # a* changed from the previous cycle while the same decision was in force
    # safety first changed a*: the paper's Eq. 22 (with the same hysteresis) would have picked another candidate
    safety_gated: bool = False

    @property
    def degraded(self) -> bool:
        return self.mode in (MODE_FALLBACK, MODE_LEAST_BAD, MODE_EMERGENCY, MODE_STOP)

    @property
    def degraded_reason(self) -> str:
        """Everything that was not nominal in this cycle, for diagnostics ("" when nominal)."""
        return "; ".join(([f"mode {self.mode}"] if self.degraded else []) + self.reasons)


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


PROGRESS_FLOOR_ACCELERATION = 1.0  # m/s^2 of the ideal start the progress floor is half of
PREVIOUS_PLAN_TOLERANCE = 1.0  # m: the last plan is kept as a warm start only if the ego is this close to it
MAKING_PROGRESS_RATIO = 0.2  # nuPlan's ego_is_making_progress threshold (share of the reference progress)


def progress_floor(speed: float, speed_limit: float, horizon: float) -> float:
    """The progress reference (m) when no feasible member moves: half the distance covered over
    ``horizon`` seconds when accelerating gently (1 m/s^2) from ``speed`` up to ``speed_limit`` (no
    limit known: 15 m/s)."""
    v0 = max(speed, 0.0)
    v_max = max(speed_limit if speed_limit > 0.0 else 15.0, v0)
    t_acc = min(horizon, (v_max - v0) / PROGRESS_FLOOR_ACCELERATION)
    ideal = v0 * t_acc + 0.5 * PROGRESS_FLOOR_ACCELERATION * t_acc ** 2 + v_max * (horizon - t_acc)
    return 0.5 * ideal


@dataclass
class ScoredBatch(Evaluation):
    """An ``Evaluation`` with the raw scorer terms of its tracked members (for the least-bad fallback)."""

    poses: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3)))  # (M, N, 3) ego-frame waypoints
    scores: ProposalScores | None = None  # of the tracked members (rows ``tracked``)
    tracked: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    ttc: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (M,) J_gen's TTC term; 0 where not tracked


class PlannerObjective:
    """The ``PopulationObjective`` of one planning call: tracking + J_gen shared, J_dec per group.

    Progress is normalised as PDM-Closed normalises it, by the best progress of its proposal set
    among the feasible ones (if none is feasible, by the best of all): here the warm starts, the first
    batch every search scores (IDM proposals along each candidate's lane at speeds inside its interval,
    PDM-Closed's own proposals in the J_gen-only search, and the last plan). The reference is fixed
    then, so members scored in later Diffusion-ES batches stay comparable, and a member making more
    progress than the best proposal gains nothing by it (a sampled trajectory closing in on a braking
    lead is not rewarded over keeping the IDM gap). When no proposal is feasible but some collide with
    nothing (they all leave the drivable area or drive against traffic within the horizon), the
    reference is the best of those, and a member must also make 20 % of it to count as feasible
    (nuPlan's ego_is_making_progress threshold): crawling until the 4 s horizon no longer reaches an
    unavoidable problem is not a way through it. Every scored batch is kept for the least-bad fallback.
    """

    def __init__(self, ego: EgoState, seed: np.ndarray, waypoint_dt: float, ctx: ScoringContext,
                 weights: ScorerWeights, groups: list[str], paths: list[ReferencePath],
                 config: ObjectiveConfig, decision: DecisionInForce | None = None) -> None:
        self.ego = ego
        self.origin = (ego.x, ego.y, ego.heading)
        self.seed = seed
        self.waypoint_dt = waypoint_dt
        self.ctx = ctx
        self.weights = weights
        self.groups = groups  # action codes; "" = J_gen only
        self.paths = paths  # each group's reference path
        self.config = config
        self.state0 = state_from_ego(ego)
        # V^k from the speed at the decision's stamp, as far into Stop's ramp as the decision's age.
        self.reference_speed = decision.reference_speed if decision is not None else ego.velocity
        self.elapsed = max(ego.stamp - decision.stamp, 0.0) if decision is not None else 0.0
        self.progress_floor = progress_floor(ego.velocity, ctx.speed_limit, config.horizon_steps * config.dt)
        self.progress_reference: float | None = None  # m, set by the first batch (the warm starts)
        self.min_progress = -math.inf  # m a member must make to be feasible (only when no proposal is)
        self.batches: list[ScoredBatch] = []
        self._speed_caps: dict[int, np.ndarray] = {}

    def map_poses(self, poses: np.ndarray, steps: int) -> np.ndarray:
        dense = densify(poses, self.seed, self.waypoint_dt, self.config.dt, steps)
        return to_map_frame(dense, self.origin)

    def evaluate(self, poses: np.ndarray) -> Evaluation:
        steps = self.config.horizon_steps
        m = len(poses)
        ref = self.map_poses(poses, steps)
        ok = np.all(np.isfinite(ref), axis=(1, 2))
        states = np.zeros((m, steps + 1, len(StateIndex)))
        states[:] = self.state0
        batch = ScoredBatch(states, np.zeros(m), np.asarray(poses, dtype=np.float64), ttc=np.zeros(m))
        if ok.any():
            sim = simulate_proposals(self.state0, ref[ok], self.ctx.vehicle)
            good = np.all(np.isfinite(sim), axis=(1, 2))
            idx = np.flatnonzero(ok)[good]
            states[idx] = sim[good]
            if len(idx):
                batch.tracked = idx
                batch.scores = score_proposals(states[idx], self.ctx, self.weights)
                if self.progress_reference is None:
                    self._set_reference(batch.scores)
                batch.j_gen[idx] = self.j_gen(batch.scores)
                batch.ttc[idx] = batch.scores.ttc
        self.batches.append(batch)
        return batch

    def _set_reference(self, proposals: ProposalScores) -> None:
        feasible = proposals.multiplicative > 0
        # No proposal feasible although some run into nothing: they all leave the drivable area (or
        # drive against the traffic) within the horizon, which a slower member only postpones.
        unavoidable = not feasible.any() and bool((proposals.no_at_fault_collision >= 1.0).any())
        pool = feasible if feasible.any() else proposals.no_at_fault_collision >= 1.0
        best = float(proposals.raw_progress[pool].max()) if pool.any() else 0.0
        # Nothing that moves: a reference of ~0 would give every member full progress, and a creeping or
        # reversing trajectory would score like one that drives on; the floor is used then.
        self.progress_reference = best if best > PROGRESS_EPSILON else self.progress_floor
        if unavoidable and best > PROGRESS_EPSILON:
            self.min_progress = MAKING_PROGRESS_RATIO * best

    def j_gen(self, s: ProposalScores) -> np.ndarray:
        """J_gen of scored members: the multiplicative terms (and the making-progress threshold when no
        proposal is feasible) times the weighted terms."""
        return s.multiplicative * (s.raw_progress >= self.min_progress) * self.weighted(s)

    def weighted(self, s: ProposalScores) -> np.ndarray:
        """The weighted terms of J_gen with progress normalised by the call's reference."""
        progress = np.clip(s.raw_progress / self.reference, 0.0, 1.0)
        w = self.weights
        return (w.progress * progress + w.ttc * s.ttc + w.comfort * s.comfort + w.speed_limit * s.speed_limit) / w.total

    @property
    def reference(self) -> float:
        return self.progress_floor if self.progress_reference is None else self.progress_reference

    def group_terms(self, group: int, evaluation: Evaluation, rows: np.ndarray) -> dict[str, np.ndarray]:
        action = self.groups[group]
        j_gen = evaluation.j_gen[rows]
        ttc = evaluation.ttc[rows]  # ``evaluate`` makes every batch a ScoredBatch
        if not action:
            return {"score": action_objective(None, j_gen, self.config), "j_gen": j_gen, "ttc": ttc}
        path = self.paths[group]
        states = evaluation.states[rows, 1:]
        j_dec = decision_following(action, path.lateral_offset(states[..., :2]), states[..., StateIndex.VELOCITY],
                                   self.reference_speed, self.config, path.speed_limit, self.elapsed,
                                   self.speed_cap(group))
        return {"score": action_objective(j_dec, j_gen, self.config), "j_dec": j_dec, "j_gen": j_gen, "ttc": ttc}

    def speed_cap(self, group: int) -> np.ndarray:
        """The group's J_dec speed cap (``proposals.following_speed_cap``), computed once per cycle."""
        if group not in self._speed_caps:
            path = self.paths[group]
            self._speed_caps[group] = following_speed_cap(self.ego, path.centerline, self.ctx.objects,
                                                          path.speed_limit, self.config.horizon_steps,
                                                          self.config.dt, self.ctx.vehicle)
        return self._speed_caps[group]

    def least_bad(self) -> tuple[np.ndarray, float, float] | None:
        """PDM-Closed's pick when nothing is feasible, among the searched members: the best by
        ``ProposalScores.least_bad_key`` (no at-fault collision, a static object counting half; then not
        driving backwards; then the weighted score), as (ego-frame waypoints, its key, time in s to its
        first at-fault collision, inf if none); None if every member has an at-fault collision with an
        agent."""
        best: tuple[float, ScoredBatch, int] | None = None
        for batch in self.batches:
            if batch.scores is None:
                continue
            key = batch.scores.least_bad_key(self.weighted(batch.scores))
            k = int(np.argmax(key))
            if key[k] > 0.0 and (best is None or key[k] > best[0]):
                best = (float(key[k]), batch, k)
        if best is None:
            return None
        key, batch, k = best
        return batch.poses[batch.tracked[k]], key, float(batch.scores.time_to_at_fault_collision[k])


def _lateral(action: str) -> str:
    return "K" if action[0] == "S" else action[1]


# --------------------------------------------------------------------------------------------------
# Warm starts
# --------------------------------------------------------------------------------------------------


def _smoothstep(u: np.ndarray) -> np.ndarray:
    u = np.clip(u, 0.0, 1.0)
    return 10 * u ** 3 - 15 * u ** 4 + 6 * u ** 5


def blended_poses(path_poses: np.ndarray, velocity: np.ndarray, start_offset: float, target_offset: float,
                  blend_time: float, dt: float) -> np.ndarray:
    """Poses (P, K+1, 3) on a path, shifted sideways from ``start_offset`` (the ego's offset from the
    path, left positive) to ``target_offset`` along a quintic over ``blend_time``."""
    t = np.arange(path_poses.shape[1]) * dt
    d = target_offset + (start_offset - target_offset) * (1.0 - _smoothstep(t / blend_time))
    dd = np.gradient(d, dt)
    h = path_poses[..., 2]
    out = path_poses.copy()
    out[..., 0] -= d * np.sin(h)
    out[..., 1] += d * np.cos(h)
    out[..., 2] = h + np.arctan2(dd, np.maximum(velocity, 1.0))
    return out


def _to_waypoints(poses: np.ndarray, origin: tuple[float, float, float], every: int) -> np.ndarray:
    """Map-frame poses every dt (P, K+1, 3) -> ego-frame waypoints (P, N, 3), headings continuous."""
    local = to_ego_frame(poses[:, every::every], origin)
    local[..., 2] = np.unwrap(wrap_angle(local[..., 2]), axis=1)
    return local


# --------------------------------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------------------------------


class DecisionGuidedPlanner:
    """LUNA-AD's decision-guided Diffusion-ES planner (``luna_core.types.Planner``)."""

    def __init__(self, config: DecisionGuidedConfig = DecisionGuidedConfig(),
                 prior: TrajectoryDiffusionPrior | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        device = default_device() if config.device == "auto" else config.device
        self.prior = prior if prior is not None else TrajectoryDiffusionPrior.from_pretrained(
            resolve(config.model_path, "diffusion_prior"), device, config.autocast)
        self.clock = clock
        self.name = "luna" if config.use_decisions else "diffusion_es"
        self.calls = 0
        self.last: PlanResult | None = None
        # The decision in force (luna_core.decision): latched once per decision, aged against T_d.
        self.decisions = DecisionTracker(config.timing, config.objective.gamma_p)
        self.last_context: PlanningContext | None = None  # the last cycle's set-up
        self.timer = StageTimer()  # stage costs measured in earlier calls, for the anytime budget

    def reset(self) -> None:
        self.calls = 0
        self.last = None
        self.decisions.reset()
        self.last_context = None

    def plan(self, planner_input: PlannerInput, context: PlanningContext | None = None) -> Trajectory:
        return self.plan_detailed(planner_input, context=context).trajectory

    def cycle_info(self) -> dict[str, object]:
        """How the last cycle ended, for evaluation statistics (mode, a*, whether a* flipped and, in
        the decision mode, whether Eq. 22 chose a candidate other than the most likely one searched and
        whether safety first changed a* from the paper's Eq. 22 pick)."""
        last = self.last
        if last is None:
            return {}
        info: dict[str, object] = {"mode": last.mode, "action": last.action or "", "flip": last.flipped}
        if last.mode == MODE_DECISION and last.candidates:
            info["beside_argmax"] = last.action != max(last.candidates, key=lambda c: c.probability).action
            info["safety_gated"] = last.safety_gated
        return info

    def debug_candidates(self) -> list[tuple[str, Trajectory, float, bool]]:
        """The last cycle's candidates for markers: (action code, X*_a, Eq. 22 score, chosen); the
        J_gen-only search is labelled "J_gen"."""
        last = self.last
        if last is None:
            return []
        return [(c.action or "J_gen", c.trajectory, c.selection_score, c.trajectory is last.trajectory)
                for c in last.candidates if c.trajectory is not None]

    # ---- the cycle -------------------------------------------------------------------------------

    def plan_detailed(self, planner_input: PlannerInput, budget: float | None = None,
                      context: PlanningContext | None = None) -> PlanResult:
        """One planning cycle within ``budget`` seconds (``config.time_budget`` by default), from
        ``context`` (built from ``planner_input`` here if not given)."""
        c = self.config
        start = self.clock()
        budget = c.time_budget if budget is None else budget
        deadline = None if c.deterministic else start + budget
        self.calls += 1
        steps_out = int(round(c.output_horizon / c.objective.dt))
        if context is None:
            context = build_planning_context(planner_input, output_horizon=c.output_horizon,
                                             scored_steps=c.objective.horizon_steps, dt=c.objective.dt)
        context.check(planner_input, steps_out, c.objective.horizon_steps, c.objective.dt, self.name)
        self.last_context = context
        reasons = list(context.input_problems)
        ego = context.ego
        if context.off_map:
            reasons.append(f"no reference path: {context.off_map}")
            stop = stop_along(ego, None, c.comfortable_deceleration, c.output_horizon, c.objective.dt)
            return self._finish(stop, None, MODE_STOP, reasons, [], start, budget, None)

        paths = context.paths
        groups, probs, group_paths, mode, decision = self._candidates(planner_input, paths, reasons)
        hist, seed = history_from_states(planner_input.ego_history, self.prior.config)
        objective = PlannerObjective(ego, seed, self.prior.config.waypoint_dt, context.scoring, c.scorer_weights,
                                     groups, group_paths, c.objective, decision)
        warm = self._warm_starts(groups, group_paths, ego, context.forecast, steps_out, planner_input.vehicle,
                                 objective)
        gen = torch.Generator().manual_seed(c.search.seed * 1_000_003 + self.calls)
        search = diffusion_es(self.prior, hist, seed, warm, objective, c.search, deadline, gen, self.clock, self.timer)
        if search.budget_cut:
            reasons.append(f"time budget {budget * 1e3:.0f} ms: {search.budget_cut}")
        return self._select(search, groups, probs, group_paths, mode, reasons, objective, ego, paths,
                            context.forecast, start, budget, decision, planner_input)

    def _candidates(self, planner_input: PlannerInput, paths: dict[str, ReferencePath], reasons: list[str]
                    ) -> tuple[list[str], list[float], list[ReferencePath], str, DecisionInForce | None]:
        """(groups, probabilities, each group's reference path, mode, decision in force); groups [""] =
        the J_gen-only search along the current lane."""
        c = self.config
        fallback = [""], [1.0], [paths["K"]]
        if not c.use_decisions:
            return (*fallback, MODE_NO_DECISION, None)
        d = planner_input.decision
        lanes = {code: path.lane_ids for code, path in paths.items()}
        decision, notes = self.decisions.follow(d, planner_input.ego_history, planner_input.time, lanes)
        if decision is None:
            reasons.extend(notes[:-1])
            reasons.append(f"{notes[-1]}: J_gen-only fallback")
            return (*fallback, MODE_FALLBACK, None)
        reasons.extend(notes)
        probability: dict[str, float] = {}  # pi(a) per candidate; a blocked lane change joins its keep action
        keys: dict[str, str] = {}
        for code in decision.candidate_set:
            # The lanes the action named when decided, wherever the ego is now (halfway through a lane
            # change, "left" at the decision is the ego's own lane).
            target, key = code, decision.target_lane(_lateral(code), lanes)
            if key is None and c.blocked_lateral_to_keep:
                target, key = code[0] + "K", decision.target_lane("K", lanes)
                if key is not None:
                    reasons.append(f"candidate {code}: no lane on that side (or it leaves the route too soon): "
                                   f"its probability goes to {target}")
            if key is None:
                reasons.append(f"candidate {code} dropped: no lane on that side (or it leaves the route too soon)")
                continue
            probability[target] = probability.get(target, 0.0) + decision.probability(code)
            keys[target] = key
        for a in probability:  # a keep action that C_t lacked brings its own pi(a) as well
            if a not in decision.candidate_set:
                probability[a] += decision.probability(a)
        if not probability:
            reasons.append("no candidate action is possible here: J_gen-only fallback")
            return (*fallback, MODE_FALLBACK, None)
        chosen = sorted(probability, key=lambda a: -probability[a])  # Eq. 25's order, stable on ties
        return (chosen, [probability[a] for a in chosen], [paths[keys[a]] for a in chosen], MODE_DECISION,
                decision)

    def _previous_plan(self, ego: EgoState, every: int, steps: int) -> np.ndarray | None:
        """The last published trajectory from now on, as map-frame poses every dt (1, steps+1, 3),
        continued at its final speed and heading past its end; None without one."""
        last = self.last
        if last is None or last.mode in (MODE_EMERGENCY, MODE_STOP):
            return None
        traj = last.trajectory
        dt = self.config.objective.dt
        t = (ego.stamp - traj.stamp) + np.arange(steps + 1) * dt
        if t[0] < traj.t[0] or t[0] > traj.t[-1]:
            return None
        s = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(traj.x), np.diff(traj.y)))])
        s_at = np.interp(t, traj.t, s) + np.maximum(t - traj.t[-1], 0.0) * max(float(traj.velocity[-1]), 0.0)
        x = np.interp(s_at, s, traj.x, right=np.nan)
        y = np.interp(s_at, s, traj.y, right=np.nan)
        beyond = np.isnan(x)
        h_end = float(traj.heading[-1])
        x[beyond] = traj.x[-1] + (s_at[beyond] - s[-1]) * math.cos(h_end)
        y[beyond] = traj.y[-1] + (s_at[beyond] - s[-1]) * math.sin(h_end)
        if math.hypot(x[0] - ego.x, y[0] - ego.y) > PREVIOUS_PLAN_TOLERANCE:
            return None  # the ego is not where the last plan put it (a jump, a reset): nothing to keep
        h = np.interp(t, traj.t, np.unwrap(traj.heading))
        return np.column_stack([x, y, h])[None]

    def _warm_starts(self, groups: list[str], group_paths: list[ReferencePath], ego: EgoState,
                     forecast: ObjectBoxes, steps: int, vehicle: VehicleParameters,
                     objective: PlannerObjective) -> list[np.ndarray]:
        """Ego-frame waypoints (W, N, 3) of each group's warm starts ("" = PDM-Closed's proposals),
        then the previous cycle's plan (so consecutive cycles can keep a manoeuvre). It comes last: the
        best member wins ties by scoring order, and a plan made for the last cycle's forecast must not
        win them over the IDM proposals of this one (a constant-speed plan behind a lead that has begun
        to brake scores as well as the proposals that brake with it until it is too late).

        IDM proposals run once per reference path for all the groups that share it (one vectorised
        rollout over every target speed), then each group blends its own lateral profiles. Target
        speeds stay inside the action's speed interval (capped at the lane's speed limit).
        """
        c = self.config
        dt = c.objective.dt
        every = int(round(self.prior.config.waypoint_dt / dt))
        steps = max(steps, every * self.prior.config.num_waypoints)
        origin = (ego.x, ego.y, ego.heading)
        previous = self._previous_plan(ego, every, steps)
        plans: dict[int, tuple[np.ndarray, list[tuple[float, float]]]] = {}  # group -> speeds, (offset, blend)
        for g, (action, path) in enumerate(zip(groups, group_paths)):
            if action and action[0] == "S":
                continue
            if action:
                lo, hi = speed_interval(action, objective.reference_speed, c.objective, path.speed_limit)
                lo_v, hi_v = float(lo[0]), float(hi[0])
                if not math.isfinite(hi_v):  # accelerate without a known limit: up to 3 m/s above the floor
                    hi_v = lo_v + 3.0
                speeds = np.linspace(lo_v, max(hi_v * 0.98, lo_v), c.warm_speeds)
                blends = c.keep_blend_times if path.lateral == "K" else c.change_blend_times
                plans[g] = (speeds, [(0.0, tb) for tb in blends])
            else:
                speeds = np.array(c.fallback_speed_fractions) * path.speed_limit
                plans[g] = (speeds, [(off, c.keep_blend_times[len(c.keep_blend_times) // 2])
                                     for off in c.fallback_offsets])
        rollouts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for lateral in {group_paths[g].lateral for g in plans}:
            members = [g for g in plans if group_paths[g].lateral == lateral]
            speeds = np.concatenate([plans[g][0] for g in members])
            props = idm_proposals(ego, group_paths[members[0]].centerline, forecast, offsets=(0.0,),
                                  target_speeds=tuple(speeds), steps=steps, simulate_steps=0, dt=dt, vehicle=vehicle)
            bounds = np.cumsum([0] + [len(plans[g][0]) for g in members])
            for k, g in enumerate(members):
                rollouts[g] = (props.poses[bounds[k]:bounds[k + 1]], props.velocity[bounds[k]:bounds[k + 1]])
        out = []
        for g, (action, path) in enumerate(zip(groups, group_paths)):
            d0 = float(path.lateral_offset(np.array([ego.x, ego.y])))
            parts = []
            if action and action[0] == "S":
                for decel in np.linspace(1.0, 4.0, c.warm_speeds):
                    stop = stop_along(ego, path.centerline, float(decel), horizon=steps * dt, dt=dt)
                    poses = np.column_stack([stop.x, stop.y, stop.heading])[None]
                    for tb in c.keep_blend_times:
                        parts.append(blended_poses(poses, stop.velocity[None], d0, 0.0, tb, dt))
            else:
                poses, velocity = rollouts[g]
                for off, tb in plans[g][1]:
                    parts.append(blended_poses(poses, velocity, d0, off, tb, dt))
            if previous is not None:
                parts.append(previous)
            out.append(_to_waypoints(np.concatenate(parts), origin, every)[:, : self.prior.config.num_waypoints])
        return out

    # ---- selection and the published trajectory ----------------------------------------------------

    def _select(self, search: ESResult, groups: list[str], probs: list[float], group_paths: list[ReferencePath],
                mode: str, reasons: list[str],
                objective: PlannerObjective, ego: EgoState, paths: dict[str, ReferencePath],
                forecast: ObjectBoxes, start: float, budget: float, decision: DecisionInForce | None,
                planner_input: PlannerInput) -> PlanResult:
        c = self.config
        steps_out = int(round(c.output_horizon / c.objective.dt))
        t = np.arange(steps_out + 1) * c.objective.dt
        candidates: list[CandidateResult] = []
        for g, action in enumerate(groups):
            best = search.best[g]
            if best is None:
                candidates.append(CandidateResult(action, probs[g], None, math.nan, 0.0, 0.0, 0.0, "none"))
                continue
            poses = objective.map_poses(best.poses[None], steps_out)[0]
            traj = self._with_tail(Trajectory.from_poses(ego.stamp, t, poses), group_paths[g], forecast,
                                   planner_input.vehicle)
            candidates.append(CandidateResult(action, probs[g], traj, best.terms.get("j_dec", math.nan),
                                              best.terms["j_gen"], best.score, 0.0, best.origin,
                                              best.terms.get("ttc", 0.0)))
        scored = [k for k, cand in enumerate(candidates) if cand.trajectory is not None]
        flipped = gated = False
        if scored and mode == MODE_DECISION:
            safe = [candidates[k].j_gen > 0.0 and candidates[k].ttc >= 1.0 for k in scored]
            admissible = safe if c.safety_first and any(safe) else [True] * len(scored)
            actions = [candidates[k].action for k in scored]
            idx, eq22 = select(actions, [candidates[k].probability for k in scored],
                               [candidates[k].j_dec for k in scored], [candidates[k].j_gen for k in scored],
                               c.objective, admissible)
            for k, value in zip(scored, eq22):
                candidates[k].selection_score = float(value)
            pick = self._hysteresis(idx, eq22, actions, decision, admissible)
            # Safety first changed a* when the paper's rule (argmax over all, then hysteresis) picks another.
            gated = pick != self._hysteresis(int(np.argmax(eq22)), eq22, actions, decision, [True] * len(scored))
            chosen = scored[pick]
            previous = self.last
            flipped = (previous is not None and previous.mode == MODE_DECISION and decision is not None
                       and previous.decision_stamp == decision.stamp and previous.action != candidates[chosen].action)
        elif scored:
            for k in scored:
                candidates[k].selection_score = candidates[k].j_gen
            chosen = max(scored, key=lambda k: candidates[k].j_gen)
        else:
            chosen = None
        stamp = decision.stamp if decision is not None else None
        if chosen is not None and candidates[chosen].j_gen > 0.0:
            return self._finish(candidates[chosen].trajectory, candidates[chosen].action or None, mode, reasons,
                                candidates, start, budget, stamp, search, flipped, gated)
        return self._fallback(objective, ego, paths, forecast, t, reasons, candidates, start, budget, stamp,
                              search, planner_input.vehicle)

    def _hysteresis(self, idx: int, eq22: np.ndarray, actions: list[str], decision: DecisionInForce | None,
                    admissible: list[bool]) -> int:
        """Keep the previous cycle's a* under the same decision unless ``idx`` beats it by the margin (or
        it is no longer admissible)."""
        last = self.last
        if (last is None or decision is None or last.decision_stamp != decision.stamp or last.action is None
                or last.action not in actions):
            return idx
        keep = actions.index(last.action)
        if not admissible[keep]:
            return idx
        if keep != idx and eq22[keep] > 0.0 and eq22[idx] <= (1.0 + self.config.switch_margin) * eq22[keep]:
            return keep
        return idx

    def _fallback(self, objective: PlannerObjective, ego: EgoState, paths: dict[str, ReferencePath],
                  forecast: ObjectBoxes, t: np.ndarray, reasons: list[str],
                  candidates: list[CandidateResult], start: float, budget: float, stamp: float | None,
                  search: ESResult, vehicle: VehicleParameters) -> PlanResult:
        """PDM-Closed's answer when nothing is feasible: the least-bad trajectory among the searched members
        and PDM-Closed's proposals (no at-fault collision, not driving backwards, best weighted score; if
        everything collides, PDM-Closed's own pick among its proposals), and its emergency brake for an
        imminent at-fault collision at low speed."""
        c = self.config
        keep = paths["K"]
        proposals = idm_proposals(ego, keep.centerline, forecast, offsets=c.fallback_offsets,
                                  target_speeds=tuple(f * keep.speed_limit for f in c.fallback_speed_fractions),
                                  steps=len(t) - 1, simulate_steps=c.objective.horizon_steps, dt=c.objective.dt,
                                  vehicle=vehicle)
        scores = score_proposals(proposals.states, objective.ctx, c.scorer_weights)
        proposal_keys = scores.least_bad_key(objective.weighted(scores))
        k = int(np.argmax(proposal_keys))
        least = objective.least_bad()
        if least is not None and least[1] > proposal_keys[k]:
            waypoints, _, t_fault = least
            poses = objective.map_poses(waypoints[None], len(t) - 1)[0]
            traj = self._with_tail(Trajectory.from_poses(ego.stamp, t, poses), keep, forecast, vehicle)
            what = "the least-bad searched trajectory (no at-fault collision, forward, best weighted score)"
        else:
            if proposal_keys[k] <= 0.0:
                k = scores.best  # every trajectory collides at fault: PDM-Closed's own choice
            t_fault = float(scores.time_to_at_fault_collision[k])
            # The proposal runs along its offset path from the ego's foot point there; published, it
            # starts at the ego and eases onto that path (as the warm starts do).
            d0 = float(keep.lateral_offset(np.array([ego.x, ego.y]))) - float(proposals.offsets[k])
            poses = blended_poses(proposals.poses[k][None], proposals.velocity[k][None], d0, 0.0,
                                  c.keep_blend_times[-1], c.objective.dt)[0]
            traj = Trajectory(ego.stamp, t, poses[:, 0], poses[:, 1], wrap_angle(poses[:, 2]),
                              proposals.velocity[k].copy(), proposals.acceleration[k].copy())
            what = (f"PDM-Closed's proposal {k} (offset {proposals.offsets[k]:+.0f} m, "
                    f"{proposals.target_speeds[k]:.1f} m/s)")
        reasons.append(f"no feasible trajectory (every candidate's best has J_gen = 0): {what}")
        if t_fault <= c.emergency_time and ego.velocity <= c.emergency_max_speed:
            reasons.append(f"at-fault collision in {t_fault:.1f} s at {ego.velocity:.1f} m/s: emergency brake")
            brake = emergency_brake_trajectory(ego, len(t) - 1, c.objective.dt, vehicle)
            return self._finish(brake, None, MODE_EMERGENCY, reasons, candidates, start, budget, stamp, search)
        return self._finish(traj, None, MODE_LEAST_BAD, reasons, candidates, start, budget, stamp, search)

    def _with_tail(self, trajectory: Trajectory, path: ReferencePath, forecast: ObjectBoxes,
                   vehicle: VehicleParameters) -> Trajectory:
        """``trajectory`` for the scored horizon, then an IDM continuation along ``path`` behind the
        forecast objects in its corridor at the speed reached (capped at the limit), joining the lane
        centre over ``tail_blend_time``: the tracker fits the whole published trajectory, and an
        unscored tail must not run through a stopped car (it stops at the car's rear where IDM's
        braking would not)."""
        c = self.config
        k0 = c.objective.horizon_steps
        n = len(trajectory.t) - 1 - k0
        if n <= 0:
            return trajectory
        dt = c.objective.dt
        xy0 = np.array([trajectory.x[k0], trajectory.y[k0]])
        v0 = max(float(trajectory.velocity[k0]), 0.0)
        limit = path.speed_limit if path.speed_limit > 0.0 else math.inf
        target = min(v0, limit)
        s0 = float(path.centerline.project(xy0).s)
        tail_objects = forecast.window(k0)
        if target < 0.1:  # standing (or all but): the tail stands too
            s = np.full((1, n + 1), s0)
            v = np.zeros((1, n + 1))
        else:
            s, v, _ = idm_rollout(v0, np.array([s0]), np.zeros(1, dtype=int), [path.centerline], tail_objects,
                                  pdm_policy(target), np.array([target]), n, dt, vehicle, stop_short=True)
        base = path.centerline.interpolate(s[0])[None]
        d0 = float(path.lateral_offset(xy0))
        tail = blended_poses(base, v, d0, 0.0, c.tail_blend_time, dt)[0]
        tail[0] = (trajectory.x[k0], trajectory.y[k0], trajectory.heading[k0])
        head = np.column_stack([trajectory.x, trajectory.y, trajectory.heading])[: k0 + 1]
        tail[:, 2] = head[-1, 2] + wrap_angle(tail[:, 2] - head[-1, 2])  # headings continuous at the join
        return Trajectory.from_poses(trajectory.stamp, trajectory.t, np.concatenate([head, tail[1:]]))

    def _finish(self, trajectory: Trajectory, action: str | None, mode: str, reasons: list[str],
                candidates: list[CandidateResult], start: float, budget: float, stamp: float | None,
                search: ESResult | None = None, flipped: bool = False, safety_gated: bool = False) -> PlanResult:
        result = PlanResult(trajectory, action, mode, reasons, candidates, self.clock() - start, budget,
                            search.budget_cut if search else "", search.stages_done if search else [], stamp,
                            flipped, safety_gated)
        self.last = result
        return result

