"""The planning context (``luna_core.planning.context``): built once per planning cycle, and one context
object serves the decision-guided planner, Diffusion-ES without decisions, PDM-Closed and IDM alike.

The planners are the registered ones (``make_planner``) with the shipped diffusion prior; a reduced
deterministic search keeps each call short. The set-up is counted where it happens: the map search for
the lane sequences and the forecast, both called from the context module only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from luna_core.lanes import lane_map
from luna_core.planning import context as context_module
from luna_core.planning.context import PlannerInputError, build_planning_context
from luna_core.planning.decision_guided import MODE_DECISION, MODE_STOP
from luna_core.planning.diffusion_es import DiffusionESConfig
from luna_core.planning.factory import make_planner
from luna_core.planning.forecast import constant_velocity_forecast
from luna_core.planning.reference_paths import OffMapError
from luna_core.types import (ACTION_INDEX, DecisionDistribution, EgoState, ObjectClass, PlannerInput,
                             Route, TrackedObject, TrackedObjects, TrafficLightPhase, TrafficLights,
                             TrafficLightState)

from tests.unit.core.test_pdm import graph as road  # the same two lanes and junction lane

SEARCH = DiffusionESConfig(population=16, warm_starts=15, iterations=1, renoise_steps=(3,))
PLANNERS = ("luna", "diffusion-es", "pdm", "idm")


def car(i: str, x: float, y: float = 0.0, vx: float = 0.0) -> TrackedObject:
    return TrackedObject(i, ObjectClass.VEHICLE, x, y, 0.0, vx, 0.0, 4.5, 2.0)


def make_input(x: float = 120.0, y: float = 0.0) -> PlannerInput:
    """Behind a slow car, a faster one in the left lane, one 60 m away (beyond PDM-Closed's 50 m) and a
    red light at the junction; a decision to keep the lane or change left."""
    history = [EgoState(-0.1 * k, x - 1.0 * k, y, 0.0, 10.0) for k in range(20, -1, -1)]
    p = np.zeros(10)
    p[ACTION_INDEX["CK"]], p[ACTION_INDEX["CL"]] = 0.7, 0.3
    objects = [car("slow", x + 25.0, vx=4.0), car("fast", x - 10.0, y=4.0, vx=12.0), car("far", x + 60.0, vx=8.0)]
    return PlannerInput(0.0, history, TrackedObjects(0.0, objects),
                        TrafficLights(0.0, [TrafficLightState("j", TrafficLightPhase.RED)]), road(),
                        Route(0.0, ["r0", "r1"]), DecisionDistribution(-0.2, p, ["CK", "CL"]))


@pytest.fixture(scope="module")
def planners() -> dict:
    torch.set_num_threads(1)
    search = {"search": SEARCH, "deterministic": True}
    return {name: make_planner(name, search if name in ("luna", "diffusion-es") else None) for name in PLANNERS}


@pytest.fixture
def setup_calls(monkeypatch) -> dict[str, int]:
    """How often the context module searched the map for lane sequences and forecast the objects."""
    calls = {"lane_sequences": 0, "constant_velocity_forecast": 0}
    for name in calls:
        real = getattr(context_module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(context_module, name, counted)
    return calls


def _plan(planner, pi: PlannerInput, context=None):
    planner.reset()
    return planner.plan(pi) if context is None else planner.plan(pi, context=context)


@pytest.mark.parametrize("name", PLANNERS)
def test_each_planner_sets_its_cycle_up_once(planners, setup_calls, name) -> None:
    pi = make_input()
    planner = planners[name]
    planner.reset()
    for _ in range(2):
        traj = planner.plan(pi)
        assert traj.is_finite() and abs(traj.x[0] - pi.ego.x) < 0.5
    assert setup_calls == {"lane_sequences": 2, "constant_velocity_forecast": 2}, name
    assert planner.last_context is not None and planner.last_context.planner_input is pi


def test_one_context_serves_both_planner_families(planners, setup_calls) -> None:
    pi = make_input()
    own = {name: _plan(planners[name], pi) for name in PLANNERS}  # each sets its own cycle up
    assert setup_calls == {"lane_sequences": 4, "constant_velocity_forecast": 4}
    shared = build_planning_context(pi)
    for name in PLANNERS:
        traj = _plan(planners[name], pi, shared)
        assert planners[name].last_context is shared, name
        # The same set-up gives the same trajectory, bit for bit.
        for a in ("t", "x", "y", "heading", "velocity", "acceleration"):
            assert getattr(traj, a).tobytes() == getattr(own[name], a).tobytes(), (name, a)
    assert setup_calls == {"lane_sequences": 5, "constant_velocity_forecast": 5}  # the shared one, once
    assert planners["luna"].last.mode == MODE_DECISION


def test_a_context_of_another_input_or_time_grid_is_refused(planners) -> None:
    pi = make_input()
    with pytest.raises(ValueError, match="built from another planner input"):
        planners["pdm"].plan(make_input(), context=build_planning_context(pi))
    with pytest.raises(ValueError, match="the planning context is for 50 output / 40 scored steps"):
        planners["pdm"].plan(pi, context=build_planning_context(pi, output_horizon=5.0))


def test_near_forecast_is_pdm_closeds_50_m_forecast_with_the_red_light() -> None:
    pi = make_input()
    ctx = build_planning_context(pi)
    assert ctx.forecast.ids == ["fast", "slow", "far", "red_light:j"]  # nearest first; 8 s trajectories reach 60 m
    direct = constant_velocity_forecast(pi, lane_map(pi.lane_graph), list(ctx.sequences["K"]), 81)
    assert ctx.near_forecast.ids == direct.ids == ["fast", "slow", "red_light:j"]
    assert ctx.near_forecast.pose.tobytes() == direct.pose.tobytes()
    assert ctx.scoring_forecast.pose.shape == (3, 41, 3)
    assert ctx.scoring.centerline is ctx.paths["K"].centerline and set(ctx.paths) == {"K", "L"}
    # The baselines' centreline is shorter: what the ego covers at IDM's a_max in 8 s plus 30 m.
    assert ctx.route_reference.centerline.length < ctx.paths["K"].centerline.length


def test_input_problems_and_off_map() -> None:
    pi = make_input()
    bad = PlannerInput(pi.time, pi.ego_history[:-1] + [EgoState(0.0, float("nan"), 0.0, 0.0, 10.0)], pi.objects,
                       pi.traffic_lights, pi.lane_graph, pi.route, pi.decision)
    ctx = build_planning_context(bad)
    # (the unmeasured steering angle estimated from its yaw rate, 0)
    assert ctx.ego == dataclasses.replace(pi.ego_history[-2], steering_angle=0.0)
    assert "latest ego state is not finite" in ctx.input_problems[0]
    with pytest.raises(PlannerInputError, match="no finite state"):
        build_planning_context(PlannerInput(0.0, [EgoState(0.0, float("nan"), 0.0, 0.0, 1.0)], pi.objects,
                                            pi.traffic_lights, pi.lane_graph, pi.route))
    off = build_planning_context(make_input(y=500.0))
    assert "no lane within reach" in off.off_map and off.paths == {} and off.forecast is None
    with pytest.raises(OffMapError, match="route_reference: no lane within reach"):
        off.route_reference  # noqa: B018 (the property raises)


def test_off_the_map_the_decision_guided_planner_stops_and_the_baselines_raise(planners) -> None:
    pi = make_input(y=500.0)
    ctx = build_planning_context(pi)
    res = planners["luna"].plan_detailed(pi, context=ctx)
    assert res.mode == MODE_STOP and any("no reference path" in r for r in res.reasons)
    for name in ("pdm", "idm"):
        with pytest.raises(OffMapError, match=f"{name}: no lane within reach"):
            planners[name].plan(pi, context=ctx)


def test_planning_starts_from_the_measured_steering_angle_else_the_one_the_yaw_rate_implies() -> None:
    # A measured angle (the simulator's; over ROS the vehicle's steering report) is used as it is, also at
    # a standstill, where a car that stopped in a turn keeps its wheels turned. Without one (odometry
    # alone) the kinematic bicycle's angle: the same while moving, 0 at a standstill.
    pi = make_input()
    wheelbase = pi.vehicle.wheelbase
    for velocity, steering in ((6.0, 0.05), (6.0, -0.2), (0.0, 0.3), (0.1, 0.3)):
        yaw_rate = velocity * np.tan(steering) / wheelbase
        ego = dataclasses.replace(pi.ego, velocity=velocity, yaw_rate=yaw_rate, steering_angle=None)
        ctx = build_planning_context(dataclasses.replace(pi, ego_history=[ego]))
        expected = steering if velocity >= context_module.STEERING_MIN_SPEED else 0.0
        assert ctx.ego.steering_angle == pytest.approx(expected, abs=1e-12), (velocity, steering)
        measured = dataclasses.replace(ego, steering_angle=steering + 0.1)
        ctx = build_planning_context(dataclasses.replace(pi, ego_history=[measured]))
        assert ctx.ego.steering_angle == steering + 0.1, (velocity, steering)
    assert context_module.kinematic_steering_angle(-3.0, -3.0 * np.tan(0.1) / wheelbase, wheelbase) == \
        pytest.approx(0.1), "reversing: the same wheel angle"
