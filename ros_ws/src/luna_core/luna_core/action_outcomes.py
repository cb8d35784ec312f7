"""What executing each action from an ego state leads to: the simulation-grounded evidence shared by
the teacher's scored voters (LUNA-AD Sec. III-B with simulation in place of a large LLM), the oracle
decision source and the reflection's hindsight check.

Every action is executed from ``ego`` for ``horizon`` seconds against given object boxes over that
horizon (the logged agents for the teacher and the oracle, what perception saw afterwards for the
hindsight check), all actions in one batch:

1. path: the action's reference lane (``planning.reference_paths``: K follows the route, also
   through junctions; L / R the neighbour lane continued along the route); a lane change blends the
   ego's lateral offset from its current lane onto the target lane over ``lane_change_time`` and at
   least ``lane_change_distance`` of travel (smoothstep; a slow ego cannot move sideways faster than
   it moves on), Stop follows K;
2. speed: IDM along that path behind the nearest object in its corridor, its desired speed moving
   from the current speed v_t towards the action's target at a comfortable rate:
   A ``max(lambda v_t, v_bar)`` capped at the speed limit (the lower end of CALMM-Drive's accelerate
   interval, Eq. 5), C v_t, D ``gamma v_t / 1.5`` (inside the decelerate interval [0, gamma v_t)),
   S 0 at ``b_stop``;
3. the IDM poses are tracked by the simulator's LQR + kinematic bicycle (``control.simulate_proposals``);
4. outcome: the shared PDM-style scorer J_gen (at-fault collision, drivable area with nuPlan's 0.3 m
   tolerance on the nearer of the tracked and the reference footprint, ``drivable_with_tolerance``, driving direction,
   progress normalised over these actions, TTC, comfort, and nuPlan's speed-limit term) times J_dec of
   CALMM-Drive Eq. 4 (did the rollout keep the action's lane and speed interval, A's as its free-road
   IDM speed reaches it, ``reachable_interval``: an action the traffic does not let the ego execute,
   such as cruising into a stalled car that IDM has to brake for, scores low), times
   ``1 - lane_change_cost`` for L / R (a lane change that gains nothing is not worth its risk with
   agents that do not react to the ego), times nuPlan's making-progress multiplier where the caller
   knows how far the expert drove over the horizon (the teacher and the oracle: 0 when the
   rollout makes less than ``min_progress_ratio`` of the expert's progress, the expert moved at least
   ``min_expert_progress`` and another action makes enough; without it a stop where the expert drove
   on scores like a safe action, and the oracle stalls where the traffic lets the expert pass);
5. one sentence that states what happened ("collides with v3 after 2.1 s", "makes 42 m of progress
   in 6 s, ending at 8.2 m/s").

Red and yellow lights on the actions' lane sequences become static obstacles while they are red
(``red_light_boxes``, from a function giving the lights at any time of the horizon).
``score_actions`` is the entry point; where the object boxes come from is the caller's business
(``luna_bridge.action_scorer``: the scenario log; ``luna_core.hindsight``: the perceived tracks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from luna_core.control import StateIndex, simulate_proposals, state_from_ego
from luna_core.geometry import proposals_vs_objects
from luna_core.idm import IDMParameters, idm_acceleration
from luna_core.lanes import LaneMap, Polyline, lane_map
from luna_core.planning.forecast import red_light_obstacles
from luna_core.planning.objectives import ObjectiveConfig, lane_following, speed_following, speed_interval
from luna_core.planning.proposals import corridor_leaders
from luna_core.planning.reference_paths import OffMapError, ReferencePath, reference_paths
from luna_core.planning.scorer import (CLS_WEIGHTS, ObjectBoxes, ProposalScores, ScorerWeights, ScoringContext,
                                       ego_corners, score_proposals)
from luna_core.scene import safe_id
from luna_core.teacher import ActionOutcome
from luna_core.types import (ACTION_INDEX, EgoState, LaneGraph, PlannerInput, Route, TrackedObjects, TrafficLights,
                             VehicleParameters)

FAR_AWAY = 1.0e6  # m: where an object that is not (yet) there is parked, so it meets nothing
#: Below this J_dec, or with its final speed outside the action's band (by more than the tolerance),
#: the traffic did not let the rollout execute the action as asked (e.g. "accelerate" that IDM had to
#: brake to a stop behind a stopped car): the reason says so, and hindsight does not propose it.
EXECUTABLE_J_DEC = 0.9
END_SPEED_TOLERANCE = 0.25  # m/s
ROLLOUT_DT = 0.1  # s: the rollouts' time step (nuPlan's simulation step)


class ActionScorerError(ValueError):
    """The actions cannot be scored (unknown code, non-finite ego state, off the map, no scenario)."""


@dataclass(frozen=True)
class ActionScorerConfig:
    horizon: float = 6.0  # s of rollout
    dt: float = ROLLOUT_DT
    lane_change_time: float = 4.0  # s to move onto the target lane
    lane_change_distance: float = 12.0  # m travelled at least while moving onto it (matters below 3 m/s)
    lane_change_cost: float = 0.1  # fraction of the score a lane change gives up
    agent_radius: float = 80.0  # m: agents that come closer than this during the horizon are simulated
    lon_rate: float = 1.5  # m/s^2: how fast the desired speed of A / D moves to its target
    idm: IDMParameters = IDMParameters(target_velocity=10.0, min_gap=1.0, headway=1.5, accel_max=1.5,
                                       decel_max=3.0, exponent=4.0)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # lambda, gamma, v_bar, b_stop
    weights: ScorerWeights = CLS_WEIGHTS  # the planner's J_gen weights (nuPlan's CLS weighting)
    dec_exponent: float = 2.0  # J_dec's weight against J_gen (the planner uses omega_dec = 5 for its search)
    # nuPlan's ego_is_making_progress: ratio to the expert's progress and the expert's progress below
    # which the metric does not apply (m)
    min_progress_ratio: float = 0.2
    min_expert_progress: float = 2.0
    cache_size: int = 4  # scenarios kept loaded (frames come sorted by scenario)
    # A's band as a comfortable ramp reaches it (``reachable_interval``). False: Eq. 5's band from the first
    # step, the teacher ``models/memory_bank`` was labelled with (before 5bbf0d1): new items labelled so
    # (e.g. on-policy frames, ``make_bundled_bank_scorer``) agree with that bank's labels.
    reachable_accelerate: bool = True
    # m a footprint corner may stick out of the drivable area (nuPlan's drivable_area_compliance
    # tolerance), judged per step on the nearer of the tracked footprint and the action's reference
    # footprint (``drivable_with_tolerance``). None: every tracked corner strictly inside (PDM-Closed's
    # term), as ``models/memory_bank`` was labelled (before session 29).
    drivable_tolerance: float | None = 0.3

    @property
    def steps(self) -> int:
        return int(round(self.horizon / self.dt))


# --------------------------------------------------------------------------------------------------
# Objects over the horizon
# --------------------------------------------------------------------------------------------------


def red_light_boxes(lights_at: Callable[[float], TrafficLights], lane_graph: LaneGraph, route: Route,
                    vehicle: VehicleParameters, ego: EgoState, time: float, steps: int, dt: float,
                    paths: Sequence[ReferencePath]) -> ObjectBoxes:
    """Red / yellow lights on the actions' lane sequences as static obstacles while they are red
    (``planning.forecast.red_light_obstacles`` at every step; parked far away while green)."""
    lanes = lane_map(lane_graph)
    boxes: dict[str, tuple[float, float, float, float, float]] = {}
    active: dict[str, np.ndarray] = {}
    for k in range(steps + 1):
        t = time + k * dt
        pin = PlannerInput(t, [ego], TrackedObjects(t, []), lights_at(t), lane_graph, route, vehicle=vehicle)
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


def concat_boxes(a: ObjectBoxes, b: ObjectBoxes) -> ObjectBoxes:
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
    on_target_lane: np.ndarray  # (P, T+1) bool: the lane change (if any) is complete
    free_velocity: np.ndarray  # (P, T+1) IDM speed on a free road: what the action alone asks for


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


def reachable_interval(action: str, v0: float, free_velocity: np.ndarray,
                       objective: ObjectiveConfig) -> tuple[np.ndarray, np.ndarray]:
    """The action's speed interval (``speed_interval``, CALMM-Drive Eq. 5) as the rollout can reach
    it: A's lower bound rises from v0 no faster than the action's own free-road IDM speed
    ``free_velocity`` (T,) does. Eq. 5 asks for the higher speed from the first step, which no
    comfortable acceleration gives; held to that, every A rollout lost J_dec to its own ramp while C
    kept its speed untouched, so the teacher answered C on free roads far below the limit, and the
    student and the planner's C band after it held a slow car slow. Traffic that keeps the ego below
    its free-road ramp (a leader, a red light) still counts against A. A whose target is not above v0
    (at the speed limit) keeps Eq. 5's bound: accelerating cannot be executed there. D keeps its bound:
    relaxed the same way, slowing behind a stalled car outscored the lane change around it (J_gen's
    progress weight is small), the opposite of the failure this fixes."""
    lo, hi = speed_interval(action, v0, objective)
    if action[0] == "A" and free_velocity[-1] > max(v0, 0.0) + END_SPEED_TOLERANCE:
        lo = np.minimum(lo, free_velocity)
    return lo, hi


def _blend_lane_change(path: Polyline, s: np.ndarray, offset0: float, duration: float, distance: float,
                       dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Poses (T+1, 3) along ``path`` at arc lengths ``s`` with the lateral offset fading from
    ``offset0`` to 0 over ``duration`` and at least ``distance`` of travel (smoothstep; from
    standstill a time-only blend would move the ego sideways on the spot), headings from the
    resulting positions; and the blend's progress (T+1,) in [0, 1]."""
    base = path.interpolate(s)
    x = np.clip(np.minimum(np.arange(len(s)) * dt / duration, (s - s[0]) / distance), 0.0, 1.0)
    d = offset0 * (1.0 - x * x * (3.0 - 2.0 * x))
    xy = base[:, :2] + d[:, None] * np.column_stack([-np.sin(base[:, 2]), np.cos(base[:, 2])])
    step = np.diff(xy, axis=0)
    moving = np.hypot(step[:, 0], step[:, 1]) > 1e-3
    h = np.where(moving, np.arctan2(step[:, 1], step[:, 0]), base[:-1, 2])
    heading = np.concatenate([h, h[-1:]])
    return np.column_stack([xy, heading]), x


def rollout(ego: EgoState, actions: Sequence[str], paths: Mapping[str, ReferencePath], objects: ObjectBoxes,
            scenario_vehicle: VehicleParameters, config: ActionScorerConfig) -> Rollouts:
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
    v_free = v.copy()
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
        desired = np.maximum(target[:, k], 0.1)
        stand = target[:, k] < 0.1
        acc = np.where(stand, -config.idm.decel_max, idm_acceleration(v[:, k], gap, lead_v, config.idm, desired))
        free = np.where(stand, -config.idm.decel_max,
                        idm_acceleration(v_free[:, k], np.full(p, np.inf), np.zeros(p), config.idm, desired))
        s[:, k + 1] = s[:, k] + v[:, k] * dt
        v[:, k + 1] = np.maximum(v[:, k] + acc * dt, 0.0)
        v_free[:, k + 1] = np.maximum(v_free[:, k] + free * dt, 0.0)
        s[:, k + 1] = np.maximum(s[:, k + 1], s[:, k])
    poses = np.empty((p, steps + 1, 3))
    on_target = np.ones((p, steps + 1), dtype=bool)
    for r, code in enumerate(lateral):
        line = polylines[which[r]]
        if code == "K":
            poses[r] = line.interpolate(s[r])
        else:
            offset0 = float(line.project(np.array([ego.x, ego.y])).lateral)
            poses[r], blend = _blend_lane_change(line, s[r], offset0, config.lane_change_time,
                                                 config.lane_change_distance, dt)
            on_target[r] = blend >= 1.0
    poses[:, 0] = (ego.x, ego.y, ego.heading)
    states = simulate_proposals(state_from_ego(ego), poses, scenario_vehicle)
    return Rollouts(list(actions), poses, v, leader, states, on_target, v_free)


# --------------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------------


def _first_collision(states: np.ndarray, objects: ObjectBoxes, vehicle: VehicleParameters, step: int) -> str:
    """The id of the object the ego overlaps at ``step`` (for the reason sentence)."""
    if objects.num_objects == 0:
        return "an object"
    ego = ego_corners(states[None, :, :], vehicle)[:, step:step + 1]
    hit = proposals_vs_objects(ego, objects.corners()[:, step:step + 1], backend="numpy")[0, :, 0]
    if not hit.any():
        return "an object"
    oid = objects.ids[int(np.argmax(hit))]
    return "a red light" if oid.startswith("red_light:") else safe_id(oid)


def outcome_reason(action: str, r: int, roll: Rollouts, scores: ProposalScores, executable: bool,
                   objects: ObjectBoxes, vehicle: VehicleParameters, config: ActionScorerConfig) -> tuple[str, str]:
    """One sentence naming what decided the score of rollout ``r``, and the decisive problem in a few
    words for the teacher's brief answer ("" when the rollout has none)."""
    horizon = f"{config.horizon:.0f} s"
    if scores.no_at_fault_collision[r] < 1.0:
        t = float(scores.time_to_at_fault_collision[r])
        who = _first_collision(roll.states[r], objects, vehicle, int(round(t / config.dt)))
        return f"collides with {who} after {t:.1f} s", f"hits {who} in {t:.1f} s"
    if scores.drivable_area[r] < 1.0:
        return f"leaves the drivable area within {horizon}", "leaves the road"
    if scores.driving_direction[r] < 1.0:
        return f"drives against the traffic flow within {horizon}", "drives against traffic"
    if scores.no_reversing[r] < 1.0:
        return f"drives backwards within {horizon}", "reverses"
    v = roll.states[r, :, StateIndex.VELOCITY]
    parts = [f"makes {max(float(scores.raw_progress[r]), 0.0):.0f} m of progress in {horizon}, "
             f"ending at {float(v[-1]):.1f} m/s"]
    issues = []
    if not executable:
        k = int(np.argmin(roll.velocity[r, :-1]))
        lowest, who = float(roll.velocity[r, k]), roll.leader[r][k]
        behind = f" behind {safe_id(who)}" if who else ""
        if lowest < float(roll.velocity[r, 0]) - 0.5:
            detail = f"slows to {lowest:.1f} m/s{behind}"
        elif who:  # held from the start, e.g. standing behind a stopped car
            detail = f"stays at {lowest:.1f} m/s{behind}"
        else:  # never slower than at the start: it just does not reach the band (e.g. the speed limit)
            detail = f"reaches {float(v[-1]):.1f} m/s"
        if action[0] in "AC":
            parts.append(f"cannot hold the {action} speed band ({detail})")
            issues.append(f"blocked{behind or ' (cannot hold speed)'}")
        else:
            parts.append(f"cannot keep to the {action} lane and speed targets")
            issues.append("misses its lane or speed")
    for term, sentence, brief in ((scores.ttc, "its time to collision drops below 1 s", "TTC below 1 s"),
                                  (scores.comfort, "it exceeds the comfort limits", "uncomfortable"),
                                  (scores.speed_limit, "it exceeds the speed limit", "over the speed limit")):
        if term[r] < 1.0:
            parts.append(sentence)
            issues.append(brief)
    return "; ".join(parts), (issues[0] if issues else "")


def _corner_distance_outside(lanes: LaneMap, corners: np.ndarray) -> np.ndarray:
    """(P, T) the largest distance (m) of a footprint corner outside the drivable area, for corners
    (P, T, 4, 2); exact distances only for the corners the raster puts outside (most are inside)."""
    outside = ~lanes.in_drivable_area(corners)
    dist = np.zeros(corners.shape[:3])
    if outside.any():
        dist[outside] = lanes.distance_to_drivable_area(corners[outside])
    return dist.max(axis=2)


def drivable_with_tolerance(roll: Rollouts, lanes: LaneMap, vehicle: VehicleParameters,
                            tolerance: float) -> np.ndarray:
    """(P,) 1 where, at every step after the first, the tracked footprint or the action's reference
    footprint (its IDM poses on the action's lane) lies within ``tolerance`` of the drivable area, else 0.

    Why not the tracked footprint alone: the rollout tracks one 6 s reference open loop, and nuPlan's
    LQR unwinds the steering slowly at low speed, so out of a tight turn the track drifts ~1 m off the
    lane (the 3.3 m radius driveway exits of USA_Peach-3 at 2 m/s, on lanelets ~0.4 m wider than the
    car), where the stack's planner, re-planning every 0.5 s on its own tracked footprint, stays on
    it; held to the open-loop track, every action but Stop "left the road" there and the oracle stood
    still. Why not the reference alone: the ego itself may stand off its lane (an on-policy state),
    and the reference jumps onto the lane at the first step. The tolerance is the metric's."""
    corners = ego_corners(roll.states[:, 1:], vehicle)  # (P, T, 4, 2)
    ref = np.zeros(roll.poses[:, 1:].shape[:2] + (roll.states.shape[2],))
    ref[..., :3] = roll.poses[:, 1:]
    reference = ego_corners(ref, vehicle)
    worst = np.minimum(_corner_distance_outside(lanes, corners), _corner_distance_outside(lanes, reference))
    return np.all(worst <= tolerance, axis=1).astype(np.float64)


def score_actions(ego: EgoState, time: float, actions: Sequence[str], lane_graph: LaneGraph, route: Route,
                  vehicle: VehicleParameters, agents: ObjectBoxes, lights_at: Callable[[float], TrafficLights],
                  config: ActionScorerConfig | None = None, where: str = "",
                  expert_progress: float | None = None) -> dict[str, ActionOutcome]:
    """Outcomes of ``actions`` executed from ``ego`` at ``time`` against ``agents`` (boxes on the
    rollout grid ``time + k dt``, k = 0..steps) and the lights ``lights_at(t)`` (module docstring).
    ``where`` names the frame in errors (e.g. the scenario); ``expert_progress`` (m over the
    horizon, None where no expert is known) turns on the making-progress multiplier."""
    cfg = config or ActionScorerConfig()
    where = f"{where} at t = {time:.2f} s" if where else f"t = {time:.2f} s"
    for a in actions:
        if a not in ACTION_INDEX:
            raise ActionScorerError(f"unknown action code {a!r}")
    if not ego.is_finite():
        raise ActionScorerError(f"{where}: the ego state is not finite")
    if agents.pose.shape[1] != cfg.steps + 1:
        raise ActionScorerError(f"{where}: object boxes cover {agents.pose.shape[1]} steps, the rollouts "
                                f"{cfg.steps + 1}")
    try:
        paths = reference_paths(lane_graph, route, ego, ahead=max(ego.velocity, 5.0) * cfg.horizon * 1.5 + 40.0)
    except OffMapError as exc:
        raise ActionScorerError(f"{where}: {exc}") from exc
    outcomes: dict[str, ActionOutcome] = {}
    feasible = []
    for a in actions:
        lateral = a[1] if a[0] != "S" else "K"
        if lateral in paths:
            feasible.append(a)
        else:  # the scene allows it but the map has no such lane here: it cannot be executed
            side = "left" if lateral == "L" else "right"
            outcomes[a] = ActionOutcome(0.0, False, 0.0, f"there is no lane to the {side}", f"no {side} lane")
    if not feasible:
        return outcomes
    steps = cfg.steps
    objects = concat_boxes(agents, red_light_boxes(lights_at, lane_graph, route, vehicle, ego, time, steps, cfg.dt,
                                                   list(paths.values())))
    roll = rollout(ego, feasible, paths, objects, vehicle, cfg)
    ctx = ScoringContext(lane_map(lane_graph), paths["K"].centerline, objects, paths["K"].speed_limit, vehicle, cfg.dt)
    drivable = (None if cfg.drivable_tolerance is None
                else drivable_with_tolerance(roll, ctx.lanes, vehicle, cfg.drivable_tolerance))
    scores = score_proposals(roll.states, ctx, cfg.weights, drivable)
    obj_cfg = replace(cfg.objective, horizon_steps=steps, dt=cfg.dt)
    too_little = np.zeros(len(feasible), dtype=bool)
    if expert_progress is not None and expert_progress >= cfg.min_expert_progress:
        too_little = np.asarray(scores.raw_progress) < cfg.min_progress_ratio * expert_progress
        if too_little.all():  # e.g. far behind the expert: the multiplier cannot rank, it would only erase
            too_little[:] = False
    for r, a in enumerate(feasible):
        lateral = a[1] if a[0] != "S" else "K"
        # J_dec (CALMM-Drive Eq. 4); for a lane change J_lane counts only the steps after the
        # blend onto the target lane (before, the ego is meant to be between the lanes).
        offsets = paths[lateral].lateral_offset(roll.states[r, 1:, :2])
        changed = roll.on_target_lane[r, 1:]
        kept = offsets if lateral == "K" or not changed.any() else offsets[changed]
        lo, hi = (reachable_interval(a, ego.velocity, roll.free_velocity[r, 1:], obj_cfg) if cfg.reachable_accelerate
                  else speed_interval(a, ego.velocity, obj_cfg))
        speed = roll.states[r, 1:, StateIndex.VELOCITY]
        j_dec = float(lane_following(kept[None], obj_cfg)[0] * speed_following(speed[None], lo, hi, obj_cfg)[0])
        # Executed as asked: J_dec high and the speed ends inside the action's band (an "accelerate"
        # that IDM brakes to a crawl behind a stopped car by the end of the horizon is no acceleration).
        executable = bool(j_dec >= EXECUTABLE_J_DEC
                          and lo[-1] - END_SPEED_TOLERANCE <= speed[-1] <= hi[-1] + END_SPEED_TOLERANCE)
        total = float(scores.total[r]) * j_dec ** cfg.dec_exponent * (1.0 - cfg.lane_change_cost if lateral != "K" else 1.0)
        reason, issue = outcome_reason(a, r, roll, scores, executable, objects, vehicle, cfg)
        if too_little[r]:
            total = 0.0
            reason += f"; too little progress (the expert drove {expert_progress:.0f} m)"
            issue = issue or "too little progress"
        outcomes[a] = ActionOutcome(float(np.clip(total, 0.0, 1.0)), bool(scores.no_at_fault_collision[r] < 1.0),
                                    float(scores.raw_progress[r]), reason, issue, j_dec=j_dec, executable=executable)
    return outcomes
