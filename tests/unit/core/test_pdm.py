"""Forecast, IDM proposals, the IDM planner and the PDM-Closed-style planner on a hand-built road.

Road "r0" along +x: right lane centre y = 0, left lane y = 4 (4 m wide), speed limit 15 m/s; a
junction lane "j" continues the right lane from x = 200 (for the red-light case).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from luna_core.control import track_step
from luna_core.lanes import Polyline, lane_map, make_lane
from luna_core.planning.forecast import CLASS_CAPS, constant_velocity_forecast, select_objects
from luna_core.planning.fallback import stop_along
from luna_core.planning.pdm_closed import PDMClosedPlanner, emergency_brake_trajectory
from luna_core.planning.context import build_planning_context
from luna_core.planning.proposals import IDMPlanner, corridor_leaders, idm_proposals
from luna_core.planning.reference_paths import OffMapError
from luna_core.planning.scorer import ObjectBoxes
from luna_core.types import (EgoState, LaneGraph, ObjectClass, PlannerInput, Route, TrackedObject, TrackedObjects,
                             TrafficLightPhase, TrafficLights, TrafficLightState, VehicleParameters)

VP = VehicleParameters()


def graph() -> LaneGraph:
    g = LaneGraph()
    xs = np.linspace(-50.0, 200.0, 26)
    g.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 4.0, 15.0, road_id="r0",
                    left_neighbor="left", successors=["j"]))
    g.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 4.0)]), 4.0, 15.0, road_id="r0",
                    right_neighbor="right"))
    xj = np.linspace(200.0, 400.0, 21)
    g.add(make_lane("j", np.column_stack([xj, np.zeros_like(xj)]), 4.0, 15.0, road_id="r1", in_junction=True,
                    predecessors=["right"]))
    return g


G = graph()


def planner_input(objects: list[TrackedObject] = (), x: float = 0.0, y: float = 0.0, v: float = 8.0,
                  lights: list[TrafficLightState] = ()) -> PlannerInput:
    ego = EgoState(0.0, x, y, 0.0, v)
    return PlannerInput(0.0, [ego], TrackedObjects(0.0, list(objects)), TrafficLights(0.0, list(lights)), G,
                        Route(0.0, ["r0", "r1"]))


def vehicle(i: str, x: float, y: float = 0.0, vx: float = 0.0, cls: ObjectClass = ObjectClass.VEHICLE,
            length: float = 4.5, width: float = 2.0) -> TrackedObject:
    return TrackedObject(i, cls, x, y, 0.0, vx, 0.0, length, width)


# ---- forecast -----------------------------------------------------------------------------------


def test_forecast_moves_objects_at_constant_velocity_along_their_heading() -> None:
    f = constant_velocity_forecast(planner_input([vehicle("a", 20.0, vx=5.0)]), lane_map(G), ["right"], 41)
    assert f.ids == ["a"]
    assert f.pose[0, 40, :2] == pytest.approx([20.0 + 5.0 * 4.0, 0.0])
    assert f.speed.tolist() == [5.0] and f.static.tolist() == [False]


def test_forecast_moves_a_reversing_object_backwards_keeping_its_heading() -> None:
    backing = TrackedObject("b", ObjectClass.VEHICLE, 20.0, 0.0, 0.0, -2.0, 0.0, 4.5, 2.0)  # faces +x, moves -x
    f = constant_velocity_forecast(planner_input([backing]), lane_map(G), ["right"], 41)
    assert f.pose[0, 40] == pytest.approx([20.0 - 2.0 * 4.0, 0.0, 0.0])
    assert f.speed.tolist() == [2.0]


def test_a_leader_reversing_towards_the_ego_closes_in_along_the_path() -> None:
    lm = lane_map(G)
    backing = TrackedObject("b", ObjectClass.VEHICLE, 20.0, 0.0, 0.0, -2.0, 0.0, 4.5, 2.0)
    f = constant_velocity_forecast(planner_input([backing, vehicle("a", 30.0, y=4.0, vx=3.0)]), lm,
                                   ["right"], 11)
    _, blocks, v_along, _ = corridor_leaders(lm.centerlines["right"], f, VP)
    order = f.ids.index("b"), f.ids.index("a")
    assert v_along[order[0]] == pytest.approx(np.full(11, -2.0))
    assert v_along[order[1]] == pytest.approx(np.full(11, 3.0))
    assert blocks[order[0]].all() and not blocks[order[1]].any()


def test_forecast_keeps_nearest_objects_within_50_m_and_caps_per_class() -> None:
    far = vehicle("far", 60.0)
    peds = [vehicle(f"p{i:02d}", 5.0 + i, y=6.0, cls=ObjectClass.PEDESTRIAN, length=0.5, width=0.5)
            for i in range(30)]
    kept = select_objects(planner_input([far] + peds))
    assert "far" not in [o.id for o in kept]
    assert len(kept) == CLASS_CAPS[ObjectClass.PEDESTRIAN] == 25
    assert [o.id for o in kept] == [f"p{i:02d}" for i in range(25)]  # nearest first


def test_red_light_on_the_route_becomes_a_static_obstacle() -> None:
    red = [TrafficLightState("j", TrafficLightPhase.RED)]
    f = constant_velocity_forecast(planner_input(lights=red), lane_map(G), ["right", "j"], 41)
    assert f.ids == ["red_light:j"] and f.red_light.tolist() == [True] and f.static.tolist() == [True]
    assert f.pose[0, 0, 0] == pytest.approx(201.0)  # 2 m deep box centred 1 m into the lane
    green = [TrafficLightState("j", TrafficLightPhase.GREEN)]
    assert constant_velocity_forecast(planner_input(lights=green), lane_map(G), ["right", "j"], 41).ids == []
    # Already inside the controlled lane: no obstacle (the ego must clear the junction).
    assert constant_velocity_forecast(planner_input(lights=red), lane_map(G), ["j"], 41).ids == []


# ---- proposals ------------------------------------------------------------------------------------


def test_proposals_grid_order_and_simulated_states_start_at_the_ego() -> None:
    pi = planner_input()
    context = build_planning_context(pi)
    props = idm_proposals(pi.ego, context.route_reference.centerline, context.near_forecast,
                          target_speeds=(3.0, 6.0, 9.0, 12.0, 15.0))
    assert props.poses.shape == (15, 81, 3) and props.states.shape == (15, 41, 8)
    assert props.offsets.tolist() == [0.0] * 5 + [-1.0] * 5 + [1.0] * 5  # centreline first, as PDM-Closed
    assert props.target_speeds.tolist() == [3.0, 6.0, 9.0, 12.0, 15.0] * 3
    assert props.states[:, 0, :2] == pytest.approx(np.zeros((15, 2)))
    assert props.poses[0, 0, 1] == pytest.approx(0.0) and props.poses[5, 0, 1] == pytest.approx(-1.0)
    assert props.poses[10, 0, 1] == pytest.approx(1.0)
    # Free road: IDM approaches each target speed from 8 m/s, never above it.
    assert np.all(props.velocity[:, -1] <= props.target_speeds + 1e-9)
    assert props.velocity[4, -1] > 12.0 and props.velocity[0, -1] < 4.0


def test_idm_stops_behind_a_stopped_vehicle_at_the_minimum_gap() -> None:
    pi = planner_input([vehicle("stopped", 30.0)])
    traj = IDMPlanner().plan(pi)
    gap = (30.0 - 2.25) - (traj.x[-1] + VP.front_length)
    assert traj.velocity[-1] < 0.2
    assert 0.8 < gap < 2.5  # IDM s0 = 1 m


def test_idm_planner_targets_nuplan_10_mps_capped_by_the_limit() -> None:
    traj = IDMPlanner().plan(planner_input(v=10.0))
    assert traj.velocity.max() <= 10.0 + 1e-9 and traj.velocity[-1] > 9.5
    assert len(traj) == 81 and traj.t[-1] == pytest.approx(8.0)


# ---- PDM-Closed ---------------------------------------------------------------------------------


def test_pdm_on_a_free_road_takes_the_fastest_centred_proposal() -> None:
    p = PDMClosedPlanner()
    traj = p.plan(planner_input())
    assert p.last is not None and p.last.scores.best == 4  # offset 0 (first) x speed fraction 1.0
    assert not p.last.emergency_brake
    # The -1 m offset pushes the right corners 0.15 m out of the road: not drivable.
    assert p.last.scores.drivable_area[5:10].tolist() == [0.0] * 5
    assert traj.velocity[-1] > 14.0 and abs(traj.y[-1]) < 1e-6


def test_pdm_stops_behind_a_stopped_vehicle_without_colliding() -> None:
    p = PDMClosedPlanner()
    traj = p.plan(planner_input([vehicle("stopped", 30.0)]))
    assert p.last is not None
    assert p.last.scores.no_at_fault_collision[p.last.scores.best] == 1.0
    assert traj.velocity[-1] < 0.2 and traj.x[-1] + VP.front_length < 30.0 - 2.25


def test_pdm_stops_at_a_red_light_and_goes_on_green() -> None:
    red = [TrafficLightState("j", TrafficLightPhase.RED)]
    stop = PDMClosedPlanner().plan(planner_input(x=170.0, v=8.0, lights=red))
    assert stop.x[-1] + VP.front_length <= 200.0 and stop.velocity[-1] < 0.2
    green = [TrafficLightState("j", TrafficLightPhase.GREEN)]
    go = PDMClosedPlanner().plan(planner_input(x=170.0, v=8.0, lights=green))
    assert go.x[-1] > 210.0


def test_pdm_emergency_brakes_when_a_collision_is_unavoidable_at_low_speed() -> None:
    p = PDMClosedPlanner()
    # A car stopped 1 m ahead of the front bumper across both lanes' proposals: every proposal collides.
    block = vehicle("wall", VP.front_length + 1.0 + 2.25, y=2.0, width=10.0)
    traj = p.plan(planner_input([block], v=4.0))
    assert p.last is not None and p.last.emergency_brake
    # PDM-Closed's first request at 4 m/s: 1.1 (v - 4.05), a reference just behind the ego.
    assert traj.velocity[0] == pytest.approx(1.1 * (4.0 - 4.05)) and abs(traj.velocity[-1]) < 1e-3


def _track(traj: Trajectory, v: float, steps: int, replan: Callable[[EgoState], Trajectory] | None = None,
           every: int = 5) -> list[EgoState]:
    ego = EgoState(0.0, 0.0, 0.0, 0.0, v, acceleration=0.0)
    out = [ego]
    for k in range(steps):
        if replan is not None and k % every == 0:
            traj = replan(ego)
        ego = track_step(ego, traj)
        out.append(ego)
    return out


def test_pdm_emergency_brake_stops_short_through_nuplans_tracker_and_never_reverses() -> None:
    """Tracked by nuPlan's LQR + bicycle from 4 m/s, PDM-Closed's brake stops within about
    v^2 / (2 x 3.5 m/s^2) + the actuator lag, where a reference that itself stops at 4 m/s^2 creeps
    ~1.5 m further (the tracker follows the velocity 1 s ahead: a = -0.91 v); replanned only every
    0.5 s (the brake held in between) the car still does not reverse."""
    line = Polyline(np.array([[0.0, 0.0], [100.0, 0.0]]))
    start = EgoState(0.0, 0.0, 0.0, 0.0, 4.0)
    brake = emergency_brake_trajectory(start, 80, 0.1)
    braked = _track(brake, 4.0, 60)
    comfortable = _track(stop_along(start, line, 4.0, horizon=8.0, dt=0.1), 4.0, 60)
    assert braked[-1].velocity < 0.05 and braked[-1].x < 4.0 ** 2 / (2 * 3.5) + 4.0 * 0.2
    assert comfortable[-1].x > braked[-1].x + 1.2
    held = _track(brake, 4.0, 60, replan=lambda e: emergency_brake_trajectory(e, 80, 0.1), every=5)
    assert min(e.velocity for e in held) > -0.2 and held[-1].x == pytest.approx(braked[-1].x, abs=0.3)


def test_pdm_replans_the_centreline_from_the_current_lane() -> None:
    # The ego has drifted into the left lane: proposals follow the left lane now.
    p = PDMClosedPlanner()
    traj = p.plan(planner_input(y=4.0))
    assert abs(traj.y[-1] - 4.0) < 1e-6


def test_planners_refuse_a_pose_off_the_map() -> None:
    with pytest.raises(OffMapError):
        PDMClosedPlanner().plan(planner_input(y=500.0))
    with pytest.raises(OffMapError):
        IDMPlanner().plan(planner_input(y=500.0))


def test_empty_forecast_shape() -> None:
    assert ObjectBoxes.empty(41).pose.shape == (0, 41, 3)


def test_idm_proposal_brakes_harder_for_an_oncoming_object_than_for_a_stopped_one() -> None:
    """nuPlan's IDM and PDM-Closed take the leader's velocity projected on the ego heading without
    clipping: an object coming towards the ego closes faster than a stopped one at the same gap."""
    pi = planner_input(v=8.0)
    line = build_planning_context(pi, output_horizon=2.0).route_reference.centerline

    def first_accel(speed: float) -> float:
        obj = ObjectBoxes(["o"], np.array([[[25.0 - speed * 0.1 * k, 0.0, np.pi] for k in range(21)]]),
                          np.array([[4.5, 2.0]]), np.array([speed]), np.array([False]), np.array([False]))
        props = idm_proposals(pi.ego, line, obj, offsets=(0.0,), target_speeds=(10.0,), steps=20, simulate_steps=0)
        return float(props.acceleration[0, 0])

    assert first_accel(5.0) < first_accel(0.0) - 0.5
