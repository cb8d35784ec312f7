"""Scenario and simulation-log types: the contract between scenario sources, simulator and metrics.

A ``Scenario`` is what every source (synthetic suite, CommonRoad XML, nuPlan) produces; the simulator
turns a scenario plus a planner into a ``SimulationLog``; metrics read only the log (and its scenario).
Times are seconds from the scenario start; poses follow ``luna_core.types`` (ego at the rear axle,
objects at the box centre, map frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from luna_core.planning.context import kinematic_steering_angle
from luna_core.types import (EgoState, LaneGraph, ObjectClass, Route, TrackedObject, TrackedObjects,
                             TrafficLightPhase, TrafficLights, TrafficLightState, VehicleParameters)

SIM_DT = 0.1  # s, nuPlan's simulation step


@dataclass
class AgentTrack:
    """A logged object trajectory sampled every ``SIM_DT`` from ``t[0]``; NaN rows = not present."""

    id: str
    object_class: ObjectClass
    length: float
    width: float
    t: np.ndarray  # (T,)
    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    vx: np.ndarray
    vy: np.ndarray

    def index_at(self, time: float) -> int | None:
        if len(self.t) == 0:
            return None
        i = int(round((time - self.t[0]) / SIM_DT))
        if i < 0 or i >= len(self.t) or not np.isfinite(self.x[i]):
            return None
        return i

    def state_at(self, time: float) -> TrackedObject | None:
        i = self.index_at(time)
        if i is None:
            return None
        return TrackedObject(self.id, self.object_class, float(self.x[i]), float(self.y[i]),
                             float(self.heading[i]), float(self.vx[i]), float(self.vy[i]),
                             self.length, self.width)


@dataclass
class TrafficLightTimeline:
    """The phase of one light over time: ``phases[k]`` holds from ``times[k]`` until ``times[k+1]``."""

    lane_id: str
    times: list[float]
    phases: list[TrafficLightPhase]

    def phase_at(self, time: float) -> TrafficLightPhase:
        phase = TrafficLightPhase.NONE
        for start, p in zip(self.times, self.phases):
            if time + 1e-9 >= start:
                phase = p
        return phase


@dataclass
class Scenario:
    name: str
    scenario_type: str  # one of the 14 nuPlan types, or the source's own label
    lane_graph: LaneGraph
    route: Route
    ego_initial: EgoState
    expert: AgentTrack  # the logged ego (rear axle), for log replay and expert-route progress
    agents: list[AgentTrack] = field(default_factory=list)
    traffic_lights: list[TrafficLightTimeline] = field(default_factory=list)
    duration: float = 15.0  # s
    split: str = ""  # "hard", "random", "train", or "" for external sources
    source: str = "synthetic"  # "synthetic" | "commonroad" | "nuplan"
    vehicle: VehicleParameters = field(default_factory=VehicleParameters)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The simulated vehicle's wheels are at some angle (EgoState.steering_angle None means "not
        # measured", which the simulator's own state never is). Where the source gives none, the angle
        # of the kinematic bicycle turning at the initial yaw rate (straight without one), as the
        # synthetic scenarios are made: straight wheels under a turning CommonRoad ego made the tracker
        # swing the wheels to -0.31 rad within 1 s (USA_Lanker-1_11_T-1).
        if self.ego_initial.steering_angle is None:
            ego = self.ego_initial
            angle = kinematic_steering_angle(ego.velocity, ego.yaw_rate, self.vehicle.wheelbase)
            self.ego_initial = replace(ego, steering_angle=angle)

    @property
    def num_steps(self) -> int:
        return int(round(self.duration / SIM_DT)) + 1

    def objects_at(self, time: float) -> TrackedObjects:
        objs = [s for s in (a.state_at(time) for a in self.agents) if s is not None]
        return TrackedObjects(time, objs)

    def lights_at(self, time: float) -> TrafficLights:
        return TrafficLights(time, [TrafficLightState(tl.lane_id, tl.phase_at(time))
                                    for tl in self.traffic_lights])


@dataclass
class SimulationLog:
    """What one closed-loop run produced, sampled every ``SIM_DT``; the metrics' only input."""

    scenario: Scenario
    planner: str
    reactive: bool
    t: np.ndarray  # (N,)
    ego: list[EgoState]  # (N,) rear-axle states as simulated
    objects: list[TrackedObjects]  # (N,) objects as simulated (reactive agents differ from the log)
    lights: list[TrafficLights]  # (N,)
    planner_latency: np.ndarray = field(default_factory=lambda: np.zeros(0))  # s per planner call
    planner_failures: int = 0  # calls that raised or timed out (a stop trajectory was used)
    decisions: list[tuple[float, str]] = field(default_factory=list)  # (time, top action) if any
    error: str = ""  # non-empty if the run crashed; metrics then score it zero
    failure_messages: list[str] = field(default_factory=list)  # one line per planner failure
    plan_times: np.ndarray = field(default_factory=lambda: np.zeros(0))  # s, when the planner was called
    # Per planner call, how the cycle ended, for planners that say (``cycle_info()``: mode, action, flip).
    plan_info: list[dict[str, object]] = field(default_factory=list)

    def cycle_statistics(self) -> dict[str, object]:
        """Planner cycles by mode, the flips of a* under one decision (count and per minute of
        simulated time), the decision cycles whose a* was not the most likely candidate and those where
        safety first changed a* from the paper's Eq. 22 pick; empty when the planner reports nothing."""
        if not self.plan_info:
            return {}
        modes: dict[str, int] = {}
        for info in self.plan_info:
            mode = str(info.get("mode", ""))
            modes[mode] = modes.get(mode, 0) + 1
        flips = sum(1 for info in self.plan_info if info.get("flip"))
        minutes = max(float(self.t[-1] - self.t[0]), SIM_DT) / 60.0 if len(self.t) else 1.0
        beside = sum(1 for info in self.plan_info if info.get("beside_argmax"))
        gated = sum(1 for info in self.plan_info if info.get("safety_gated"))
        return {"cycles": len(self.plan_info), "modes": dict(sorted(modes.items())), "flips": flips,
                "flips_per_minute": round(flips / minutes, 6), "picks_beside_argmax": beside,
                "safety_gated": gated}

    def ego_array(self) -> np.ndarray:
        """(N, 6) of x, y, heading, velocity, acceleration, yaw_rate."""
        return np.array([[e.x, e.y, e.heading, e.velocity, e.acceleration, e.yaw_rate]
                         for e in self.ego], dtype=np.float64).reshape(-1, 6)
