"""Simulation-grounded action scorer: the evidence of the teacher's scored voters (LUNA-AD Sec. III-B
with simulation in place of a large LLM; ``luna_core.teacher.ScoredVoterPool``).

For one frame (a scenario and a time, as written by ``luna-offline frames``) every allowed action is
executed from the expert's logged state at that time for ``horizon`` seconds against the LOGGED
agents (privileged hindsight: a teacher may know how the others actually drove), all actions of the
frame in one batch:

1. path: the action's reference lane (``planning.reference_paths``: K follows the route, also
   through junctions; L / R the neighbour lane continued along the route); a lane change blends the
   ego's lateral offset from its current lane onto the target lane over ``lane_change_time``
   (smoothstep), Stop follows K;
2. speed: IDM along that path behind the nearest logged agent in its corridor, its desired speed
   moving from the current speed v_t towards the action's target at a comfortable rate:
   A ``max(lambda v_t, v_bar)`` capped at the speed limit (the lower end of CALMM-Drive's accelerate interval, Eq. 5),
   C v_t, D ``gamma v_t / 1.5`` (inside the decelerate interval [0, gamma v_t)), S 0 at ``b_stop``;
3. the IDM poses are tracked by the simulator's LQR + kinematic bicycle (``control.simulate_proposals``);
4. outcome: the shared PDM-style scorer J_gen (at-fault collision, drivable area, driving direction,
   progress normalised over this frame's actions, TTC, comfort, and nuPlan's speed-limit term)
   times J_dec of CALMM-Drive Eq. 4 (did the rollout keep the action's lane and speed interval:
   an action the traffic does not let the ego execute, such as cruising into a stalled car that
   IDM has to brake for, scores low), times ``1 - lane_change_cost`` for L / R (a lane change that
   gains nothing is not worth its risk with agents that do not react to the ego);
5. one sentence that states what happened ("collides with v3 after 2.1 s", "makes 42 m of
   progress in 6 s, ending at 8.2 m/s").

``make_scorer`` is the factory for ``luna-offline collect --scorer luna_bridge.action_scorer:make_scorer``.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from luna_core.control import StateIndex, simulate_proposals, state_from_ego
from luna_core.geometry import proposals_vs_objects
from luna_core.idm import IDMParameters, idm_acceleration
from luna_core.lanes import Polyline, lane_map
from luna_core.planning.forecast import red_light_obstacles
from luna_core.planning.objectives import ObjectiveConfig, lane_following, speed_following, speed_interval
from luna_core.planning.proposals import corridor_leaders
from luna_core.planning.reference_paths import OffMapError, ReferencePath, reference_paths
from luna_core.planning.scorer import (CLS_WEIGHTS, ObjectBoxes, ProposalScores, ScorerWeights, ScoringContext,
                                       ego_corners, score_proposals)
from luna_core.scene import safe_id
from luna_core.teacher import ActionOutcome
from luna_core.types import (ACTION_INDEX, EgoState, ObjectClass, PlannerInput, SceneDescriptor, TrackedObjects,
                             wrap_angle)

from luna_bridge.scenario import SIM_DT, Scenario

FAR_AWAY = 1.0e6  # m: where an agent that is not (yet) in the log is parked, so it meets nothing


class ActionScorerError(ValueError):
    """The frame cannot be scored (no scenario in its context, time outside the log, off the map)."""


@dataclass(frozen=True)
class ActionScorerConfig:
    horizon: float = 6.0  # s of rollout
    dt: float = SIM_DT
    lane_change_time: float = 4.0  # s to move onto the target lane
    lane_change_cost: float = 0.1  # fraction of the score a lane change gives up
    agent_radius: float = 80.0  # m: agents that come closer than this during the horizon are simulated
    lon_rate: float = 1.5  # m/s^2: how fast the desired speed of A / D moves to its target
    idm: IDMParameters = IDMParameters(target_velocity=10.0, min_gap=1.0, headway=1.5, accel_max=1.5,
                                       decel_max=3.0, exponent=4.0)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # lambda, gamma, v_bar, b_stop
    weights: ScorerWeights = CLS_WEIGHTS  # the planner's J_gen weights (nuPlan's CLS weighting)
    dec_exponent: float = 2.0  # J_dec's weight against J_gen (the planner uses omega_dec = 5 for its search)
    cache_size: int = 4  # scenarios kept loaded (frames come sorted by scenario)

    @property
    def steps(self) -> int:
        return int(round(self.horizon / self.dt))


# --------------------------------------------------------------------------------------------------
# The frame: expert state and logged agents over the horizon
# --------------------------------------------------------------------------------------------------


def expert_state(scenario: Scenario, time: float, vehicle_wheelbase: float) -> EgoState:
    """The logged ego at ``time`` (rear axle): speed along the heading, acceleration and yaw rate by
    backward differences, the steering angle that yaw rate implies (so the tracker starts in a curve
    the way the expert was driving it)."""
    track = scenario.expert
    i = track.index_at(time)
    if i is None:
        raise ActionScorerError(f"{scenario.name}: the expert log has no state at t = {time:.2f} s")
    h = float(track.heading[i])
    v = float(track.vx[i] * math.cos(h) + track.vy[i] * math.sin(h))
    a = yaw_rate = 0.0
    j = track.index_at(time - SIM_DT)
    if j is not None:
        hj = float(track.heading[j])
        a = (v - float(track.vx[j] * math.cos(hj) + track.vy[j] * math.sin(hj))) / SIM_DT
        yaw_rate = float(wrap_angle(h - hj)) / SIM_DT
    steering = math.atan(yaw_rate * vehicle_wheelbase / v) if v > 0.5 else 0.0
    return EgoState(time, float(track.x[i]), float(track.y[i]), h, v, a, yaw_rate, steering)


def logged_agents(scenario: Scenario, ego: EgoState, time: float, steps: int, dt: float,
                  radius: float) -> ObjectBoxes:
    """Boxes of the logged agents at ``time + k dt`` (k = 0..steps). An agent whose log ends early
    runs on at its last velocity; before it appears it is parked far away."""
    ids, poses, sizes, speeds, static = [], [], [], [], []
    k = np.arange(steps + 1)
    for agent in scenario.agents:
        if len(agent.t) == 0:
            continue
        idx = np.round((time + k * dt - agent.t[0]) / SIM_DT).astype(int)
        inside = (idx >= 0) & (idx < len(agent.t))
        valid = np.zeros(len(k), dtype=bool)
        valid[inside] = np.isfinite(agent.x[idx[inside]])
        if not valid.any():
            continue
        safe = np.clip(idx, 0, len(agent.t) - 1)
        x, y, h = agent.x[safe].copy(), agent.y[safe].copy(), agent.heading[safe].copy()
        last = int(np.nonzero(valid)[0][-1])
        after = k > last
        if after.any():
            j = safe[last]
            extra = (k[after] - last) * dt
            x[after] = agent.x[j] + agent.vx[j] * extra
            y[after] = agent.y[j] + agent.vy[j] * extra
            h[after] = agent.heading[j]
        before = ~valid & ~after
        x[before], y[before], h[before] = FAR_AWAY, FAR_AWAY, 0.0
        present = ~before
        if np.min(np.hypot(x[present] - ego.x, y[present] - ego.y)) > radius:
            continue
        first = int(np.nonzero(present)[0][0])
        j = safe[first]
        ids.append(agent.id)
        poses.append(np.column_stack([x, y, h]))
        sizes.append((agent.length, agent.width))
        speeds.append(0.0 if agent.object_class is ObjectClass.STATIC else float(np.hypot(agent.vx[j], agent.vy[j])))
        static.append(agent.object_class is ObjectClass.STATIC)
    if not ids:
        return ObjectBoxes.empty(steps + 1)
    return ObjectBoxes(ids, np.stack(poses), np.array(sizes, dtype=np.float64), np.array(speeds),
                       np.array(static, dtype=bool), np.zeros(len(ids), dtype=bool))


def red_lights(scenario: Scenario, ego: EgoState, time: float, steps: int, dt: float,
               paths: Sequence[ReferencePath]) -> ObjectBoxes:
    """Red / yellow lights on the actions' lane sequences as static obstacles while they are red
    (``planning.forecast.red_light_obstacles`` at every step; parked far away while green)."""
    lanes = lane_map(scenario.lane_graph)
    boxes: dict[str, tuple[float, float, float, float, float]] = {}
    active: dict[str, np.ndarray] = {}
    for k in range(steps + 1):
        t = time + k * dt
        pin = PlannerInput(t, [ego], TrackedObjects(t, []), scenario.lights_at(t), scenario.lane_graph,
                           scenario.route, vehicle=scenario.vehicle)
        for path in paths:
            for box in red_light_obstacles(pin, lanes, list(path.lane_ids)):
                boxes[box[0]] = box[1:]
                active.setdefault(box[0], np.zeros(steps + 1, dtype=bool))[k] = True
    if not boxes:
        return ObjectBoxes.empty(steps + 1)
    ids = sorted(boxes)
    pose = np.empty((len(ids), steps + 1, 3))
    for n, i in enumerate(ids):
        x, y, h = boxes[i][:3]
        pose[n] = np.where(active[i][:, None], [x, y, h], [FAR_AWAY, FAR_AWAY, 0.0])
    size = np.array([boxes[i][3:5] for i in ids])
    return ObjectBoxes(ids, pose, size, np.zeros(len(ids)), np.ones(len(ids), dtype=bool),
                       np.ones(len(ids), dtype=bool))


def _concat(a: ObjectBoxes, b: ObjectBoxes) -> ObjectBoxes:
    return ObjectBoxes(a.ids + b.ids, np.concatenate([a.pose, b.pose]), np.concatenate([a.size, b.size]),
                       np.concatenate([a.speed, b.speed]), np.concatenate([a.static, b.static]),
                       np.concatenate([a.red_light, b.red_light]))


# --------------------------------------------------------------------------------------------------
# Rollouts
# --------------------------------------------------------------------------------------------------


@dataclass
class Rollouts:
    """P action rollouts on one time grid."""

    actions: list[str]
    poses: np.ndarray  # (P, T+1, 3) IDM reference poses
    velocity: np.ndarray  # (P, T+1) IDM speed
    leader: list[list[str | None]]  # per action and step: the agent IDM followed (None: free road)
    states: np.ndarray  # (P, T+1, 8) tracked by LQR + bicycle


def desired_speed(action: str, v0: float, speed_limit: float, steps: int, dt: float,
                  config: ActionScorerConfig) -> np.ndarray:
    """(T,) the IDM desired speed of ``action`` at steps 0..T-1 (see the module docstring); A never
    aims above the speed limit (at the limit, accelerating cannot be executed and J_dec says so)."""
    obj = config.objective
    t = np.arange(steps) * dt
    v0 = max(v0, 0.0)
    lon = action[0]
    if lon == "A":
        return np.minimum(v0 + config.lon_rate * t, max(min(obj.lam * v0, speed_limit), v0, obj.v_bar))
    if lon == "C":
        return np.full(steps, v0)
    if lon == "D":
        return np.maximum(v0 - config.lon_rate * t, obj.gamma * v0 / 1.5)
    return np.maximum(v0 - obj.stop_deceleration * t, 0.0)


def _blend_lane_change(path: Polyline, s: np.ndarray, offset0: float, duration: float, dt: float) -> np.ndarray:
    """Poses (T+1, 3) along ``path`` at arc lengths ``s`` with the lateral offset fading from
    ``offset0`` to 0 over ``duration`` (smoothstep); headings from the resulting positions."""
    base = path.interpolate(s)
    x = np.clip(np.arange(len(s)) * dt / duration, 0.0, 1.0)
    d = offset0 * (1.0 - x * x * (3.0 - 2.0 * x))
    xy = base[:, :2] + d[:, None] * np.column_stack([-np.sin(base[:, 2]), np.cos(base[:, 2])])
    step = np.diff(xy, axis=0)
    moving = np.hypot(step[:, 0], step[:, 1]) > 1e-3
    h = np.where(moving, np.arctan2(step[:, 1], step[:, 0]), base[:-1, 2])
    heading = np.concatenate([h, h[-1:]])
    return np.column_stack([xy, heading])


def rollout(ego: EgoState, actions: Sequence[str], paths: Mapping[str, ReferencePath], objects: ObjectBoxes,
            scenario_vehicle: Any, config: ActionScorerConfig) -> Rollouts:
    """IDM rollouts of ``actions`` along their reference lanes, tracked by LQR + bicycle."""
    steps, dt = config.steps, config.dt
    lateral = [a[1] if a[0] != "S" else "K" for a in actions]
    codes = sorted(set(lateral))
    polylines = [paths[c].centerline for c in codes]
    which = np.array([codes.index(c) for c in lateral])
    p = len(actions)
    start = np.array([float(paths[c].centerline.project(np.array([ego.x, ego.y])).s) for c in codes])[which]
    s = np.zeros((p, steps + 1))
    v = np.zeros((p, steps + 1))
    s[:, 0] = start
    v[:, 0] = max(ego.velocity, 0.0)
    target = np.stack([desired_speed(a, ego.velocity, paths[lat].speed_limit, steps, dt, config)
                       for a, lat in zip(actions, lateral)])
    leader: list[list[str | None]] = [[None] * (steps + 1) for _ in actions]
    n = objects.num_objects
    if n:
        per_path = [corridor_leaders(line, objects, scenario_vehicle) for line in polylines]
        rear, blocks, v_along, half = (np.stack([pp[i] for pp in per_path])[which] for i in range(4))
        centre = rear + half
    rows = np.arange(p)
    for k in range(steps):
        gap, lead_v = np.full(p, np.inf), np.zeros(p)
        if n:
            ahead = blocks[:, :, k] & (centre[:, :, k] > s[:, k, None])
            g = np.where(ahead, rear[:, :, k] - (s[:, k, None] + scenario_vehicle.front_length), np.inf)
            j = np.argmin(g, axis=1)
            gap, lead_v = g[rows, j], np.maximum(v_along[rows, j, k], 0.0)
            for r in np.nonzero(np.isfinite(gap))[0]:
                leader[r][k] = objects.ids[j[r]]
        # IDM with a desired speed of 0 would divide by zero: below 0.1 m/s the action wants to stand.
        acc = idm_acceleration(v[:, k], gap, lead_v, config.idm, np.maximum(target[:, k], 0.1))
        acc = np.where(target[:, k] < 0.1, -config.idm.decel_max, acc)
        s[:, k + 1] = s[:, k] + v[:, k] * dt
        v[:, k + 1] = np.maximum(v[:, k] + acc * dt, 0.0)
        s[:, k + 1] = np.maximum(s[:, k + 1], s[:, k])
    poses = np.empty((p, steps + 1, 3))
    for r, code in enumerate(lateral):
        line = polylines[which[r]]
        if code == "K":
            poses[r] = line.interpolate(s[r])
        else:
            offset0 = float(line.project(np.array([ego.x, ego.y])).lateral)
            poses[r] = _blend_lane_change(line, s[r], offset0, config.lane_change_time, dt)
    poses[:, 0] = (ego.x, ego.y, ego.heading)
    states = simulate_proposals(state_from_ego(ego), poses, scenario_vehicle)
    return Rollouts(list(actions), poses, v, leader, states)


# --------------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------------


def _first_collision(states: np.ndarray, objects: ObjectBoxes, vehicle: Any, step: int) -> str:
    """The id of the object the ego overlaps at ``step`` (for the reason sentence)."""
    if objects.num_objects == 0:
        return "an object"
    ego = ego_corners(states[None, :, :], vehicle)[:, step:step + 1]
    hit = proposals_vs_objects(ego, objects.corners()[:, step:step + 1], backend="numpy")[0, :, 0]
    if not hit.any():
        return "an object"
    oid = objects.ids[int(np.argmax(hit))]
    return "a red light" if oid.startswith("red_light:") else safe_id(oid)


def outcome_reason(action: str, r: int, roll: Rollouts, scores: ProposalScores, j_dec: float,
                   objects: ObjectBoxes, vehicle: Any, config: ActionScorerConfig) -> str:
    """One sentence naming what decided the score of rollout ``r``."""
    horizon = f"{config.horizon:.0f} s"
    if scores.no_at_fault_collision[r] < 1.0:
        t = float(scores.time_to_at_fault_collision[r])
        who = _first_collision(roll.states[r], objects, vehicle, int(round(t / config.dt)))
        return f"collides with {who} after {t:.1f} s"
    if scores.drivable_area[r] < 1.0:
        return f"leaves the drivable area within {horizon}"
    if scores.driving_direction[r] < 1.0:
        return f"drives against the traffic flow within {horizon}"
    v = roll.states[r, :, StateIndex.VELOCITY]
    parts = [f"makes {max(float(scores.raw_progress[r]), 0.0):.0f} m of progress in {horizon}, "
             f"ending at {float(v[-1]):.1f} m/s"]
    if j_dec < 0.9:
        k = int(np.argmin(roll.velocity[r, :-1]))
        who = roll.leader[r][k]
        behind = f" behind {safe_id(who)}" if who else ""
        parts.append(f"cannot hold the {action} speed band (slows to {float(roll.velocity[r, k]):.1f} m/s{behind})"
                     if action[0] in "AC" else f"cannot keep to the {action} lane and speed targets")
    if scores.ttc[r] < 1.0:
        parts.append("its time to collision drops below 1 s")
    if scores.comfort[r] < 1.0:
        parts.append("it exceeds the comfort limits")
    if scores.speed_limit[r] < 1.0:
        parts.append("it exceeds the speed limit")
    return "; ".join(parts)


class SimulationActionScorer:
    """``luna_core.teacher.ActionScorer`` by rollouts in the frame's logged scenario (module docstring)."""

    def __init__(self, config: ActionScorerConfig | None = None) -> None:
        self.config = config or ActionScorerConfig()
        self._scenarios: OrderedDict[str, Scenario] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Sent to worker processes / Ray actors (``luna-offline collect --executor``): the settings
        # only; each copy loads its own scenarios.
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])

    def scenario(self, context: Mapping[str, Any]) -> Scenario:
        """The frame's scenario, loaded from ``context['file']`` (cached)."""
        source = str(context.get("file") or "")
        if not source:
            raise ActionScorerError(f"frame {context.get('frame', '?')}: the context names no scenario file "
                                    f"(keys: {sorted(context)})")
        with self._lock:
            hit = self._scenarios.get(source)
            if hit is not None:
                self._scenarios.move_to_end(source)
                return hit
        from luna_bridge.scenarios.registry import COMMONROAD_LOADER, FILE_LOADER, load_entry

        scenario = load_entry(source, COMMONROAD_LOADER if source.endswith(".xml") else FILE_LOADER)
        with self._lock:
            self._scenarios[source] = scenario
            while len(self._scenarios) > self.config.cache_size:
                self._scenarios.popitem(last=False)
        return scenario

    def score(self, scene: SceneDescriptor, context: Mapping[str, Any],
              actions: Sequence[str]) -> dict[str, ActionOutcome]:
        if "time" not in context:
            raise ActionScorerError(f"frame {context.get('frame', '?')}: the context has no time")
        return self.score_scenario(self.scenario(context), float(context["time"]), actions)

    def score_scenario(self, scenario: Scenario, time: float, actions: Sequence[str],
                       ego: EgoState | None = None) -> dict[str, ActionOutcome]:
        """Outcomes of ``actions`` executed from ``ego`` at ``time`` in ``scenario`` against its logged
        agents: by default the expert's logged state (the teacher); the oracle decision source passes
        the closed-loop ego state of the run it decides for."""
        cfg = self.config
        for a in actions:
            if a not in ACTION_INDEX:
                raise ActionScorerError(f"unknown action code {a!r}")
        if ego is None:
            ego = expert_state(scenario, time, scenario.vehicle.wheelbase)
        elif not ego.is_finite():
            raise ActionScorerError(f"{scenario.name} at t = {time:.2f} s: the ego state is not finite")
        try:
            paths = reference_paths(scenario.lane_graph, scenario.route, ego, ahead=max(ego.velocity, 5.0)
                                    * cfg.horizon * 1.5 + 40.0)
        except OffMapError as exc:
            raise ActionScorerError(f"{scenario.name} at t = {time:.2f} s: {exc}") from exc
        outcomes: dict[str, ActionOutcome] = {}
        feasible = []
        for a in actions:
            lateral = a[1] if a[0] != "S" else "K"
            if lateral in paths:
                feasible.append(a)
            else:  # the scene allows it but the map has no such lane here: it cannot be executed
                outcomes[a] = ActionOutcome(0.0, False, 0.0, f"there is no lane to the {'left' if lateral == 'L' else 'right'}")
        if not feasible:
            return outcomes
        steps = cfg.steps
        objects = _concat(logged_agents(scenario, ego, time, steps, cfg.dt, cfg.agent_radius),
                          red_lights(scenario, ego, time, steps, cfg.dt, list(paths.values())))
        roll = rollout(ego, feasible, paths, objects, scenario.vehicle, cfg)
        ctx = ScoringContext(lane_map(scenario.lane_graph), paths["K"].centerline, objects, paths["K"].speed_limit,
                             scenario.vehicle, cfg.dt)
        scores = score_proposals(roll.states, ctx, cfg.weights)
        obj_cfg = replace(cfg.objective, horizon_steps=steps, dt=cfg.dt)
        lane_changed = np.arange(1, steps + 1) * cfg.dt >= cfg.lane_change_time
        for r, a in enumerate(feasible):
            lateral = a[1] if a[0] != "S" else "K"
            # J_dec (CALMM-Drive Eq. 4); for a lane change J_lane counts only the steps after the
            # blend onto the target lane (before, the ego is meant to be between the lanes).
            offsets = paths[lateral].lateral_offset(roll.states[r, 1:, :2])
            kept = offsets if lateral == "K" or not lane_changed.any() else offsets[lane_changed]
            lo, hi = speed_interval(a, ego.velocity, obj_cfg)
            j_dec = float(lane_following(kept[None], obj_cfg)[0]
                          * speed_following(roll.states[r, 1:, StateIndex.VELOCITY][None], lo, hi, obj_cfg)[0])
            total = float(scores.total[r]) * j_dec ** cfg.dec_exponent * (1.0 - cfg.lane_change_cost if lateral != "K" else 1.0)
            outcomes[a] = ActionOutcome(float(np.clip(total, 0.0, 1.0)), bool(scores.no_at_fault_collision[r] < 1.0),
                                        float(scores.raw_progress[r]),
                                        outcome_reason(a, r, roll, scores, j_dec, objects, scenario.vehicle, cfg))
        return outcomes


def make_scorer() -> SimulationActionScorer:
    """Factory for ``luna-offline collect --scorer luna_bridge.action_scorer:make_scorer``."""
    return SimulationActionScorer()
