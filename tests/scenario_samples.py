"""A small hand-built scenario for closed-loop tests: two lanes, a slower lead car ahead of the ego."""

from __future__ import annotations

import numpy as np

from luna_core.lanes import make_lane
from luna_core.types import EgoState, LaneGraph, ObjectClass, Route

from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario


def _track(track_id: str, cls: ObjectClass, x0: float, y: float, v: float, duration: float,
           length: float = 4.6, width: float = 1.9) -> AgentTrack:
    t = np.arange(int(round(duration / SIM_DT)) + 1) * SIM_DT
    x = x0 + v * t
    zeros = np.zeros_like(t)
    return AgentTrack(track_id, cls, length, width, t, x, zeros + y, zeros, zeros + v, zeros)


def lead_vehicle_scenario(duration: float = 6.0) -> Scenario:
    xs = np.linspace(0.0, 400.0, 81)
    graph = LaneGraph()
    graph.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 3.5)]), 3.5, 15.0, "road",
                        right_neighbor="right"))
    graph.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 3.5, 15.0, "road",
                        left_neighbor="left"))
    expert = _track("ego", ObjectClass.VEHICLE, 20.0, 0.0, 6.0, duration, 5.176, 2.297)
    lead = _track("lead", ObjectClass.VEHICLE, 45.0, 0.0, 4.0, duration)
    return Scenario(name="lead_vehicle", scenario_type="following_lane_with_lead", lane_graph=graph,
                    route=Route(0.0, ["road"], 380.0, 0.0, 0.0),
                    ego_initial=EgoState(0.0, 20.0, 0.0, 0.0, 6.0), expert=expert, agents=[lead],
                    duration=duration, source="test")


def rear_end_scenario(duration: float = 3.0) -> Scenario:
    """The lead-vehicle road with a car closing in from behind at 16 m/s in the ego's lane: its logged
    (non-reactive) track runs through the ego whatever the ego does, so every run has a collision."""
    scenario = lead_vehicle_scenario(duration)
    scenario.name, scenario.scenario_type = "rear_end", "following_lane_with_lead"
    scenario.agents.append(_track("rear", ObjectClass.VEHICLE, 5.0, 0.0, 16.0, duration))
    return scenario


def blocked_lane_scenario(duration: float = 12.0) -> Scenario:
    """The lead-vehicle road with the lead car standing still 25 m ahead: a lane-keeping ego stops behind
    it and then stands for the rest of the run (a stall under Eq. 23 unless a light says stop)."""
    scenario = lead_vehicle_scenario(duration)
    scenario.name, scenario.scenario_type = "blocked_lane", "stationary_in_traffic"
    scenario.agents = [_track("parked", ObjectClass.VEHICLE, 45.0, 0.0, 0.0, duration)]
    return scenario
