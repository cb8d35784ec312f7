"""The simulation-grounded action scorer for logged scenarios: the evidence of the teacher's scored
voters (LUNA-AD Sec. III-B with simulation in place of a large LLM; ``luna_core.teacher.ScoredVoterPool``)
and of the oracle decision source (``luna_bridge.oracle``).

For one frame (a scenario and a time, as written by ``luna-offline frames``) every allowed action is
executed from the expert's logged state at that time (or from a given closed-loop ego state: the
oracle) for ``horizon`` seconds against the LOGGED agents (privileged hindsight: a teacher may know how
the others actually drove) and the scenario's lights, by ``luna_core.action_outcomes.score_actions``:
IDM along each action's reference lane, LQR tracking, the PDM-style score x J_dec and a one-sentence
reason. This module only turns the log into the boxes those rollouts meet (``logged_agents``) and the
expert's state (``expert_state``) and progress over the horizon (``expert_progress``, for the
making-progress multiplier).

A present-only scorer (``present_only``; ``make_present_scorer``) knows what an onboard policy knows
instead: the objects as perceived at that time run on at their present velocity (the planner's own
constant-velocity forecast), the lights keep their present state, and no expert progress is known (no
making-progress multiplier). ``luna-oracle-cv`` decides through the same ``score_present`` (with
``make_scorer``'s settings). Its labels are the ones a student deciding from the present scene can learn:
the logged future ("the cross traffic will have passed") is in none of them.

``make_scorer`` is the factory for ``luna-offline collect --scorer luna_bridge.action_scorer:make_scorer``;
``make_bundled_bank_scorer`` the teacher of the bundled memory bank (before the reachable A band);
``make_present_scorer`` that teacher on the present only.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from luna_core.action_outcomes import FAR_AWAY, ActionScorerConfig, ActionScorerError, score_actions
from luna_core.lanes import lane_map
from luna_core.planning.forecast import constant_velocity_forecast
from luna_core.planning.scorer import ObjectBoxes
from luna_core.teacher import ActionOutcome
from luna_core.types import EgoState, ObjectClass, PlannerInput, SceneDescriptor, wrap_angle

from luna_bridge.scenario import SIM_DT, Scenario

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


def expert_progress(scenario: Scenario, time: float, horizon: float) -> float | None:
    """Metres the logged ego drove over ``[time, time + horizon]`` (clipped to the log), None where
    the log has no state at ``time``: the reference of nuPlan's making-progress metric."""
    track = scenario.expert
    i = track.index_at(time)
    if i is None:
        return None
    j = i + int(round(horizon / SIM_DT))
    x, y = track.x[i:j + 1], track.y[i:j + 1]
    ok = np.isfinite(x) & np.isfinite(y)
    return float(np.sum(np.hypot(np.diff(x[ok]), np.diff(y[ok]))))


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


class SimulationActionScorer:
    """``luna_core.teacher.ActionScorer`` by rollouts in the frame's logged scenario (module docstring)."""

    def __init__(self, config: ActionScorerConfig | None = None, present_only: bool = False) -> None:
        self.config = config or ActionScorerConfig()
        self.present_only = present_only
        self._scenarios: OrderedDict[str, Scenario] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Sent to worker processes / Ray actors (``luna-offline collect --executor``): the settings
        # only; each copy loads its own scenarios.
        return {"config": self.config, "present_only": self.present_only}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state.get("present_only", False))

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
        # An on-policy frame (``luna-offline frames --on-policy``) carries the closed-loop ego state.
        ego = context.get("ego")
        try:
            ego_state = EgoState(**ego) if ego is not None else None
        except TypeError as exc:
            raise ActionScorerError(f"frame {context.get('frame', '?')}: bad ego state {ego!r} ({exc})") from exc
        return self.score_scenario(self.scenario(context), float(context["time"]), actions, ego=ego_state)

    def score_scenario(self, scenario: Scenario, time: float, actions: Sequence[str],
                       ego: EgoState | None = None) -> dict[str, ActionOutcome]:
        """Outcomes of ``actions`` executed from ``ego`` at ``time`` in ``scenario`` against its logged
        agents: by default the expert's logged state (the teacher); the oracle decision source passes
        the closed-loop ego state of the run it decides for. A present-only scorer meets the objects of
        that time at their present velocity instead (``score_present``)."""
        cfg = self.config
        if ego is None:
            ego = expert_state(scenario, time, scenario.vehicle.wheelbase)
        if self.present_only:
            present = PlannerInput(time, [ego], scenario.objects_at(time), scenario.lights_at(time),
                                   scenario.lane_graph, scenario.route, vehicle=scenario.vehicle)
            return self.score_present(present, actions, where=scenario.name)
        agents = logged_agents(scenario, ego, time, cfg.steps, cfg.dt, cfg.agent_radius)
        return score_actions(ego, time, actions, scenario.lane_graph, scenario.route, scenario.vehicle, agents,
                             scenario.lights_at, cfg, where=scenario.name,
                             expert_progress=expert_progress(scenario, time, cfg.horizon))

    def score_present(self, planner_input: PlannerInput, actions: Sequence[str],
                      where: str = "") -> dict[str, ActionOutcome]:
        """Outcomes of ``actions`` from what ``planner_input`` holds alone: its objects at their present
        velocity, its lights held, no expert progress (module docstring; ``luna-oracle-cv``)."""
        cfg = self.config
        pin = planner_input
        # Lights enter through ``lights_at`` (score_actions), so the forecast is given no route lanes.
        objects = constant_velocity_forecast(pin, lane_map(pin.lane_graph), [], cfg.steps + 1, cfg.dt,
                                             cfg.agent_radius)
        return score_actions(pin.ego, pin.time, actions, pin.lane_graph, pin.route, pin.vehicle, objects,
                             lambda _t: pin.traffic_lights, cfg, where=where)


def make_scorer() -> SimulationActionScorer:
    """Factory for ``luna-offline collect --scorer luna_bridge.action_scorer:make_scorer``."""
    return SimulationActionScorer()


# The settings the bundled ``models/memory_bank`` was labelled with (Eq. 5's A band from the first step, the
# drivable area strictly on the tracked footprint).
BUNDLED_BANK_CONFIG = ActionScorerConfig(reachable_accelerate=False, drivable_tolerance=None)


def make_bundled_bank_scorer() -> SimulationActionScorer:
    """The teacher the bundled ``models/memory_bank`` was labelled with (``BUNDLED_BANK_CONFIG``;
    ``ActionScorerConfig.reachable_accelerate``, ``ActionScorerConfig.drivable_tolerance``): it gives that
    bank's frames their stored distributions again, so items added to the bank's training data (on-policy
    frames, DAgger) carry the same labels.
    ``luna-offline collect --scorer luna_bridge.action_scorer:make_bundled_bank_scorer``."""
    return SimulationActionScorer(BUNDLED_BANK_CONFIG)


def make_present_scorer() -> SimulationActionScorer:
    """The bundled bank's teacher on the present only (``present_only``, ``BUNDLED_BANK_CONFIG``): collected over
    that bank's frames, only the labels the logged future decided change, and the K = 0 cached states train a
    head on them (``--targets-from-bank``).
    ``luna-offline collect --scorer luna_bridge.action_scorer:make_present_scorer``."""
    return SimulationActionScorer(BUNDLED_BANK_CONFIG, present_only=True)
