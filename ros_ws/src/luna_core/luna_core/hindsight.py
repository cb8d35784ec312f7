"""Hindsight-grounded reflection: what each alternative of a failed decision would have led to.

LUNA-AD's reflection (Sec. III-E2, Eq. 29) asks a reasoning model to revise a failed decision from the
question, the answer and the failure. A revision that is never checked can poison the memory bank
("accelerate" written as the lesson of standing behind a stopped car). Here every revision is grounded
first: from the state at the decision's stamp, each allowed action is rolled out with the SAME
machinery as the simulation-grounded teacher (``action_outcomes.score_actions``: IDM along the
action's reference lane, LQR tracking, PDM-style score x J_dec, a reason sentence) against what was
observed AFTER the decision: the perceived tracks of the next seconds (the vehicle's
``reflection_client`` buffers them; ``luna-bridge reflect`` reads them from the run's log), the lights
as they turned, the map.

The verdict (``hindsight_check``):

* an action is **safe** when its rollout has no at-fault collision, scores above 0 (it stays on the
  drivable area and with the traffic flow), is executable as asked (``ActionOutcome.executable``: J_dec high and the
  final speed in the action's band; "accelerate" that IDM had to brake to a crawl behind a stopped car
  is not) and does not stall: its progress over the horizon stays below v_th times the horizon
  while another such action makes more (standing is no stall when no action could have made
  progress: a red light, a queue);
* the **best** action is the safe one with the highest score;
* a **revision** is due when the best action is not the executed one and the executed one was not
  safe, or scored ``min_gain`` lower. The grounded answer ranks the best action first, then the
  other safe actions within ``margin`` of it, each with the teacher's brief rationale of its hindsight
  rollout (the decisive object, what it led to; the first one also says what the executed one led to);
* otherwise nothing is to be written: the executed decision was as good as any (a failure of its
  execution, or one no decision could avoid).

``HindsightVerdict.disagreement`` checks another answer (an LLM's rewrite) against the verdict: its
first action must be the best one and none of its actions may be unsafe in hindsight.

``HindsightRecorder`` buffers what a node sees (odometry, objects, lights, scenes, map, route) and cuts
the ``HindsightObservation`` of one decision once its horizon has been observed. The observation is
JSON-safe, so a reflection request carries it durably (``reflection.Outbox``) and the check can be run
again later (``reflection.audit_reflections``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from luna_core.action_outcomes import FAR_AWAY, ActionScorerConfig, ActionScorerError, score_actions
from luna_core.lane_graph_io import LaneGraphError, lane_graph_from_dict, lane_graph_to_dict
from luna_core.planning.forecast import STOP_PHASES
from luna_core.planning.scorer import ObjectBoxes
from luna_core.prompts.parsers import format_ranked_answer
from luna_core.scene import scene_from_dict, scene_to_dict
from luna_core.stamped import StampedBuffer
from luna_core.teacher import ActionOutcome, brief_rationale
from luna_core.types import (Action, DecisionDistribution, EgoState, FailureEvent, Lane, LaneGraph, ObjectClass, Route,
                             SceneDescriptor, TrackedObjects, TrafficLightPhase, TrafficLights, TrafficLightState,
                             VehicleParameters)


class HindsightError(ValueError):
    """No hindsight check is possible (no map, no ego state at the decision's stamp, bad observation)."""


@dataclass(frozen=True)
class HindsightConfig:
    scoring: ActionScorerConfig = field(default_factory=ActionScorerConfig)  # the teacher's rollouts
    stall_speed: float = 0.5  # m/s: v_th of Eq. 23; a rollout averaging less stalls (if another could go)
    min_gain: float = 0.05  # a safe executed action is revised only if the best scores this much higher
    margin: float = 0.1  # other safe actions this close to the best are listed after it
    max_listed: int = 3  # actions in a grounded answer at most
    max_sample_gap: float = 0.3  # s: an ego sample this close to the decision's stamp stands for it
    map_radius: float = 250.0  # m of lane graph around the ego kept in an observation
    earlier_decisions: int = 2  # after a collision or near miss, decisions before the failed one that may be revised

    @property
    def horizon(self) -> float:
        return self.scoring.horizon


# --------------------------------------------------------------------------------------------------
# The observation of one decision
# --------------------------------------------------------------------------------------------------


@dataclass
class HindsightObservation:
    """Everything the check needs about one decision, observed until its horizon ended (JSON-safe)."""

    time: float  # the decision's stamp (s)
    ego: EgoState  # at that stamp
    objects: ObjectBoxes  # the perceived objects on the rollout grid time + k dt, k = 0..steps
    stop_lanes: list[list[str]]  # per grid step: lanes whose light was red or yellow
    lane_graph: LaneGraph  # the map around the ego
    route: Route
    dt: float = 0.1  # s between grid steps
    vehicle: VehicleParameters = field(default_factory=VehicleParameters)
    scene: SceneDescriptor | None = None  # xi at the decision (the rationale's facts)
    observed_until: float = math.nan  # last perceived frame; objects continue at constant velocity after it

    def lights_at(self, t: float) -> TrafficLights:
        """The stop lights at time ``t`` of the grid (as red lights; green ones do not matter here)."""
        k = int(np.clip(round((t - self.time) / self.dt), 0, len(self.stop_lanes) - 1))
        return TrafficLights(t, [TrafficLightState(lane, TrafficLightPhase.RED) for lane in self.stop_lanes[k]])

    def to_dict(self) -> dict[str, Any]:
        o, r = self.objects, self.route
        return {
            "time": self.time, "dt": self.dt, "ego": asdict(self.ego),
            "objects": {"ids": list(o.ids), "pose": np.round(o.pose, 3).tolist(), "size": o.size.tolist(),
                        "speed": o.speed.tolist(), "static": o.static.tolist()},
            "stop_lanes": self.stop_lanes, "lane_graph": lane_graph_to_dict(self.lane_graph),
            "route": {"stamp": r.stamp, "road_ids": list(r.road_ids),
                      "goal": [_json(v) for v in (r.goal_x, r.goal_y, r.goal_heading)]},
            "vehicle": asdict(self.vehicle), "scene": scene_to_dict(self.scene) if self.scene is not None else None,
            "observed_until": _json(self.observed_until)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HindsightObservation":
        """Inverse of ``to_dict``; raises ``HindsightError`` naming what is malformed."""
        try:
            o = d["objects"]
            n, steps = len(o["ids"]), len(d["stop_lanes"])
            objects = ObjectBoxes(list(o["ids"]), np.asarray(o["pose"], dtype=np.float64).reshape(n, steps, 3),
                                  np.asarray(o["size"], dtype=np.float64).reshape(n, 2),
                                  np.asarray(o["speed"], dtype=np.float64).reshape(n),
                                  np.asarray(o["static"], dtype=bool).reshape(n), np.zeros(n, dtype=bool))
            r = d["route"]
            route = Route(float(r["stamp"]), list(r["road_ids"]), *(_unjson(v) for v in r["goal"]))
            return cls(float(d["time"]), EgoState(**d["ego"]), objects, [list(s) for s in d["stop_lanes"]],
                       lane_graph_from_dict(d["lane_graph"], "hindsight observation"), route, float(d["dt"]),
                       VehicleParameters(**d["vehicle"]), scene_from_dict(d["scene"]) if d.get("scene") else None,
                       _unjson(d.get("observed_until")))
        except (KeyError, TypeError, ValueError, LaneGraphError) as exc:
            raise HindsightError(f"malformed hindsight observation: {type(exc).__name__}: {exc}") from exc


def _json(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _unjson(v: Any) -> float:
    return math.nan if v is None else float(v)


def observed_boxes(frames: Sequence[TrackedObjects], ego: EgoState, time: float, steps: int, dt: float,
                   radius: float) -> ObjectBoxes:
    """Boxes of the perceived objects at ``time + k dt`` (k = 0..steps), from object frames sorted by
    stamp: interpolated between the frames that saw an object, parked far away before the first,
    continued at the last seen velocity after the last (as ``luna_bridge.action_scorer.logged_agents``
    does with logged tracks). Objects that never come within ``radius`` of the ego are left out."""
    grid = time + dt * np.arange(steps + 1)
    tracks: dict[str, list[tuple[float, Any]]] = {}
    for frame in frames:
        for o in frame.objects:
            if o.is_finite():
                tracks.setdefault(o.id, []).append((frame.stamp, o))
    ids, poses, sizes, speeds, static = [], [], [], [], []
    for object_id, seen in tracks.items():
        t = np.array([s for s, _ in seen])
        x, y = np.array([o.x for _, o in seen]), np.array([o.y for _, o in seen])
        heading = np.unwrap(np.array([o.heading for _, o in seen]))
        last = seen[-1][1]
        before, after = grid < t[0], grid > t[-1]
        px, py, ph = np.interp(grid, t, x), np.interp(grid, t, y), np.interp(grid, t, heading)
        extra = grid[after] - t[-1]
        px[after], py[after], ph[after] = last.x + last.vx * extra, last.y + last.vy * extra, last.heading
        px[before], py[before], ph[before] = FAR_AWAY, FAR_AWAY, 0.0
        present = ~before
        if not present.any() or np.min(np.hypot(px[present] - ego.x, py[present] - ego.y)) > radius:
            continue
        # Its speed when the decision was taken (or when it was first seen after): the scorer's
        # stopped-object test (nuPlan's at-fault rules) reads one speed per object.
        at_decision = seen[max(0, int(np.searchsorted(t, time, side="right")) - 1)][1]
        is_static = last.object_class is ObjectClass.STATIC
        ids.append(object_id)
        poses.append(np.column_stack([px, py, ph]))
        sizes.append((last.length, last.width))
        speeds.append(0.0 if is_static else at_decision.speed)
        static.append(is_static)
    if not ids:
        return ObjectBoxes.empty(steps + 1)
    return ObjectBoxes(ids, np.stack(poses), np.array(sizes, dtype=np.float64), np.array(speeds, dtype=np.float64),
                       np.array(static, dtype=bool), np.zeros(len(ids), dtype=bool))


def crop_lane_graph(graph: LaneGraph, x: float, y: float, radius: float) -> LaneGraph:
    """The lanes with a centreline point within ``radius`` of (x, y), references to dropped lanes removed."""
    kept = {lane_id for lane_id, lane in graph.lanes.items() if _distance(lane.centerline, x, y) <= radius}
    out = LaneGraph(frame_id=graph.frame_id, stamp=graph.stamp)
    for lane_id in sorted(kept):
        lane = graph.lanes[lane_id]
        out.add(Lane(lane.id, lane.centerline, lane.left_boundary, lane.right_boundary, lane.speed_limit, lane.road_id,
                     [s for s in lane.successors if s in kept], [p for p in lane.predecessors if p in kept],
                     lane.left_neighbor if lane.left_neighbor in kept else "",
                     lane.right_neighbor if lane.right_neighbor in kept else "", lane.in_junction))
    return out


def _distance(line: np.ndarray, x: float, y: float) -> float:
    """Distance (m) from (x, y) to a polyline (N, 2)."""
    pts = np.asarray(line, dtype=np.float64).reshape(-1, 2)
    if len(pts) == 0:
        return math.inf
    if len(pts) == 1:
        return float(np.hypot(pts[0, 0] - x, pts[0, 1] - y))
    a, d = pts[:-1], np.diff(pts, axis=0)
    t = np.clip(((x - a[:, 0]) * d[:, 0] + (y - a[:, 1]) * d[:, 1]) / np.maximum((d ** 2).sum(axis=1), 1e-12), 0, 1)
    return float(np.min(np.hypot(a[:, 0] + t * d[:, 0] - x, a[:, 1] + t * d[:, 1] - y)))


class HindsightRecorder:
    """What a node saw, kept for ``keep`` seconds, cut into the observation of one decision.

    Feed ``update_*`` as messages arrive (any order), ``set_map`` / ``set_route`` when they change;
    ``observation(stamp)`` once ``observed(stamp, now)`` says the horizon after the decision has passed.
    """

    def __init__(self, config: HindsightConfig | None = None, vehicle: VehicleParameters | None = None,
                 keep: float = 30.0) -> None:
        self.config = config or HindsightConfig()
        self.vehicle = vehicle or VehicleParameters()
        self.keep = keep
        self._ego, self._objects = StampedBuffer(), StampedBuffer()
        self._lights, self._scenes = StampedBuffer(), StampedBuffer()
        # By their stamps: a decision is checked on the map and route it was made on (one running stack
        # may be given a new map and route, e.g. the next scenario of a lock-step simulation).
        self._maps, self._routes = StampedBuffer(), StampedBuffer()

    def update_ego(self, ego: EgoState) -> None:
        if ego.is_finite():
            self._ego.insert(ego.stamp, ego)

    def update_objects(self, frame: TrackedObjects) -> None:
        if math.isfinite(frame.stamp):
            self._objects.insert(frame.stamp, frame)

    def update_lights(self, lights: TrafficLights) -> None:
        if math.isfinite(lights.stamp):
            self._lights.insert(lights.stamp, lights)

    def update_scene(self, scene: SceneDescriptor) -> None:
        if math.isfinite(scene.stamp):
            self._scenes.insert(scene.stamp, scene)

    def set_map(self, graph: LaneGraph) -> None:
        self._maps.insert(graph.stamp, graph)

    def set_route(self, route: Route) -> None:
        self._routes.insert(route.stamp, route)

    def prune(self, now: float) -> None:
        for buffer in (self._ego, self._objects, self._lights, self._scenes):
            buffer.prune(now - self.keep)
        for buffer in (self._maps, self._routes):  # the one in force at the oldest kept instant stays
            kept = buffer.at_or_before(now - self.keep)
            buffer.prune(kept.stamp if kept is not None else now - self.keep)

    @staticmethod
    def _in_force(buffer: StampedBuffer, stamp: float):
        """The latest value set at or before ``stamp``, else the earliest one set (a map stamped later)."""
        sample = buffer.at_or_before(stamp) or (buffer.items[0] if buffer.items else None)
        return sample.value if sample is not None else None

    def observed(self, stamp: float, now: float) -> bool:
        """Whether the horizon after a decision at ``stamp`` has passed by ``now``."""
        return now >= stamp + self.config.horizon

    def observation(self, stamp: float) -> HindsightObservation:
        """The observation of the decision issued at ``stamp``; raises ``HindsightError`` without a map,
        a route or an ego sample within ``max_sample_gap`` of the stamp."""
        cfg = self.config
        graph, route = self._in_force(self._maps, stamp), self._in_force(self._routes, stamp)
        if graph is None or not graph.lanes or route is None:
            raise HindsightError("no lane graph or no route received yet")
        sample = self._ego.nearest(stamp, cfg.max_sample_gap)
        if sample is None:
            raise HindsightError(f"no ego state within {cfg.max_sample_gap:g} s of the decision at {stamp:.2f} s")
        ego: EgoState = sample.value
        scoring = cfg.scoring
        end = stamp + scoring.horizon
        frames = [s.value for s in self._objects.between(stamp - cfg.max_sample_gap, end + cfg.max_sample_gap)]
        objects = observed_boxes(frames, ego, stamp, scoring.steps, scoring.dt, scoring.agent_radius)
        stop_lanes = []
        for k in range(scoring.steps + 1):
            lights = self._lights.at_or_before(stamp + k * scoring.dt) or self._lights.after(stamp)
            stop_lanes.append(sorted({tl.lane_id for tl in lights.value.lights if tl.phase in STOP_PHASES})
                              if lights is not None else [])
        scene = self._scenes.at_or_before(stamp + 1e-6)
        return HindsightObservation(stamp, ego, objects, stop_lanes,
                                    crop_lane_graph(graph, ego.x, ego.y, cfg.map_radius), route,
                                    scoring.dt, self.vehicle, scene.value if scene is not None else None,
                                    frames[-1].stamp if frames else math.nan)


    def earlier(self, decisions: Sequence[DecisionDistribution],
                failure: FailureEvent) -> list[tuple[DecisionDistribution, HindsightObservation]]:
        """After a collision or a near miss: up to ``earlier_decisions`` decisions issued before the failed
        one (latest first) with their observations, for when no decision could avoid the collision any
        more from the failed one (``reflection.ReflectionSystem.grounding``); none after a stall or a
        blocked ego."""
        if not failure.conflict:
            return []
        before = sorted((d for d in decisions if d.stamp < failure.decision_stamp - 1e-6), key=lambda d: -d.stamp)
        out = []
        for decision in before[:self.config.earlier_decisions]:
            try:
                out.append((decision, self.observation(decision.stamp)))
            except HindsightError:
                continue
        return out


# --------------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------------


@dataclass
class HindsightVerdict:
    executed: str  # the decision that failed ("" if none was in force)
    outcomes: dict[str, ActionOutcome]  # every allowed action, in hindsight
    safe: list[str]  # actions that neither collide, nor fail to execute, nor stall; best first
    unsafe: dict[str, str]  # the others: why ("collides with v3 after 2.1 s", "cannot be executed: ...")
    revise: bool  # a grounded revision is due
    listed: list[str]  # the revision's actions, best first (empty without a revision)
    scene: SceneDescriptor | None = None

    @property
    def best(self) -> str:
        return self.safe[0] if self.safe else ""

    def summary(self) -> str:
        """One line for reports: the verdict and why."""
        executed = self.outcomes.get(self.executed)
        did = f"{self.executed} {executed.reason}" if executed is not None else "no decision was in force"
        if self.revise:
            return f"revise to {self.best}: it {self.outcomes[self.best].reason}, where {did}"
        if not self.safe:
            return f"no safe alternative in hindsight ({did}); nothing written"
        return f"the executed decision was as good as any in hindsight ({did}); nothing written"

    def facts(self) -> str:
        """Each action's outcome in hindsight, one line each (for a reflection LLM's prompt)."""
        return "\n".join(f"- {code}: {o.reason}." for code, o in sorted(self.outcomes.items(),
                                                                       key=lambda kv: -kv[1].score))

    def answer(self) -> str:
        """The grounded revision A_refl in the answer format (requires ``revise``)."""
        if not self.revise:
            raise HindsightError("no revision is due")
        executed = self.outcomes.get(self.executed)
        rationales = {}
        for i, code in enumerate(self.listed):
            o = self.outcomes[code]
            # The teacher's brief answer (the decisive object, what the rollout led to), so that the item
            # reads like the bank's other few-shot examples; the first one adds what the executed did.
            text = brief_rationale(self.scene, code, o) if self.scene is not None else \
                f"{Action.from_code(code).description}: {o.issue or f'clear, {max(o.progress, 0.0):.0f} m progress'}."
            if i == 0 and executed is not None:
                text += f" {self.executed} instead: {executed.issue or executed.reason}."
            rationales[code] = text
        return format_ranked_answer(self.listed, rationales)

    def disagreement(self, ranked: Sequence[str]) -> str:
        """Why an answer ranking ``ranked`` contradicts the hindsight check ("" if it agrees)."""
        if not ranked:
            return "the answer ranks no action"
        if not self.revise:
            return f"hindsight finds no revision due ({self.summary()})"
        if ranked[0] != self.best:
            return f"the answer ranks {ranked[0]} first; hindsight names {self.best}"
        bad = [f"{code} {self.unsafe.get(code, 'was not scored')}" for code in ranked if code not in self.safe]
        return f"the answer lists actions that are unsafe in hindsight: {'; '.join(bad)}" if bad else ""


def hindsight_check(observation: HindsightObservation, allowed: Sequence[str], executed: str,
                    config: HindsightConfig | None = None) -> HindsightVerdict:
    """Roll out every allowed action from the decision's state against what was observed after it and
    decide whether (and to what) the executed decision is to be revised (module docstring)."""
    cfg = config or HindsightConfig()
    obs = observation
    if obs.objects.pose.shape[1] != cfg.scoring.steps + 1 or abs(obs.dt - cfg.scoring.dt) > 1e-9:
        raise HindsightError(f"the observation's grid ({obs.objects.pose.shape[1]} steps of {obs.dt:g} s) is not "
                             f"the rollouts' ({cfg.scoring.steps + 1} of {cfg.scoring.dt:g} s)")
    try:
        outcomes = score_actions(obs.ego, obs.time, list(allowed), obs.lane_graph, obs.route, obs.vehicle,
                                 obs.objects, obs.lights_at, cfg.scoring, where="hindsight")
    except ActionScorerError as exc:
        raise HindsightError(str(exc)) from exc
    unsafe: dict[str, str] = {}
    for code, o in outcomes.items():
        if o.collision:
            unsafe[code] = o.reason
        elif o.score <= 0.0:  # off the drivable area, against the traffic, or no such lane here
            unsafe[code] = f"scores 0: {o.reason}"
        elif not o.executable:
            unsafe[code] = f"cannot be executed as asked: it {o.reason}"
    stall = cfg.stall_speed * cfg.horizon
    could_go = max((o.progress for c, o in outcomes.items() if c not in unsafe), default=0.0) >= stall
    for code, o in outcomes.items():
        if code not in unsafe and could_go and o.progress < stall:
            unsafe[code] = f"stalls: it {o.reason}, where another decision makes progress"
    safe = sorted((c for c in outcomes if c not in unsafe), key=lambda c: (-outcomes[c].score, c))
    revise = False
    listed: list[str] = []
    if safe and safe[0] != executed:
        executed_score = outcomes[executed].score if executed in outcomes else -math.inf
        revise = executed not in safe or outcomes[safe[0]].score - executed_score > cfg.min_gain
    if revise:
        top = outcomes[safe[0]].score
        listed = [c for c in safe if outcomes[c].score >= top - cfg.margin][:cfg.max_listed]
    return HindsightVerdict(executed, outcomes, safe, unsafe, revise, listed, obs.scene)
