"""The decision-guided planner of LUNA-AD (Sec. III-D, Eq. 19-22) on Diffusion-ES.

Each call (``plan`` / ``plan_detailed``):

1. sanitise the input: the ego state is the latest finite one of the history; objects with
   non-finite fields are dropped (and counted in the reasons);
2. reference paths per lateral decision (``reference_paths``); off the map -> comfortable stop;
3. the candidate set C_t = {a : pi(a) >= gamma_p} (Eq. 19) of a fresh, valid decision; actions
   without a lane on their side are dropped. No decision, a stale one (older than
   ``decision_timeout``, 2 T_d by default) or an invalid one (probabilities not a distribution,
   unknown action codes) -> the fallback objective: one search under J_gen alone, warm-started
   by PDM-Closed's proposals along the current lane (exactly the "Diffusion-ES without decisions"
   baseline, which is this class with ``use_decisions=False``);
4. one batched Diffusion-ES over all candidate actions, each under J_a = J_dec^omega_dec *
   J_gen^omega_gen (Eq. 20-21), warm-started by IDM proposals along the action's reference lane at
   target speeds inside its speed interval (Stop: braking profiles), blended smoothly from the ego's
   current lateral position;
5. Eq. 22: a* = argmax pi(a)^omega_prob * J~_a(X*_a); its trajectory is published;
6. if the chosen trajectory has J_gen = 0 (every candidate collides at fault, leaves the drivable
   area or drives against traffic) -> comfortable stop along the current lane.

J_gen is the shared PDM-style scorer (``planning.scorer``) on LQR + bicycle rollouts over 40 steps
of 0.1 s. Its progress term is normalised by a reference fixed once per call (the best feasible
progress among the first scored batch, the warm starts) so that members scored in different
Diffusion-ES batches stay comparable.

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
from luna_core.lanes import LaneMap, Polyline, lane_map
from luna_core.planning.diffusion import (TrajectoryDiffusionPrior, history_from_states, to_ego_frame,
                                          to_map_frame)
from luna_core.planning.diffusion_es import (DiffusionESConfig, ESResult, Evaluation, StageTimer, densify,
                                             diffusion_es)
from luna_core.planning.forecast import constant_velocity_forecast
from luna_core.planning.objectives import (ObjectiveConfig, action_objective, candidate_actions,
                                           decision_following, select, speed_interval)
from luna_core.planning.proposals import idm_proposals, stopping_trajectory
from luna_core.planning.reference_paths import OffMapError, ReferencePath, reference_paths
from luna_core.planning.scorer import (PROGRESS_EPSILON, ObjectBoxes, ScorerWeights, ScoringContext,
                                       score_proposals)
from luna_core.types import (ACTION_INDEX, EgoState, LaneGraph, PlannerInput, TrackedObjects, Trajectory,
                             VehicleParameters, validate_distribution, wrap_angle)


class PlannerInputError(ValueError):
    """The input holds nothing a trajectory can start from (no finite ego state)."""


# Degraded modes, as reported in PlanResult.mode (and in the planner node's diagnostics).
MODE_DECISION = "decision"  # Eq. 19-22 with a valid, fresh decision
MODE_NO_DECISION = "no_decision"  # configured without decisions (the Diffusion-ES baseline)
MODE_FALLBACK = "fallback"  # decision missing, stale or invalid: J_gen only
MODE_STOP = "comfortable_stop"  # off the map or nothing feasible


@dataclass(frozen=True)
class DecisionGuidedConfig:
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    search: DiffusionESConfig = field(default_factory=DiffusionESConfig)
    scorer_weights: ScorerWeights = field(default_factory=ScorerWeights)
    model_path: str = ""  # diffusion prior folder (config.json + model.safetensors); "" = the bundled default
    time_budget: float = 0.4  # s per call; the planner node replans every 0.5 s
    # Deterministic mode for batch evaluation: no wall-clock budget, every stage runs at its full
    # configured size, so the result does not depend on the machine's load (same input, same output).
    deterministic: bool = False
    decision_timeout: float = 4.0  # s: 2 T_d with T_d = 2 s
    use_decisions: bool = True  # False: the "Diffusion-ES without decisions" baseline
    output_horizon: float = 8.0  # s of the published trajectory
    comfortable_deceleration: float = 2.0  # m/s^2 of the comfortable stop
    # Warm starts: IDM target speeds per action (spread over its interval) x lateral blend times.
    warm_speeds: int = 5
    keep_blend_times: tuple[float, ...] = (1.5, 2.5, 3.5)  # s to reach the lane centre (K, Stop)
    change_blend_times: tuple[float, ...] = (3.0, 4.5, 6.0)  # s to reach the target lane (L, R)
    fallback_offsets: tuple[float, ...] = (-1.0, 0.0, 1.0)  # PDM-Closed's proposal offsets (m)
    fallback_speed_fractions: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)  # of the speed limit
    # Flat overrides of the two most-tuned nested settings (the planner node's parameters):
    # search.population and objective.gamma_p; None keeps the nested value.
    population: int | None = None
    gamma_p: float | None = None

    def __post_init__(self) -> None:
        if self.population is not None:
            object.__setattr__(self, "search", replace(self.search, population=int(self.population)))
        if self.gamma_p is not None:
            object.__setattr__(self, "objective", replace(self.objective, gamma_p=float(self.gamma_p)))
        if not (self.time_budget > 0.0 and self.decision_timeout > 0.0 and self.output_horizon > 0.0
                and self.comfortable_deceleration > 0.0):
            raise ValueError("DecisionGuidedConfig: time_budget, decision_timeout, output_horizon and "
                             "comfortable_deceleration must be positive")


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


@dataclass
class PlanResult:
    trajectory: Trajectory
    action: str | None  # a* (None in the J_gen-only modes and when stopping)
    mode: str
    reasons: list[str]
    candidates: list[CandidateResult]
    elapsed: float  # s spent in the call
    budget: float
    budget_cut: str  # non-empty if the search stopped early because of the budget
    stages_done: list[str]
    decision_stamp: float | None = None

    @property
    def degraded(self) -> bool:
        return self.mode in (MODE_FALLBACK, MODE_STOP)

    @property
    def degraded_reason(self) -> str:
        """Everything that was not nominal in this cycle, for diagnostics ("" when nominal)."""
        return "; ".join(([f"mode {self.mode}"] if self.degraded else []) + self.reasons)


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


PROGRESS_FLOOR_ACCELERATION = 1.0  # m/s^2 of the ideal start the progress floor is half of


def progress_floor(speed: float, speed_limit: float, horizon: float) -> float:
    """The progress reference (m) when no feasible warm start moves: half the distance covered over
    ``horizon`` seconds when accelerating gently (1 m/s^2) from ``speed`` up to ``speed_limit`` (no
    limit known: 15 m/s)."""
    v0 = max(speed, 0.0)
    v_max = max(speed_limit if speed_limit > 0.0 else 15.0, v0)
    t_acc = min(horizon, (v_max - v0) / PROGRESS_FLOOR_ACCELERATION)
    ideal = v0 * t_acc + 0.5 * PROGRESS_FLOOR_ACCELERATION * t_acc ** 2 + v_max * (horizon - t_acc)
    return 0.5 * ideal


class PlannerObjective:
    """The ``PopulationObjective`` of one planning call: tracking + J_gen shared, J_dec per group."""

    def __init__(self, ego: EgoState, seed: np.ndarray, waypoint_dt: float, ctx: ScoringContext,
                 weights: ScorerWeights, groups: list[str], paths: dict[str, ReferencePath],
                 config: ObjectiveConfig) -> None:
        self.ego = ego
        self.origin = (ego.x, ego.y, ego.heading)
        self.seed = seed
        self.waypoint_dt = waypoint_dt
        self.ctx = ctx
        self.weights = weights
        self.groups = groups  # action codes; "" = J_gen only
        self.paths = paths
        self.config = config
        self.state0 = state_from_ego(ego)
        self.progress_reference: float | None = None
        self.progress_floor = progress_floor(ego.velocity, ctx.speed_limit, config.horizon_steps * config.dt)

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
        j_gen = np.zeros(m)
        if ok.any():
            sim = simulate_proposals(self.state0, ref[ok], self.ctx.vehicle)
            good = np.all(np.isfinite(sim), axis=(1, 2))
            idx = np.flatnonzero(ok)[good]
            states[idx] = sim[good]
            if len(idx):
                j_gen[idx] = self._j_gen(states[idx])
        return Evaluation(states, j_gen)

    def _j_gen(self, states: np.ndarray) -> np.ndarray:
        s = score_proposals(states, self.ctx, self.weights)
        if self.progress_reference is None:  # fixed by the first batch: comparable across batches
            feasible = s.raw_progress[s.multiplicative > 0]
            best = float(feasible.max()) if len(feasible) else 0.0
            # No feasible warm start that moves: a reference of ~0 would give every member full
            # progress, and a creeping or reversing trajectory would score like one that drives on.
            # Then (only then: a max() with the floor would push a planned stop towards the lead
            # and cost TTC) the floor is the reference.
            self.progress_reference = best if best > PROGRESS_EPSILON else self.progress_floor
        ref = self.progress_reference
        progress = np.clip(s.raw_progress / ref, 0.0, 1.0) if ref > PROGRESS_EPSILON else np.ones(len(states))
        w = self.weights
        weighted = (w.progress * progress + w.ttc * s.ttc + w.comfort * s.comfort
                    + w.speed_limit * s.speed_limit) / w.total
        return s.multiplicative * weighted

    def group_terms(self, group: int, evaluation: Evaluation, rows: np.ndarray) -> dict[str, np.ndarray]:
        action = self.groups[group]
        j_gen = evaluation.j_gen[rows]
        if not action:
            return {"score": action_objective(None, j_gen, self.config), "j_gen": j_gen}
        states = evaluation.states[rows, 1:]
        path = self.paths[_lateral(action)]
        offsets = path.lateral_offset(states[..., :2])
        j_dec = decision_following(action, offsets, states[..., StateIndex.VELOCITY], self.ego.velocity,
                                   self.config)
        return {"score": action_objective(j_dec, j_gen, self.config), "j_dec": j_dec, "j_gen": j_gen}


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
        self.prior = prior if prior is not None else TrajectoryDiffusionPrior.from_pretrained(resolve(config.model_path, "diffusion_prior"))
        self.clock = clock
        self.name = "luna" if config.use_decisions else "diffusion_es"
        self.calls = 0
        self.last: PlanResult | None = None
        self._local_key: tuple | None = None
        self._local_graph = LaneGraph()
        self.timer = StageTimer()  # stage costs measured in earlier calls, for the anytime budget

    def reset(self) -> None:
        self.calls = 0
        self.last = None

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        return self.plan_detailed(planner_input).trajectory

    def debug_candidates(self) -> list[tuple[str, Trajectory, float, bool]]:
        """The last cycle's candidates for markers: (action code, X*_a, Eq. 22 score, chosen); the
        J_gen-only search is labelled "J_gen"."""
        last = self.last
        if last is None:
            return []
        return [(c.action or "J_gen", c.trajectory, c.selection_score, c.trajectory is last.trajectory)
                for c in last.candidates if c.trajectory is not None]

    # ---- the cycle -------------------------------------------------------------------------------

    def plan_detailed(self, planner_input: PlannerInput, budget: float | None = None) -> PlanResult:
        """One planning cycle within ``budget`` seconds (``config.time_budget`` by default)."""
        c = self.config
        start = self.clock()
        budget = c.time_budget if budget is None else budget
        deadline = None if c.deterministic else start + budget
        self.calls += 1
        reasons: list[str] = []
        ego = self._ego(planner_input, reasons)
        n_bad = sum(not o.is_finite() for o in planner_input.objects.objects)
        if n_bad:
            reasons.append(f"dropped {n_bad} object(s) with non-finite state")
        steps_out = int(round(c.output_horizon / c.objective.dt))

        try:
            # Long enough for 8 s at well above the current speed; shorter paths project faster.
            ahead = 40.0 + c.output_horizon * max(1.5 * ego.velocity, 20.0)
            paths = reference_paths(planner_input.lane_graph, planner_input.route, ego, ahead=ahead)
        except OffMapError as exc:
            reasons.append(f"no reference path: {exc}")
            line = Polyline(np.array([[ego.x, ego.y], [ego.x + 200.0 * math.cos(ego.heading),
                                                       ego.y + 200.0 * math.sin(ego.heading)]]))
            return self._finish(stopping_trajectory(ego, line, c.comfortable_deceleration, steps_out,
                                                    c.objective.dt), None, MODE_STOP, reasons, [], start, budget,
                                None, planner_input)

        groups, probs, mode, stamp = self._candidates(planner_input, paths, reasons)
        clean_input = replace(planner_input, ego_history=[ego], objects=TrackedObjects(
            planner_input.objects.stamp, [o for o in planner_input.objects.objects if o.is_finite()]))
        lm = self._local_lanes(planner_input.lane_graph, ego)
        keep = paths["K"]
        full_forecast = constant_velocity_forecast(clean_input, lm, list(keep.lane_ids), steps_out + 1,
                                                   c.objective.dt)
        f, n_score = full_forecast, c.objective.horizon_steps + 1
        forecast = ObjectBoxes(f.ids, f.pose[:, :n_score], f.size, f.speed, f.static, f.red_light)
        ctx = ScoringContext(lm, keep.centerline, forecast, keep.speed_limit, planner_input.vehicle,
                             c.objective.dt)
        hist, seed = history_from_states(planner_input.ego_history, self.prior.config)
        objective = PlannerObjective(ego, seed, self.prior.config.waypoint_dt, ctx, c.scorer_weights, groups,
                                     paths, c.objective)
        warm = self._warm_starts(groups, ego, paths, full_forecast, steps_out, planner_input.vehicle)
        gen = torch.Generator().manual_seed(c.search.seed * 1_000_003 + self.calls)
        search = diffusion_es(self.prior, hist, seed, warm, objective, c.search, deadline, gen, self.clock, self.timer)
        if search.budget_cut:
            reasons.append(f"time budget {budget * 1e3:.0f} ms: {search.budget_cut}")
        return self._select(search, groups, probs, mode, reasons, objective, ego, keep, start, budget, stamp,
                            planner_input)

    def _local_lanes(self, graph: LaneGraph, ego: EgoState) -> LaneMap:
        """The lane map of the lanes within reach of this cycle's trajectories.

        The scorer tests every footprint corner against every lane of the map it is given; on a real
        map (a CommonRoad intersection has ~90 lanelets) most are far away. The sub-graph is cached
        while the set of nearby lanes stays the same, so its polygons are built once per change.
        """
        reach = 60.0 + 2.0 * self.config.objective.horizon_steps * self.config.objective.dt * max(ego.velocity, 15.0)
        ids = tuple(sorted(lane_map(graph).lanes_within(ego.x, ego.y, reach)))
        key = (id(graph), ids)
        if self._local_key != key:
            self._local_graph = LaneGraph({i: graph.lanes[i] for i in ids}, graph.frame_id, graph.stamp)
            self._local_key = key
        return lane_map(self._local_graph)

    def _ego(self, planner_input: PlannerInput, reasons: list[str]) -> EgoState:
        finite = [s for s in planner_input.ego_history if s.is_finite()]
        if not finite:
            raise PlannerInputError("the ego history has no finite state: no trajectory can start anywhere")
        if not planner_input.ego_history[-1].is_finite():
            reasons.append(f"latest ego state is not finite; planning from the one at t={finite[-1].stamp:.2f}")
        return finite[-1]

    def _candidates(self, planner_input: PlannerInput, paths: dict[str, ReferencePath], reasons: list[str]
                    ) -> tuple[list[str], list[float], str, float | None]:
        """(groups, probabilities, mode, decision stamp); groups [""] = the J_gen-only search."""
        c = self.config
        if not c.use_decisions:
            return [""], [1.0], MODE_NO_DECISION, None
        d = planner_input.decision
        if d is None:
            reasons.append("no decision received: J_gen-only fallback")
            return [""], [1.0], MODE_FALLBACK, None
        age = planner_input.time - d.stamp
        if not math.isfinite(age) or age > c.decision_timeout:
            reasons.append(f"decision is stale ({age:.2f} s old > {c.decision_timeout:.2f} s): J_gen-only fallback")
            return [""], [1.0], MODE_FALLBACK, d.stamp
        try:
            p = validate_distribution(d.probabilities)
            unknown = [code for code in d.candidate_set if code not in ACTION_INDEX]
            if unknown:
                raise ValueError(f"unknown action code(s) {unknown} in the candidate set")
        except (ValueError, TypeError) as exc:
            reasons.append(f"invalid decision: {exc}: J_gen-only fallback")
            return [""], [1.0], MODE_FALLBACK, d.stamp
        chosen = []
        for code in candidate_actions(p, c.objective):
            if _lateral(code) not in paths:
                reasons.append(f"candidate {code} dropped: no lane on that side")
            else:
                chosen.append(code)
        if not chosen:
            reasons.append("no candidate action is possible here: J_gen-only fallback")
            return [""], [1.0], MODE_FALLBACK, d.stamp
        return chosen, [float(p[ACTION_INDEX[a]]) for a in chosen], MODE_DECISION, d.stamp

    def _warm_starts(self, groups: list[str], ego: EgoState, paths: dict[str, ReferencePath],
                     forecast: ObjectBoxes, steps: int, vehicle: VehicleParameters) -> list[np.ndarray]:
        """Ego-frame waypoints (W, N, 3) of each group's warm starts ("" = PDM-Closed's proposals).

        IDM proposals run once per reference path for all the groups that share it (one vectorised
        rollout over every target speed), then each group blends its own lateral profiles.
        """
        c = self.config
        dt = c.objective.dt
        every = int(round(self.prior.config.waypoint_dt / dt))
        steps = max(steps, every * self.prior.config.num_waypoints)
        origin = (ego.x, ego.y, ego.heading)
        plans: dict[str, tuple[str, np.ndarray, list[tuple[float, float]]]] = {}
        for action in groups:
            if action and action[0] == "S":
                continue
            lateral = _lateral(action) if action else "K"
            path = paths[lateral]
            if action:
                lo, hi = speed_interval(action, ego.velocity, c.objective)
                lo_v, hi_v = float(lo[0]), float(hi[0])
                if not math.isfinite(hi_v):  # accelerate: up to the limit, at least 3 m/s above the floor
                    hi_v = max(path.speed_limit, lo_v + 3.0)
                speeds = np.linspace(lo_v, max(hi_v * 0.98, lo_v), c.warm_speeds)
                blends = c.keep_blend_times if lateral == "K" else c.change_blend_times
                targets = [(0.0, tb) for tb in blends]
            else:
                speeds = np.array(c.fallback_speed_fractions) * path.speed_limit
                targets = [(off, c.keep_blend_times[len(c.keep_blend_times) // 2]) for off in c.fallback_offsets]
            plans[action] = (lateral, speeds, targets)
        rollouts: dict[str, tuple[np.ndarray, np.ndarray, dict[str, slice]]] = {}
        for lateral in {plan[0] for plan in plans.values()}:
            members = [a for a, plan in plans.items() if plan[0] == lateral]
            speeds = np.concatenate([plans[a][1] for a in members])
            props = idm_proposals(ego, paths[lateral].centerline, forecast, offsets=(0.0,),
                                  target_speeds=tuple(speeds), steps=steps, simulate_steps=0, dt=dt, vehicle=vehicle)
            bounds = np.cumsum([0] + [len(plans[a][1]) for a in members])
            rollouts[lateral] = (props.poses, props.velocity,
                                 {a: slice(bounds[k], bounds[k + 1]) for k, a in enumerate(members)})
        out = []
        for action in groups:
            path = paths[_lateral(action)] if action else paths["K"]
            d0 = float(path.lateral_offset(np.array([ego.x, ego.y])))
            parts = []
            if action and action[0] == "S":
                for decel in np.linspace(1.0, 4.0, c.warm_speeds):
                    stop = stopping_trajectory(ego, path.centerline, float(decel), steps, dt)
                    poses = np.column_stack([stop.x, stop.y, stop.heading])[None]
                    for tb in c.keep_blend_times:
                        parts.append(blended_poses(poses, stop.velocity[None], d0, 0.0, tb, dt))
            else:
                lateral, _, targets = plans[action]
                poses, velocity, rows = rollouts[lateral]
                for off, tb in targets:
                    parts.append(blended_poses(poses[rows[action]], velocity[rows[action]], d0, off, tb, dt))
            out.append(_to_waypoints(np.concatenate(parts), origin, every)[:, : self.prior.config.num_waypoints])
        return out

    def _select(self, search: ESResult, groups: list[str], probs: list[float], mode: str, reasons: list[str],
                objective: PlannerObjective, ego: EgoState, keep: ReferencePath, start: float, budget: float,
                stamp: float | None, planner_input: PlannerInput) -> PlanResult:
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
            traj = Trajectory.from_poses(ego.stamp, t, poses)
            j_gen = best.terms["j_gen"]
            j_dec = best.terms.get("j_dec", math.nan)
            candidates.append(CandidateResult(action, probs[g], traj, j_dec, j_gen, best.score, 0.0, best.origin))
        scored = [k for k, cand in enumerate(candidates) if cand.trajectory is not None]
        if scored and mode == MODE_DECISION:
            idx, eq22 = select([candidates[k].action for k in scored], [candidates[k].probability for k in scored],
                               [candidates[k].j_dec for k in scored], [candidates[k].j_gen for k in scored],
                               c.objective)
            for k, value in zip(scored, eq22):
                candidates[k].selection_score = float(value)
            chosen = scored[idx]
        elif scored:
            for k in scored:
                candidates[k].selection_score = candidates[k].j_gen
            chosen = max(scored, key=lambda k: candidates[k].j_gen)
        else:
            chosen = None
        if chosen is None or candidates[chosen].j_gen <= 0.0:
            why = ("the search produced no trajectory" if chosen is None else
                   "no feasible trajectory (every candidate's best has J_gen = 0: at-fault collision, "
                   "off the drivable area or against traffic)")
            reasons.append(f"{why}: comfortable stop")
            return self._finish(self._comfortable_stop(ego, keep), None, MODE_STOP, reasons, candidates, start, budget, stamp, planner_input,
                                search)
        action = candidates[chosen].action or None
        return self._finish(candidates[chosen].trajectory, action, mode, reasons, candidates, start, budget, stamp,
                            planner_input, search)

    def _comfortable_stop(self, ego: EgoState, path: ReferencePath) -> Trajectory:
        """Brake at the comfortable deceleration along ``path``, easing from the ego's lateral offset
        onto the path so the trajectory starts where the ego is."""
        c = self.config
        steps = int(round(c.output_horizon / c.objective.dt))
        stop = stopping_trajectory(ego, path.centerline, c.comfortable_deceleration, steps, c.objective.dt)
        poses = np.column_stack([stop.x, stop.y, stop.heading])[None]
        d0 = float(path.lateral_offset(np.array([ego.x, ego.y])))
        eased = blended_poses(poses, stop.velocity[None], d0, 0.0, c.keep_blend_times[-1], c.objective.dt)[0]
        return Trajectory(stop.stamp, stop.t, eased[:, 0], eased[:, 1], wrap_angle(eased[:, 2]), stop.velocity,
                          stop.acceleration)

    def _finish(self, trajectory: Trajectory, action: str | None, mode: str, reasons: list[str],
                candidates: list[CandidateResult], start: float, budget: float, stamp: float | None,
                planner_input: PlannerInput, search: ESResult | None = None) -> PlanResult:
        result = PlanResult(trajectory, action, mode, reasons, candidates, self.clock() - start, budget,
                            search.budget_cut if search else "", search.stages_done if search else [], stamp)
        self.last = result
        return result

