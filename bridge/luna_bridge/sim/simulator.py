"""The closed-loop simulator: 0.1 s steps, planner in the loop, LQR + kinematic bicycle for the ego.

At every step the simulator records the scene, builds a ``PlannerInput`` (2 s of ego history,
objects, traffic lights, lane graph, route), calls the planner every ``replan_every`` steps and
tracks the latest trajectory for one step. Agents replay their logs (non-reactive) or follow IDM
(reactive, see ``agents``). A planner that raises, returns NaN or a malformed trajectory counts as a
failure: it is logged and a comfortable stop along the last valid plan is tracked instead.
Nothing here is random: the same scenario, planner and settings give the same log.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from luna_core.control import BicycleParameters, TrackerParameters, track_step
from luna_core.lanes import Polyline
from luna_core.types import (DecisionDistribution, EgoState, Planner, PlannerInput, Trajectory,
                             TrackedObjects)

from luna_bridge.scenario import SIM_DT, Scenario, SimulationLog
from luna_bridge.sim.agents import ReactiveAgents, ego_box
from luna_core.planning.fallback import stop_along

log = logging.getLogger(__name__)


class DecisionSource(Protocol):
    """Anything that issues a decision distribution for a planner input (e.g. the LUNA student)."""

    def decide(self, planner_input: PlannerInput) -> DecisionDistribution | None:
        ...


@dataclass(frozen=True)
class SimulationConfig:
    replan_every: int = 1  # steps between planner calls (nuPlan: every step)
    history_duration: float = 2.0  # s of ego history in each PlannerInput
    decision_every: int = 20  # steps between decisions, when a decision source is given (T_d = 2.0 s)
    reactive_radius: float = 100.0  # m; agents closer than this become IDM-driven in reactive mode
    tracker: TrackerParameters = TrackerParameters()
    bicycle: BicycleParameters = BicycleParameters()


def _expert_history(scenario: Scenario, seconds: float) -> list[EgoState]:
    """Logged ego states before t = 0 (oldest first), as the planner's initial history."""
    track = scenario.expert
    out = []
    for k in range(int(round(seconds / SIM_DT)), 0, -1):
        i = track.index_at(-k * SIM_DT)
        if i is None:
            continue
        h = float(track.heading[i])
        v = float(track.vx[i] * math.cos(h) + track.vy[i] * math.sin(h))
        out.append(EgoState(-k * SIM_DT, float(track.x[i]), float(track.y[i]), h, v))
    return out


def _check_trajectory(traj: object) -> str:
    """Empty string if ``traj`` is a usable trajectory, else what is wrong with it."""
    if not isinstance(traj, Trajectory):
        return f"returned {type(traj).__name__}, not a Trajectory"
    if len(traj) < 2:
        return f"trajectory has {len(traj)} points (needs >= 2)"
    lengths = {len(a) for a in (traj.t, traj.x, traj.y, traj.heading, traj.velocity, traj.acceleration)}
    if len(lengths) != 1:
        return "trajectory arrays differ in length"
    if not traj.is_finite() or not math.isfinite(traj.stamp):
        return "trajectory contains NaN or inf"
    if np.any(np.diff(traj.t) <= 0):
        return "trajectory times are not strictly increasing"
    return ""


def simulate(scenario: Scenario, planner: Planner, reactive: bool = False,
             config: SimulationConfig = SimulationConfig(),
             decision_source: DecisionSource | None = None) -> SimulationLog:
    """Run ``planner`` in closed loop on ``scenario`` for ``scenario.duration`` seconds."""
    planner.reset()
    vehicle = scenario.vehicle
    history_len = int(round(config.history_duration / SIM_DT)) + 1
    ego = EgoState(0.0, scenario.ego_initial.x, scenario.ego_initial.y, scenario.ego_initial.heading,
                   scenario.ego_initial.velocity, scenario.ego_initial.acceleration,
                   scenario.ego_initial.yaw_rate, scenario.ego_initial.steering_angle)
    history: deque[EgoState] = deque(_expert_history(scenario, config.history_duration), maxlen=history_len)
    agents = ReactiveAgents(scenario, radius=config.reactive_radius) if reactive else None

    times, egos, objects, lights = [], [], [], []
    latencies, plan_times, failures = [], [], []
    plan_info: list[dict[str, object]] = []
    decisions: list[tuple[float, str]] = []
    decision: DecisionDistribution | None = None
    trajectory: Trajectory | None = None
    last_valid: Trajectory | None = None
    for k in range(scenario.num_steps):
        t = round(k * SIM_DT, 10)
        ego.stamp = t
        tl = scenario.lights_at(t)
        if agents is not None:
            objs = TrackedObjects(t, agents.objects(t, ego_box(ego.x, ego.y, ego.heading, ego.velocity, vehicle), tl))
        else:
            objs = scenario.objects_at(t)
        history.append(ego)
        times.append(t)
        egos.append(ego)
        objects.append(objs)
        lights.append(tl)
        if k == scenario.num_steps - 1:
            break
        if k % config.replan_every == 0 or trajectory is None:
            pin = PlannerInput(time=t, ego_history=list(history), objects=objs, traffic_lights=tl,
                               lane_graph=scenario.lane_graph, route=scenario.route, decision=decision,
                               vehicle=vehicle)
            if decision_source is not None and k % config.decision_every == 0:
                decision = decision_source.decide(pin)
                pin.decision = decision
                if decision is not None:
                    decisions.append((t, decision.top_action))
            start = time.perf_counter()
            try:
                result = planner.plan(pin)
                problem = _check_trajectory(result)
            except Exception as exc:  # noqa: BLE001 - any planner error is a planner failure
                result, problem = None, f"raised {type(exc).__name__}: {exc}"
            latencies.append(time.perf_counter() - start)
            plan_times.append(t)
            info = getattr(planner, "cycle_info", None)
            if info is not None and not problem:
                plan_info.append(info())
            if problem:
                msg = f"t={t:.1f}s: planner {getattr(planner, 'name', type(planner).__name__)} {problem}"
                log.warning("%s: %s; tracking a comfortable stop", scenario.name, msg)
                failures.append(msg)
                path = Polyline(np.column_stack([last_valid.x, last_valid.y])) if last_valid is not None else None
                trajectory = stop_along(ego, path)
            else:
                trajectory = result
                last_valid = result
        ego = track_step(ego, trajectory, vehicle, config.tracker, config.bicycle)

    return SimulationLog(scenario=scenario, planner=getattr(planner, "name", type(planner).__name__),
                         reactive=reactive, t=np.array(times), ego=egos, objects=objects, lights=lights,
                         planner_latency=np.array(latencies), planner_failures=len(failures),
                         decisions=decisions, failure_messages=failures, plan_times=np.array(plan_times),
                         plan_info=plan_info)
