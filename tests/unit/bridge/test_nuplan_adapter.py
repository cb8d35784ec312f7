"""nuPlan adapter: conversions on hand-built devkit-shaped objects, and the real ``AbstractPlanner``
subclass on real devkit objects where the devkit is importable (skipped with the reason elsewhere).

The hand-built objects carry exactly the attributes the devkit (v1.2) defines, so the conversions
see what they would see inside ``run_simulation.py``; the map is a small road in nuPlan-sized
(UTM) coordinates: roadblock ``rb1`` (lanes ``L1`` right, ``L2`` left, along +x), roadblock
connector ``rbc1`` (lane connector ``C1`` continuing ``L1``), roadblock ``rb2`` (lane ``L3``), plus an
off-route lane ``X9`` next to the ego.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest
import yaml

from luna_core.planning.factory import make_planner
from luna_core.types import LaneGraph, ObjectClass, TrafficLightPhase, Trajectory, VehicleParameters
from luna_bridge.nuplan.convert import (MapLayer, NuPlanConversionError, collect_lane_edges, ego_history_from_nuplan,
                                        ego_state_from_nuplan, extend_lane_graph, lane_from_nuplan,
                                        planner_input_from_nuplan, rear_axle_samples, route_from_nuplan,
                                        tracked_objects_from_nuplan, traffic_lights_from_nuplan,
                                        vehicle_from_nuplan)
from luna_bridge.nuplan.scenario_filter import TokenListError, main as filter_main, read_tokens, scenario_filter_yaml
from tests.devkit import require_devkit

X0, Y0 = 664_000.0, 3_997_000.0  # a nuPlan-like (UTM) origin: conversions must keep full precision
T0_US = 1_630_000_000_000_000  # microseconds, like nuPlan's time points
WIDTH = 3.5


# ---- hand-built devkit-shaped objects ------------------------------------------------------------


def _path(x0: float, x1: float, y: float, n: int = 21) -> NS:
    return NS(discrete_path=[NS(x=X0 + x, y=Y0 + y, heading=0.0) for x in np.linspace(x0, x1, n)])


def _edge(lane_id: str, x0: float, x1: float, y: float, road: str, limit: float | None = 15.0) -> NS:
    e = NS(id=lane_id, baseline_path=_path(x0, x1, y), left_boundary=_path(x0, x1, y + WIDTH / 2),
           right_boundary=_path(x0, x1, y - WIDTH / 2), speed_limit_mps=limit, incoming_edges=[],
           outgoing_edges=[], adjacent_edges=(None, None))
    e.get_roadblock_id = lambda: road
    return e


class FakeMap:
    """The two map queries the adapter makes (``get_map_object``, ``get_proximal_map_objects``)."""

    def __init__(self, layers=MapLayer) -> None:
        self.layers = layers
        l1, l2 = _edge("L1", 0, 100, 0, "rb1"), _edge("L2", 0, 100, WIDTH, "rb1")
        c1 = _edge("C1", 100, 120, 0, "rbc1", limit=None)
        l3 = _edge("L3", 120, 300, 0, "rb2")
        x9 = _edge("X9", 0, 100, -WIDTH, "rb9")
        l1.adjacent_edges, l2.adjacent_edges = (l2, None), (None, l1)
        l1.outgoing_edges, c1.incoming_edges, c1.outgoing_edges, l3.incoming_edges = [c1], [l1], [l3], [c1]
        self.lanes = {e.id: e for e in (l1, l2, l3, x9)}
        self.connectors = {"C1": c1}
        self.blocks = {"rb1": NS(interior_edges=[l1, l2]), "rb2": NS(interior_edges=[l3])}
        self.block_connectors = {"rbc1": NS(interior_edges=[c1])}
        self.proximal_calls = 0

    def get_map_object(self, object_id: str, layer):
        table = {self.layers.ROADBLOCK: self.blocks, self.layers.ROADBLOCK_CONNECTOR: self.block_connectors}[layer]
        return table.get(object_id)

    def get_proximal_map_objects(self, point, radius: float, layers):
        self.proximal_calls += 1

        def near(e: NS) -> bool:
            pts = np.array([[p.x, p.y] for p in e.baseline_path.discrete_path])
            return bool(np.min(np.hypot(pts[:, 0] - point.x, pts[:, 1] - point.y)) <= radius)

        out = {self.layers.LANE: [e for e in self.lanes.values() if near(e)],
               self.layers.LANE_CONNECTOR: [e for e in self.connectors.values() if near(e)]}
        return {k: v for k, v in out.items() if k in layers}


def _ego(t_us: int, x: float, y: float = 0.0, heading: float = 0.0, v: float = 8.0, a: float = 0.5,
         lateral_v: float = 0.1) -> NS:
    return NS(time_point=NS(time_us=t_us), rear_axle=NS(x=X0 + x, y=Y0 + y, heading=heading),
              dynamic_car_state=NS(rear_axle_velocity_2d=NS(x=v, y=lateral_v),
                                   rear_axle_acceleration_2d=NS(x=a, y=0.0), angular_velocity=0.02),
              tire_steering_angle=0.01)


def _agent(token: str, type_name: str, x: float, y: float, vx: float | None) -> NS:
    obj = NS(track_token=token, tracked_object_type=NS(name=type_name), center=NS(x=X0 + x, y=Y0 + y, heading=0.1),
             box=NS(length=4.6, width=1.9))
    if vx is not None:
        obj.velocity = NS(x=vx, y=0.5)
    return obj


def _detections(*objs: NS) -> NS:
    return NS(tracked_objects=NS(tracked_objects=list(objs)))


# ---- ego, vehicle, objects, lights ---------------------------------------------------------------


def test_ego_state_keeps_rear_axle_pose_speeds_and_time() -> None:
    e = ego_state_from_nuplan(_ego(T0_US + 100_000, 12.5, 1.0, 0.3, v=7.0, a=-1.2, lateral_v=0.4))
    assert e.stamp == pytest.approx(T0_US * 1e-6 + 0.1, abs=1e-6)
    assert (e.x, e.y, e.heading) == (X0 + 12.5, Y0 + 1.0, 0.3)
    assert (e.velocity, e.acceleration, e.lateral_velocity) == (7.0, -1.2, 0.4)
    assert (e.yaw_rate, e.steering_angle) == (0.02, 0.01)


def test_non_finite_ego_state_names_the_field_and_time() -> None:
    with pytest.raises(NuPlanConversionError, match=r"time_us 1630000000000000: non-finite velocity"):
        ego_state_from_nuplan(_ego(T0_US, 0.0, v=math.nan))


def test_ego_history_must_increase_in_time() -> None:
    hist = ego_history_from_nuplan([_ego(T0_US + k * 100_000, k * 0.8) for k in range(3)])
    assert [round(h.x - X0, 6) for h in hist] == [0.0, 0.8, 1.6]
    with pytest.raises(NuPlanConversionError, match="increasing time order at entry 2"):
        ego_history_from_nuplan([_ego(T0_US, 0.0), _ego(T0_US + 100_000, 1.0), _ego(T0_US + 100_000, 2.0)])
    with pytest.raises(NuPlanConversionError, match="no ego state"):
        ego_history_from_nuplan([])


def test_vehicle_parameters_from_the_devkit_names() -> None:
    pacifica = NS(width=2.297, front_length=4.049, rear_length=1.127, wheel_base=3.089,
                  cog_position_from_rear_axle=1.67)
    assert vehicle_from_nuplan(pacifica) == VehicleParameters()


def test_tracked_objects_classes_velocities_and_skipped_ego() -> None:
    objs = tracked_objects_from_nuplan(_detections(
        _agent("car", "VEHICLE", 20, 0, 5.0), _agent("ped", "PEDESTRIAN", 30, 3, 1.2),
        _agent("cone", "TRAFFIC_CONE", 40, 0, None), _agent("generic", "GENERIC_OBJECT", 50, 0, 0.3),
        _agent("me", "EGO", 0, 0, 8.0)), stamp=5.0).objects
    assert [o.id for o in objs] == ["car", "ped", "cone", "generic"]
    assert [o.object_class for o in objs] == [ObjectClass.VEHICLE, ObjectClass.PEDESTRIAN, ObjectClass.STATIC,
                                              ObjectClass.STATIC]
    assert (objs[0].x, objs[0].y, objs[0].heading, objs[0].vx, objs[0].vy) == (X0 + 20, Y0, 0.1, 5.0, 0.5)
    assert (objs[2].vx, objs[2].vy) == (0.0, 0.0)  # static objects carry no velocity in the devkit
    assert (objs[0].length, objs[0].width) == (4.6, 1.9)


def test_bad_observations_are_named() -> None:
    with pytest.raises(NuPlanConversionError, match="unknown type 'UFO'"):
        tracked_objects_from_nuplan(_detections(_agent("x", "UFO", 0, 0, 0.0)), 0.0)
    with pytest.raises(NuPlanConversionError, match="Sensors has no tracked objects"):
        tracked_objects_from_nuplan(type("Sensors", (), {})(), 0.0)


def test_traffic_lights_by_lane_connector() -> None:
    data = [NS(status=NS(name=n), lane_connector_id=k, timestamp=0) for k, n in
            ((11, "RED"), (12, "GREEN"), (13, "YELLOW"), (14, "UNKNOWN"))]
    lights = traffic_lights_from_nuplan(data, 3.0)
    assert [(tl.lane_id, tl.phase) for tl in lights.lights] == [
        ("11", TrafficLightPhase.RED), ("12", TrafficLightPhase.GREEN), ("13", TrafficLightPhase.YELLOW),
        ("14", TrafficLightPhase.NONE)]
    assert traffic_lights_from_nuplan(None, 3.0).lights == []
    with pytest.raises(NuPlanConversionError, match="lane connector 9: unknown status 'BLUE'"):
        traffic_lights_from_nuplan([NS(status=NS(name="BLUE"), lane_connector_id=9)], 0.0)


# ---- map and route -------------------------------------------------------------------------------


def test_route_roadblocks_and_proximal_lanes_become_the_lane_graph() -> None:
    m = FakeMap()
    edges = collect_lane_edges(m, ["rb1", "rbc1", "rb2"])
    assert [(e.id, conn) for e, conn in edges] == [("L1", False), ("L2", False), ("C1", True), ("L3", False)]
    g = LaneGraph()
    assert extend_lane_graph(g, edges) == ["L1", "L2", "C1", "L3"]
    l1, c1 = g.lanes["L1"], g.lanes["C1"]
    assert (l1.road_id, l1.successors, l1.left_neighbor, l1.right_neighbor) == ("rb1", ["C1"], "L2", "")
    assert g.lanes["L2"].right_neighbor == "L1"
    assert (c1.in_junction, c1.speed_limit, c1.predecessors, c1.successors) == (True, 0.0, ["L1"], ["L3"])
    assert l1.width == pytest.approx(WIDTH)
    assert l1.centerline[0] == pytest.approx([X0, Y0])
    # The neighbourhood query adds the off-route lane once; converted lanes are not converted again.
    near = collect_lane_edges(m, (), point=NS(x=X0 + 10, y=Y0), radius=20.0)
    assert extend_lane_graph(g, near) == ["X9"]
    assert extend_lane_graph(g, near) == []


def test_unknown_route_roadblock_is_an_error_naming_it() -> None:
    with pytest.raises(NuPlanConversionError, match="not in the map: nope"):
        collect_lane_edges(FakeMap(), ["rb1", "nope"])


def test_degenerate_lane_geometry_is_named() -> None:
    e = _edge("Z", 0, 10, 0, "rb")
    e.baseline_path = NS(discrete_path=[NS(x=1.0, y=2.0), NS(x=1.0, y=2.0)])
    with pytest.raises(NuPlanConversionError, match="lane Z baseline path has zero length"):
        lane_from_nuplan(e, False)
    e = _edge("Z", 0, 10, 0, "rb")
    e.left_boundary = NS(discrete_path=[NS(x=0.0, y=math.inf), NS(x=1.0, y=0.0)])
    with pytest.raises(NuPlanConversionError, match="lane Z left boundary contains non-finite"):
        lane_from_nuplan(e, False)


def test_route_and_goal() -> None:
    r = route_from_nuplan(["rb1", "rbc1", "rb2"], NS(x=X0 + 250, y=Y0, heading=0.0), 1.0)
    assert (r.road_ids, r.goal_x, r.goal_heading) == (["rb1", "rbc1", "rb2"], X0 + 250, 0.0)
    assert math.isnan(route_from_nuplan(["rb1"], None, 0.0).goal_x)
    with pytest.raises(NuPlanConversionError, match="no route roadblock ids"):
        route_from_nuplan([], None, 0.0)


# ---- trajectory out ------------------------------------------------------------------------------


def test_rear_axle_samples_times_and_bicycle_steering_on_a_circle() -> None:
    radius, v = 20.0, 5.0
    t = np.arange(0, 4.05, 0.1)
    ang = v * t / radius
    traj = Trajectory(10.5, t, radius * np.sin(ang), radius * (1 - np.cos(ang)), ang, np.full_like(t, v),
                      np.zeros_like(t))
    vehicle = VehicleParameters()
    s = rear_axle_samples(traj, vehicle, origin_s=10.5, origin_us=T0_US)
    assert s[0].time_us == T0_US and s[-1].time_us == T0_US + 4_000_000
    interior = np.array([p.steering_angle for p in s[1:-1]])
    assert interior == pytest.approx(math.atan(vehicle.wheelbase / radius), rel=1e-3)
    assert np.array([p.yaw_rate for p in s]) == pytest.approx(v / radius, rel=1e-3)
    straight = Trajectory(0.0, t, 3.0 * t, np.zeros_like(t), np.zeros_like(t), np.full_like(t, 3.0),
                          np.zeros_like(t))
    assert all(p.steering_angle == 0.0 for p in rear_axle_samples(straight, vehicle))


def test_rear_axle_samples_reject_unusable_trajectories() -> None:
    one = Trajectory(0.0, np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1))
    with pytest.raises(NuPlanConversionError, match="1 sample"):
        rear_axle_samples(one, VehicleParameters())
    t = np.array([0.0, 0.1, 0.1])
    with pytest.raises(NuPlanConversionError, match="strictly increasing"):
        rear_axle_samples(Trajectory(0.0, t, t, t, t, t, t), VehicleParameters())


# ---- the luna planner on converted input ---------------------------------------------------------


def test_pdm_plans_on_a_converted_planner_input_and_stops_behind_a_stopped_car() -> None:
    """End to end without the devkit: devkit-shaped history, detections and map -> PDM baseline."""
    m = FakeMap()
    graph = LaneGraph()
    extend_lane_graph(graph, collect_lane_edges(m, ["rb1", "rbc1", "rb2"], NS(x=X0 + 10, y=Y0), 60.0))
    route = route_from_nuplan(["rb1", "rbc1", "rb2"], None, 0.0)
    history = [_ego(T0_US + k * 100_000, 10.0 + 0.8 * k, v=8.0, a=0.0, lateral_v=0.0) for k in range(-20, 1)]
    pin = planner_input_from_nuplan(history, _detections(_agent("stopped", "VEHICLE", 45, 0, 0.0)), [], graph,
                                    route, VehicleParameters())
    pin.objects.objects[0].vy = 0.0
    pin.objects.objects[0].heading = 0.0
    assert len(pin.ego_history) == 21 and pin.time == pin.ego.stamp
    traj = make_planner("pdm").plan(pin)
    samples = rear_axle_samples(traj, pin.vehicle, origin_s=pin.ego.stamp, origin_us=T0_US)
    assert samples[0].time_us == T0_US
    front = np.array([p.x for p in samples]) - X0 + pin.vehicle.front_length
    assert front.max() < 45 - 4.6 / 2  # stops before the stopped car's rear
    assert samples[-1].velocity < 0.5
    assert np.all(np.abs(np.array([p.y for p in samples]) - Y0) < 1.2)  # stays in its lane


# ---- scenario filter -----------------------------------------------------------------------------


def test_scenario_filter_yaml_from_a_token_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("a36c1b943871552a\n# comment\n\n1234567890123456\n")
    assert read_tokens(tokens) == ["a36c1b943871552a", "1234567890123456"]
    out = tmp_path / "cfg" / "scenario_filter" / "test14_hard.yaml"
    assert filter_main([str(tokens), str(out)]) == 0
    cfg = yaml.safe_load(out.read_text())
    assert cfg["_target_"] == "nuplan.planning.scenario_builder.scenario_filter.ScenarioFilter"
    assert cfg["scenario_tokens"] == ["a36c1b943871552a", "1234567890123456"]  # strings, not a number
    assert (cfg["timestamp_threshold_s"], cfg["remove_invalid_goals"], cfg["shuffle"]) == (15, True, False)
    assert yaml.safe_load(scenario_filter_yaml(["00000000000000ff"]))["scenario_tokens"] == ["00000000000000ff"]


def test_scenario_filter_rejects_bad_token_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("a36c1b943871552a\nnot-a-token\n")
    with pytest.raises(TokenListError, match=r"bad.txt:2: 'not-a-token'"):
        read_tokens(bad)
    bad.write_text("a36c1b943871552a\na36c1b943871552a\n")
    with pytest.raises(TokenListError, match="duplicate token"):
        read_tokens(bad)
    assert filter_main([str(tmp_path / "missing.txt"), str(tmp_path / "x.yaml")]) == 2


# ---- the real devkit -----------------------------------------------------------------------------


def test_devkit_planner_runs_on_real_devkit_objects() -> None:
    """``LunaNuPlanPlanner`` inside the devkit's own types: initialise with a ``PlannerInitialization``,
    plan from a ``PlannerInput`` (``SimulationHistoryBuffer`` of ``EgoState``s and ``DetectionsTracks``,
    ``TrafficLightStatusData``), check the ``InterpolatedTrajectory`` it returns and its replan reuse."""
    require_devkit()
    from nuplan.common.actor_state.agent import Agent
    from nuplan.common.actor_state.ego_state import EgoState
    from nuplan.common.actor_state.oriented_box import OrientedBox
    from nuplan.common.actor_state.scene_object import SceneObjectMetadata
    from nuplan.common.actor_state.state_representation import StateSE2, StateVector2D, TimePoint
    from nuplan.common.actor_state.tracked_objects import TrackedObjects
    from nuplan.common.actor_state.tracked_objects_types import TrackedObjectType
    from nuplan.common.actor_state.vehicle_parameters import get_pacifica_parameters
    from nuplan.common.maps.maps_datatypes import SemanticMapLayer, TrafficLightStatusData, TrafficLightStatusType
    from nuplan.planning.simulation.history.simulation_history_buffer import SimulationHistoryBuffer
    from nuplan.planning.simulation.observation.observation_type import DetectionsTracks
    from nuplan.planning.simulation.planner.abstract_planner import PlannerInitialization, PlannerInput
    from nuplan.planning.simulation.simulation_time_controller.simulation_iteration import SimulationIteration
    from nuplan.planning.simulation.trajectory.interpolated_trajectory import InterpolatedTrajectory

    from luna_bridge.nuplan.planner import LunaNuPlanPlanner

    params = get_pacifica_parameters()
    ego_states, observations = deque(), deque()
    for k in range(-20, 1):
        t = TimePoint(T0_US + k * 100_000)
        ego_states.append(EgoState.build_from_rear_axle(StateSE2(X0 + 10 + 0.8 * k, Y0, 0.0), StateVector2D(8.0, 0.0),
                                                        StateVector2D(0.0, 0.0), 0.0, t, params))
        lead = Agent(TrackedObjectType.VEHICLE, OrientedBox(StateSE2(X0 + 45, Y0, 0.0), 4.6, 1.9, 1.7),
                     StateVector2D(0.0, 0.0), SceneObjectMetadata(t.time_us, "tok", 1, "lead"))
        observations.append(DetectionsTracks(TrackedObjects([lead])))
    history = SimulationHistoryBuffer(ego_states, observations, 0.1)
    m = FakeMap(SemanticMapLayer)
    planner = LunaNuPlanPlanner(planner="pdm", replan_every=5)
    assert planner.name() == "luna_pdm" and planner.observation_type() is DetectionsTracks
    assert LunaNuPlanPlanner.requires_scenario is False
    planner.initialize(PlannerInitialization(["rb1", "rbc1", "rb2"], StateSE2(X0 + 250, Y0, 0.0), m))
    lights = [TrafficLightStatusData(TrafficLightStatusType.GREEN, 7, T0_US)]
    now = ego_states[-1].time_point
    traj = planner.compute_trajectory(PlannerInput(SimulationIteration(now, 0), history, lights))
    assert isinstance(traj, InterpolatedTrajectory)
    assert traj.start_time.time_us == now.time_us and traj.end_time.time_us >= now.time_us + 4_000_000
    states = traj.get_sampled_trajectory()
    front = np.array([s.rear_axle.x for s in states]) - X0 + params.front_length
    assert front.max() < 45 - 4.6 / 2
    assert states[0].rear_axle.x == pytest.approx(X0 + 10, abs=1e-6)
    assert traj.get_state_at_time(TimePoint(now.time_us + 500_000)).dynamic_car_state.speed < 8.0
    # Between replans the same trajectory comes back; the lane graph grew by the off-route lane.
    again = planner.compute_trajectory(PlannerInput(SimulationIteration(TimePoint(now.time_us + 100_000), 1),
                                                    history, lights))
    assert again is traj and m.proximal_calls == 1
    assert len(planner.generate_planner_report().compute_trajectory_runtimes) == 2
