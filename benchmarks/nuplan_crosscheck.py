"""Cross-check the bridge's controller and metrics against the nuPlan devkit on hand-built scenes.

Runs only where the devkit is importable (it is not on PyPI; see docs/nuplan.md for the throwaway
venv used here)::

    /work/nuplan-venv/bin/python benchmarks/nuplan_crosscheck.py

1. Tracking: the same reference trajectories tracked for 10 s by the devkit's ``TwoStageController``
   (``LQRTracker`` with nuPlan's gains + ``KinematicBicycleModel``; the reference handed over as an
   ``InterpolatedTrajectory`` built by the adapter's ``rear_axle_samples``) and by ours
   (``luna_core.control.track_step``, what ``luna_bridge.sim`` runs every step).
2. Metrics: hand-built runs on a small two-lane map, scored by the devkit's metric classes (with
   nuPlan's default parameters) on a ``SimulationHistory`` and by ``luna_bridge.metrics.score_log``
   on the equivalent ``SimulationLog``. The devkit reads the map through a small ``AbstractMap``
   built from the same lane graph (devkit ``Lane`` / ``RoadBlockGraphEdgeMapObject`` subclasses with
   the devkit's own ``NuPlanPolylineMapObject`` paths).

Prints Markdown tables (copied into docs/nuplan.md), then the verdict: exit status 0 when every value
agrees (tracking to 1e-6, metrics to 0.01), 1 with each disagreement listed, 2 without the devkit.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":  # before the devkit imports, so that --help works without the devkit
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crosscheck_verdict import (EXIT_NO_DEVKIT, METRIC_TOLERANCE, TRACKING_TOLERANCE,  # noqa: E402
                                exit_status, metric_disagreement, tracking_disagreements)

try:
    import pandas as pd
    from shapely.geometry import LineString, Point, Polygon
    from shapely.ops import unary_union

    from nuplan.common.actor_state.agent import Agent
    from nuplan.common.actor_state.ego_state import EgoState as NEgoState
    from nuplan.common.actor_state.oriented_box import OrientedBox
    from nuplan.common.actor_state.scene_object import SceneObjectMetadata
    from nuplan.common.actor_state.state_representation import StateSE2, StateVector2D, TimePoint
    from nuplan.common.actor_state.static_object import StaticObject
    from nuplan.common.actor_state.tracked_objects import TrackedObjects as NTrackedObjects
    from nuplan.common.actor_state.tracked_objects_types import TrackedObjectType
    from nuplan.common.actor_state.vehicle_parameters import get_pacifica_parameters
    from nuplan.common.maps.abstract_map import AbstractMap
    from nuplan.common.maps.abstract_map_objects import Lane as NLane, RoadBlockGraphEdgeMapObject
    from nuplan.common.maps.maps_datatypes import SemanticMapLayer
    from nuplan.common.maps.nuplan_map.polyline_map_object import NuPlanPolylineMapObject
    from nuplan.planning.metrics.evaluation_metrics.common.drivable_area_compliance import \
        DrivableAreaComplianceStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_is_comfortable import EgoIsComfortableStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_jerk import EgoJerkStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_lane_change import EgoLaneChangeStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_lat_acceleration import EgoLatAccelerationStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_lon_acceleration import EgoLonAccelerationStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_lon_jerk import EgoLonJerkStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_progress_along_expert_route import \
        EgoProgressAlongExpertRouteStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_yaw_acceleration import EgoYawAccelerationStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.ego_yaw_rate import EgoYawRateStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.no_ego_at_fault_collisions import \
        EgoAtFaultCollisionStatistics
    from nuplan.planning.metrics.evaluation_metrics.common.speed_limit_compliance import \
        SpeedLimitComplianceStatistics
    from nuplan.planning.simulation.controller.motion_model.kinematic_bicycle import KinematicBicycleModel
    from nuplan.planning.simulation.controller.tracker.lqr import LQRTracker
    from nuplan.planning.simulation.controller.two_stage_controller import TwoStageController
    from nuplan.planning.simulation.history.simulation_history import SimulationHistory, SimulationHistorySample
    from nuplan.planning.simulation.observation.observation_type import DetectionsTracks
    from nuplan.planning.simulation.simulation_time_controller.simulation_iteration import SimulationIteration
    from nuplan.planning.simulation.trajectory.interpolated_trajectory import InterpolatedTrajectory
except ImportError as exc:  # the devkit is optional and never installed by the project
    print(f"nuPlan devkit not importable ({exc}); see docs/nuplan.md", file=sys.stderr)
    sys.exit(EXIT_NO_DEVKIT)

from luna_core.control import track_step
from luna_core.lanes import make_lane
from luna_core.types import EgoState, LaneGraph, ObjectClass, Route, TrackedObject, TrackedObjects, Trajectory
from luna_bridge.metrics import score_log
from luna_bridge.nuplan.convert import rear_axle_samples, vehicle_from_nuplan
from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario, SimulationLog

PACIFICA = get_pacifica_parameters()
VEHICLE = vehicle_from_nuplan(PACIFICA)
T0_US = 1_000_000_000


def _tp(k: int) -> TimePoint:
    return TimePoint(T0_US + int(round(k * SIM_DT * 1e6)))


def _n_ego(e: EgoState, k: int) -> NEgoState:
    return NEgoState.build_from_rear_axle(StateSE2(e.x, e.y, e.heading), StateVector2D(e.velocity, 0.0),
                                          StateVector2D(e.acceleration, 0.0), e.steering_angle, _tp(k), PACIFICA,
                                          angular_vel=e.yaw_rate)


def _to_interpolated(traj: Trajectory) -> InterpolatedTrajectory:
    samples = rear_axle_samples(traj, VEHICLE, origin_s=0.0, origin_us=T0_US)
    return InterpolatedTrajectory([NEgoState.build_from_rear_axle(
        StateSE2(s.x, s.y, s.heading), StateVector2D(s.velocity, 0.0), StateVector2D(s.acceleration, 0.0),
        s.steering_angle, TimePoint(s.time_us), PACIFICA, angular_vel=s.yaw_rate) for s in samples])


# ==================================================================================================
# 1. Tracking
# ==================================================================================================


def _reference(kind: str) -> Trajectory:
    """Reference trajectories (rear axle) over 12 s at 0.1 s, t from 0."""
    t = np.arange(0.0, 12.05, 0.1)
    if kind == "straight 10 m/s":
        s = 10.0 * t
        xy, v = np.column_stack([s, np.zeros_like(t)]), np.full_like(t, 10.0)
    elif kind == "accelerate 0 -> 12 m/s":
        v = np.minimum(1.5 * t, 12.0)
        s = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * 0.1)])
        xy = np.column_stack([s, np.zeros_like(t)])
    elif kind == "brake 12 m/s -> stop":
        v = np.maximum(12.0 - 3.0 * np.maximum(t - 2.0, 0.0), 0.0)
        s = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * 0.1)])
        xy = np.column_stack([s, np.zeros_like(t)])
    elif kind == "circle R 25 m, 8 m/s":
        ang = 8.0 * t / 25.0
        xy, v = np.column_stack([25.0 * np.sin(ang), 25.0 * (1 - np.cos(ang))]), np.full_like(t, 8.0)
    elif kind == "lane change 3.5 m, 12 m/s":
        x = 12.0 * t
        y = 3.5 * np.clip((t - 2.0) / 4.0, 0, 1) ** 3 * (10 - 15 * np.clip((t - 2.0) / 4.0, 0, 1)
                                                         + 6 * np.clip((t - 2.0) / 4.0, 0, 1) ** 2)
        xy, v = np.column_stack([x, y]), None
    elif kind == "S-curve 10 m/s":
        x = 10.0 * t
        xy, v = np.column_stack([x, 4.0 * np.sin(2 * np.pi * x / 80.0)]), None
    else:
        raise ValueError(kind)
    d = np.diff(xy, axis=0)
    heading = np.unwrap(np.arctan2(d[:, 1], d[:, 0]))
    heading = np.concatenate([heading, heading[-1:]])
    if v is None:
        v = np.concatenate([np.hypot(d[:, 0], d[:, 1]) / 0.1, [np.hypot(*d[-1]) / 0.1]])
    if kind.startswith("accelerate") or kind.startswith("brake"):
        heading = np.zeros_like(t)
    return Trajectory(0.0, t, xy[:, 0], xy[:, 1], heading, v, np.gradient(v, t))


@dataclass
class TrackingRow:
    case: str
    start: str
    max_position: float
    max_heading: float
    max_velocity: float
    final_position: float
    max_tracking_error: float  # how far ours strays from the reference: the scale of the differences


def compare_tracking(kind: str, start_offset: tuple[float, float, float] = (0.0, 0.0, 0.0),
                     steps: int = 100) -> TrackingRow:
    ref = _reference(kind)
    dy, dh, dv = start_offset
    ego = EgoState(0.0, float(ref.x[0]), float(ref.y[0]) + dy, float(ref.heading[0]) + dh,
                   float(ref.velocity[0]) + dv, steering_angle=0.0)  # both trackers start with straight wheels
    tracker = LQRTracker(q_longitudinal=[10.0], r_longitudinal=[1.0], q_lateral=[1.0, 10.0, 0.0], r_lateral=[1.0],
                         discretization_time=0.1, tracking_horizon=10, jerk_penalty=1e-4,
                         curvature_rate_penalty=1e-2, stopping_proportional_gain=0.5, stopping_velocity=0.2)
    controller = TwoStageController(SimpleNamespace(initial_ego_state=_n_ego(ego, 0)), tracker,
                                    KinematicBicycleModel(PACIFICA))
    interp = _to_interpolated(ref)
    ours = [ego]
    theirs = [controller.get_state()]
    for k in range(steps):
        ours.append(track_step(ours[-1], ref, VEHICLE))
        controller.update_state(SimulationIteration(_tp(k), k), SimulationIteration(_tp(k + 1), k + 1),
                                theirs[-1], interp)
        theirs.append(controller.get_state())
    a = np.array([[e.x, e.y, e.heading, e.velocity] for e in ours])
    b = np.array([[e.rear_axle.x, e.rear_axle.y, e.rear_axle.heading, e.dynamic_car_state.rear_axle_velocity_2d.x]
                  for e in theirs])
    pos = np.hypot(a[:, 0] - b[:, 0], a[:, 1] - b[:, 1])
    head = np.abs(np.arctan2(np.sin(a[:, 2] - b[:, 2]), np.cos(a[:, 2] - b[:, 2])))
    ref_xy = np.column_stack([np.interp(0.1 * np.arange(steps + 1), ref.t, ref.x),
                              np.interp(0.1 * np.arange(steps + 1), ref.t, ref.y)])
    tracking_error = float(np.max(np.hypot(*(a[:, :2] - ref_xy).T)))
    start = "on the reference" if start_offset == (0.0, 0.0, 0.0) else \
        f"{dy:+.1f} m, {dh:+.2f} rad, {dv:+.1f} m/s off"
    return TrackingRow(kind, start, float(pos.max()), float(head.max()), float(np.abs(a[:, 3] - b[:, 3]).max()),
                       float(pos[-1]), tracking_error)


# ==================================================================================================
# 2. Metrics: a two-lane map both sides read
# ==================================================================================================

ROAD_LENGTH = 400.0
LANE_WIDTH = 3.5


def lane_graph() -> LaneGraph:
    """Roadblock ``rb``: lane ``right`` (y = 0, 15 m/s) and ``left`` (y = 3.5, 10 m/s) along +x."""
    g = LaneGraph()
    g.add(make_lane("right", [[0, 0], [ROAD_LENGTH, 0]], LANE_WIDTH, 15.0, "rb", left_neighbor="left"))
    g.add(make_lane("left", [[0, LANE_WIDTH], [ROAD_LENGTH, LANE_WIDTH]], LANE_WIDTH, 10.0, "rb",
                    right_neighbor="right"))
    return g


def _polyline(pid: str, pts: np.ndarray) -> NuPlanPolylineMapObject:
    return NuPlanPolylineMapObject(pd.Series({"fid": pid, "geometry": LineString(pts)}))


class CrossLane(NLane):
    """A devkit ``Lane`` from one of our lanes."""

    def __init__(self, lane: Any, roadblock: "CrossRoadBlock", index: int) -> None:
        super().__init__(lane.id)
        self._lane, self._roadblock, self._index = lane, roadblock, index
        self._baseline = _polyline(f"{lane.id}_baseline", lane.centerline)
        self._left = _polyline(f"{lane.id}_left", lane.left_boundary)
        self._right = _polyline(f"{lane.id}_right", lane.right_boundary)
        self._polygon = Polygon(np.vstack([lane.left_boundary, lane.right_boundary[::-1]]))
        self.neighbours: tuple[Any, Any] = (None, None)

    polygon = property(lambda self: self._polygon)
    incoming_edges = property(lambda self: [])
    outgoing_edges = property(lambda self: [])
    parallel_edges = property(lambda self: [])
    baseline_path = property(lambda self: self._baseline)
    left_boundary = property(lambda self: self._left)
    right_boundary = property(lambda self: self._right)
    speed_limit_mps = property(lambda self: self._lane.speed_limit)
    parent = property(lambda self: self._roadblock)
    adjacent_edges = property(lambda self: self.neighbours)

    def get_roadblock_id(self) -> str:
        return self._roadblock.id

    def index(self) -> int:
        return self._index

    def is_left_of(self, other: Any) -> bool:
        return self.neighbours[1] is other

    def is_right_of(self, other: Any) -> bool:
        return self.neighbours[0] is other

    def get_width_left_right(self, point: Any, include_outside: bool = False) -> tuple[float, float]:
        raise NotImplementedError

    def oriented_distance(self, point: Any) -> float:
        raise NotImplementedError


class CrossRoadBlock(RoadBlockGraphEdgeMapObject):
    def __init__(self, block_id: str) -> None:
        super().__init__(block_id)
        self.lanes: list[CrossLane] = []

    polygon = property(lambda self: unary_union([lane.polygon for lane in self.lanes]))
    incoming_edges = property(lambda self: [])
    outgoing_edges = property(lambda self: [])
    parallel_edges = property(lambda self: [])
    interior_edges = property(lambda self: self.lanes)
    children_stop_lines = property(lambda self: [])
    intersection = property(lambda self: None)


class CrossMap(AbstractMap):
    """The map queries nuPlan's metrics make, answered from our lane graph (drivable area = the union
    of the lane polygons, no intersections)."""

    def __init__(self, graph: LaneGraph) -> None:
        self.block = CrossRoadBlock("rb")
        self.lanes = {lid: CrossLane(lane, self.block, k) for k, (lid, lane) in enumerate(graph.lanes.items())}
        self.block.lanes = list(self.lanes.values())
        for lid, lane in graph.lanes.items():
            self.lanes[lid].neighbours = (self.lanes.get(lane.left_neighbor), self.lanes.get(lane.right_neighbor))
        self.drivable = unary_union([lane.polygon for lane in self.lanes.values()])

    map_name = property(lambda self: "crosscheck")

    def _containing(self, point: Any) -> list[CrossLane]:
        p = Point(point.x, point.y)
        return [lane for lane in self.lanes.values() if lane.polygon.intersects(p)]

    def get_one_map_object(self, point: Any, layer: SemanticMapLayer) -> Any:
        found = self.get_all_map_objects(point, layer)
        return found[0] if found else None

    def get_all_map_objects(self, point: Any, layer: SemanticMapLayer) -> list[Any]:
        return self._containing(point) if layer == SemanticMapLayer.LANE else []

    def is_in_layer(self, point: Any, layer: SemanticMapLayer) -> bool:
        if layer == SemanticMapLayer.DRIVABLE_AREA:
            return bool(self.drivable.intersects(Point(point.x, point.y)))
        if layer == SemanticMapLayer.LANE:
            return bool(self._containing(point))
        return False

    def get_distance_to_nearest_map_object(self, point: Any, layer: SemanticMapLayer) -> tuple[str, float]:
        assert layer == SemanticMapLayer.DRIVABLE_AREA, layer
        return "drivable", float(self.drivable.distance(Point(point.x, point.y)))

    def get_map_object(self, object_id: str, layer: SemanticMapLayer) -> Any:
        if layer == SemanticMapLayer.ROADBLOCK and object_id == "rb":
            return self.block
        if layer == SemanticMapLayer.LANE:
            return self.lanes.get(object_id)
        return None

    def get_proximal_map_objects(self, point: Any, radius: float, layers: list[SemanticMapLayer]) -> dict:
        return {layer: list(self.lanes.values()) if layer == SemanticMapLayer.LANE else [] for layer in layers}

    def get_available_map_objects(self) -> list:
        return [SemanticMapLayer.LANE, SemanticMapLayer.ROADBLOCK, SemanticMapLayer.DRIVABLE_AREA]

    def get_available_raster_layers(self) -> list:
        return []

    def get_raster_map_layer(self, layer: Any) -> Any:
        raise NotImplementedError

    def get_raster_map(self, layers: Any) -> Any:
        raise NotImplementedError

    def get_distance_to_nearest_raster_layer(self, point: Any, layer: Any) -> float:
        raise NotImplementedError

    def get_distances_matrix_to_nearest_map_object(self, points: Any, layer: Any) -> Any:
        raise NotImplementedError

    def initialize_all_layers(self) -> None:
        pass


# ---- hand-built runs -----------------------------------------------------------------------------


@dataclass
class Obj:
    """An object's box-centre track: ``fn(t) -> (x, y, heading, vx, vy)``."""

    id: str
    cls: ObjectClass
    fn: Callable[[float], tuple[float, float, float, float, float]]
    length: float = 4.6
    width: float = 1.9


@dataclass
class Case:
    name: str
    what: str
    ego: Callable[[np.ndarray], np.ndarray]  # t (N,) -> (N, 5) rear axle x, y, heading, velocity, accel
    objects: list[Obj] = field(default_factory=list)
    expert: Callable[[np.ndarray], np.ndarray] | None = None  # default: the ego run itself
    duration: float = 8.0


def _straight(x0: float, v: float, y: float = 0.0, a: float = 0.0, v_min: float = 0.0) -> Callable:
    def f(t: np.ndarray) -> np.ndarray:
        vel = np.maximum(v + a * t, v_min)
        x = x0 + np.concatenate([[0.0], np.cumsum(0.5 * (vel[1:] + vel[:-1]) * np.diff(t))])
        acc = np.where(vel > v_min, a, 0.0)
        return np.column_stack([x, np.full_like(t, y), np.zeros_like(t), vel, acc])
    return f


def _lane_change(x0: float, v: float, y0: float, y1: float, t0: float, dur: float) -> Callable:
    def f(t: np.ndarray) -> np.ndarray:
        u = np.clip((t - t0) / dur, 0.0, 1.0)
        y = y0 + (y1 - y0) * u ** 3 * (10 - 15 * u + 6 * u ** 2)
        x = x0 + v * t
        heading = np.arctan2(np.gradient(y, t), np.gradient(x, t))
        return np.column_stack([x, y, heading, np.full_like(t, v), np.zeros_like(t)])
    return f


def _weave(x0: float, v: float, amplitude: float, period: float) -> Callable:
    def f(t: np.ndarray) -> np.ndarray:
        x = x0 + v * t
        y = amplitude * np.sin(2 * np.pi * t / period)
        heading = np.arctan2(np.gradient(y, t), np.gradient(x, t))
        return np.column_stack([x, y, heading, np.full_like(t, v), np.zeros_like(t)])
    return f


def _moving(x0: float, y: float, v: float, heading: float = 0.0) -> Callable:
    return lambda t: (x0 + v * math.cos(heading) * t, y + v * math.sin(heading) * t, heading,
                      v * math.cos(heading), v * math.sin(heading))


def cases() -> list[Case]:
    c = VEHICLE.rear_axle_to_center
    return [
        # ---- at-fault collisions (nuPlan's collision types) ------------------------------------
        Case("collision: stopped track ahead", "ego 10 m/s drives into a stopped car in its lane",
             _straight(20, 10.0), [Obj("stopped", ObjectClass.VEHICLE, _moving(80, 0, 0.0))]),
        Case("collision: active front", "ego 12 m/s rear-ends a car moving at 4 m/s",
             _straight(20, 12.0), [Obj("slow", ObjectClass.VEHICLE, _moving(60, 0, 4.0))]),
        Case("collision: stopped ego", "a car drives into the stopped ego from behind",
             _straight(50, 0.0), [Obj("rear", ObjectClass.VEHICLE, _moving(20, 0, 8.0))]),
        Case("collision: active rear", "a faster car rear-ends the moving ego",
             _straight(50, 5.0), [Obj("rear", ObjectClass.VEHICLE, _moving(25, 0, 12.0))]),
        Case("collision: lateral, ego in its lane", "a car from the left lane swerves into the ego's side",
             _straight(20, 8.0), [Obj("swerve", ObjectClass.VEHICLE,
                                      lambda t: (19.5 + c + 8.0 * t, LANE_WIDTH - min(0.8 * t, 2.2), -0.1, 8.0, -0.8))]),
        Case("collision: lateral, ego straddling lanes", "the ego changes lanes into a car alongside",
             _lane_change(20, 8.0, 0.0, LANE_WIDTH, 1.0, 4.0),
             [Obj("alongside", ObjectClass.VEHICLE, _moving(19.5 + c, LANE_WIDTH, 8.0))]),
        Case("collision: pedestrian ahead", "ego 5 m/s meets a pedestrian crossing its lane with its front",
             _straight(40, 5.0), [Obj("ped", ObjectClass.PEDESTRIAN,
                                      lambda t: (62, -4.2 + 1.2 * t, math.pi / 2, 0, 1.2), 0.6, 0.6)]),
        Case("collision: pedestrian at the side", "ego 8 m/s: the crossing pedestrian meets its side, not its front",
             _straight(20, 8.0), [Obj("ped", ObjectClass.PEDESTRIAN,
                                      lambda t: (62, -6 + 1.2 * t, math.pi / 2, 0, 1.2), 0.6, 0.6)]),
        Case("collision: static object", "ego 6 m/s hits a traffic cone (objects tolerate 1)",
             _straight(20, 6.0), [Obj("cone", ObjectClass.STATIC, _moving(50, 0.5, 0.0), 0.5, 0.5)]),
        # ---- drivable area ----------------------------------------------------------------------
        Case("drivable: inside the lanes", "a lane change within the road",
             _lane_change(20, 10.0, 0.0, LANE_WIDTH, 1.0, 4.0)),
        Case("drivable: corner 0.2 m outside", "the ego drives 0.2 m right of the road edge (tolerance 0.3 m)",
             _straight(20, 10.0, y=-LANE_WIDTH / 2 + VEHICLE.width / 2 - 0.2)),
        Case("drivable: 1 m off the road", "the ego drifts 1 m past the right road edge",
             _lane_change(20, 10.0, 0.0, -LANE_WIDTH / 2 - 1.0 + VEHICLE.width / 2, 1.0, 4.0)),
        # ---- speed limit --------------------------------------------------------------------------
        Case("speed: below the limit", "14 m/s in the 15 m/s lane", _straight(20, 14.0)),
        Case("speed: 3 m/s over", "18 m/s in the 15 m/s lane", _straight(20, 18.0)),
        Case("speed: over after a lane change", "13 m/s into the 10 m/s left lane",
             _lane_change(20, 13.0, 0.0, LANE_WIDTH, 1.0, 3.0)),
        Case("speed: accelerating past the limit", "12 -> 20 m/s in the 15 m/s lane", _straight(20, 12.0, a=1.0)),
        # ---- progress -----------------------------------------------------------------------------
        Case("progress: as the expert", "ego = expert at 10 m/s", _straight(20, 10.0)),
        Case("progress: half the expert", "ego 5 m/s, expert 10 m/s", _straight(20, 5.0), expert=_straight(20, 10.0)),
        Case("progress: ego stopped", "ego stands still, expert 10 m/s", _straight(20, 0.0),
             expert=_straight(20, 10.0)),
        Case("progress: expert stopped", "expert stands still, ego creeps 1 m/s", _straight(20, 1.0),
             expert=_straight(20, 0.0)),
        # ---- comfort ------------------------------------------------------------------------------
        Case("comfort: cruise", "constant 10 m/s", _straight(20, 10.0)),
        Case("comfort: moderate acceleration", "+2.0 m/s^2 from 5 m/s", _straight(20, 5.0, a=2.0)),
        Case("comfort: hard braking", "-6 m/s^2 from 15 m/s to a stop", _straight(20, 15.0, a=-6.0)),
        Case("comfort: weaving", "1.5 m sinusoid every 2.5 s at 10 m/s (yaw rate ~0.75 rad/s)", _weave(20, 10.0, 1.5, 2.5)),
        Case("comfort: gentle lane change", "3.5 m in 4 s at 10 m/s", _lane_change(20, 10.0, 0.0, LANE_WIDTH, 1.0, 4.0)),
    ]


def _states(fn: Callable, t: np.ndarray) -> np.ndarray:
    s = np.asarray(fn(t), dtype=np.float64)
    yaw_rate = np.gradient(np.unwrap(s[:, 2]), t)
    return np.column_stack([s, yaw_rate])


def _ours(case: Case, graph: LaneGraph) -> dict[str, float]:
    t = np.round(np.arange(0.0, case.duration + 1e-9, SIM_DT), 6)
    ego = _states(case.ego, t)
    expert = _states(case.expert or case.ego, t)
    egos = [EgoState(float(tk), *map(float, row[:5]), yaw_rate=float(row[5])) for tk, row in zip(t, ego)]
    expert_track = AgentTrack("ego", ObjectClass.VEHICLE, VEHICLE.length, VEHICLE.width, t, expert[:, 0],
                              expert[:, 1], expert[:, 2], expert[:, 3] * np.cos(expert[:, 2]),
                              expert[:, 3] * np.sin(expert[:, 2]))
    frames = [TrackedObjects(float(tk), [TrackedObject(o.id, o.cls, *map(float, o.fn(float(tk))), o.length, o.width)
                                         for o in case.objects]) for tk in t]
    scenario = Scenario(case.name, "crosscheck", graph, Route(0.0, ["rb"]), egos[0], expert_track, [], [],
                        case.duration, vehicle=VEHICLE)
    log = SimulationLog(scenario, "crosscheck", False, t, egos, frames, [])
    score = score_log(log)
    if score.error:
        raise RuntimeError(f"{case.name}: {score.error}")
    return {k: m.score for k, m in score.metrics.items()}


def _theirs(case: Case, cmap: CrossMap) -> dict[str, float]:
    t = np.round(np.arange(0.0, case.duration + 1e-9, SIM_DT), 6)
    ego = _states(case.ego, t)
    expert = _states(case.expert or case.ego, t)

    def build(rows: np.ndarray) -> list[NEgoState]:
        return [NEgoState.build_from_rear_axle(StateSE2(*r[:3]), StateVector2D(r[3], 0.0), StateVector2D(r[4], 0.0),
                                               0.0, _tp(k), PACIFICA, angular_vel=r[5]) for k, r in enumerate(rows)]

    egos, experts = build(ego), build(expert)
    history = SimulationHistory(cmap, StateSE2(ROAD_LENGTH, 0.0, 0.0))
    dummy = InterpolatedTrajectory([egos[0], egos[1]])
    for k, tk in enumerate(t):
        tracked = []
        for o in case.objects:
            x, y, h, vx, vy = o.fn(float(tk))
            meta = SceneObjectMetadata(_tp(k).time_us, o.id, abs(hash(o.id)) % 1000, o.id)
            box = OrientedBox(StateSE2(x, y, h), o.length, o.width, 1.5)
            if o.cls is ObjectClass.STATIC:
                tracked.append(StaticObject(TrackedObjectType.TRAFFIC_CONE, box, meta))
            else:
                kind = TrackedObjectType.PEDESTRIAN if o.cls is ObjectClass.PEDESTRIAN else TrackedObjectType.VEHICLE
                tracked.append(Agent(kind, box, StateVector2D(vx, vy), meta))
        history.add_sample(SimulationHistorySample(SimulationIteration(_tp(k), k), egos[k], dummy,
                                                   DetectionsTracks(NTrackedObjects(tracked)), []))
    scenario = SimpleNamespace(get_expert_ego_trajectory=lambda: experts, database_interval=SIM_DT,
                               initial_ego_state=egos[0], scenario_name=case.name, scenario_type="crosscheck",
                               token="x", log_name="x", map_api=cmap)
    lane_change = EgoLaneChangeStatistics("ego_lane_change", "Planning", max_fail_rate=0.3)
    lane_change.compute(history, scenario)
    out = {}
    out["no_ego_at_fault_collisions"] = EgoAtFaultCollisionStatistics(
        "no_ego_at_fault_collisions", "Dynamics", lane_change, 0, 0, 1).compute(history, scenario)[0].metric_score
    out["drivable_area_compliance"] = DrivableAreaComplianceStatistics(
        "drivable_area_compliance", "Planning", lane_change, 0.3).compute(history, scenario)[0].metric_score
    out["speed_limit_compliance"] = SpeedLimitComplianceStatistics(
        "speed_limit_compliance", "Violations", lane_change, 1.0, 2.23).compute(history, scenario)[0].metric_score
    out["ego_progress_along_expert_route"] = EgoProgressAlongExpertRouteStatistics(
        "ego_progress_along_expert_route", "Planning", 2.0).compute(history, scenario)[0].metric_score
    comfort = [EgoJerkStatistics("ego_jerk", "Dynamics", 8.37),
               EgoLatAccelerationStatistics("ego_lat_acceleration", "Dynamics", 4.89),
               EgoLonAccelerationStatistics("ego_lon_acceleration", "Dynamics", -4.05, 2.40),
               EgoLonJerkStatistics("ego_lon_jerk", "Dynamics", 4.13),
               EgoYawAccelerationStatistics("ego_yaw_acceleration", "Dynamics", 1.93),
               EgoYawRateStatistics("ego_yaw_rate", "Dynamics", 0.95)]
    for m in comfort:
        m.compute(history, scenario)
    out["ego_is_comfortable"] = EgoIsComfortableStatistics("ego_is_comfortable", "Violations", *comfort).compute(
        history, scenario)[0].metric_score
    return out


COMPARED = {"collision": "no_ego_at_fault_collisions", "drivable": "drivable_area_compliance",
            "speed": "speed_limit_compliance", "progress": "ego_progress_along_expert_route",
            "comfort": "ego_is_comfortable"}


def main() -> int:
    print("### Tracking: devkit TwoStageController (LQR + kinematic bicycle) vs luna_core.control.track_step\n")
    print("10 s closed loop at 0.1 s; differences between the two simulated rear-axle states.\n")
    print("| reference | start | max position diff (m) | max heading diff (rad) | max speed diff (m/s) "
          "| final position diff (m) | ours: max distance to the reference (m) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    disagreements = []
    for kind in ("straight 10 m/s", "accelerate 0 -> 12 m/s", "brake 12 m/s -> stop", "circle R 25 m, 8 m/s",
                 "lane change 3.5 m, 12 m/s", "S-curve 10 m/s"):
        for off in ((0.0, 0.0, 0.0), (0.5, 0.05, 1.0)):
            if kind.startswith("accelerate") and off[2]:
                off = (0.5, 0.05, 0.5)
            r = compare_tracking(kind, off)
            rows.append(r)
            disagreements += tracking_disagreements(f"{r.case}, {r.start}", r.max_position, r.max_heading,
                                                    r.max_velocity)
            print(f"| {r.case} | {r.start} | {r.max_position:.1e} | {r.max_heading:.1e} | {r.max_velocity:.1e} "
                  f"| {r.final_position:.1e} | {r.max_tracking_error:.2f} |")
    graph = lane_graph()
    cmap = CrossMap(graph)
    print("\n### Metrics: devkit metric classes vs luna_bridge.metrics on the same runs\n")
    print("| case | scene | metric | devkit | ours | agree |")
    print("|---|---|---|---:|---:|:---:|")
    agree = {k: [0, 0] for k in COMPARED.values()}
    for case in cases():
        ours, theirs = _ours(case, graph), _theirs(case, cmap)
        metric = COMPARED[case.name.split(":")[0]]
        # every compared metric on every case, the case's own metric listed first
        for m in [metric] + [k for k in COMPARED.values() if k != metric]:
            wrong = metric_disagreement(case.name, m, ours[m], theirs[m])
            ok = wrong is None
            if wrong is not None:
                disagreements.append(wrong)
            agree[m][0] += ok
            agree[m][1] += 1
            if m == metric or not ok:
                print(f"| {case.name} | {case.what if m == metric else '(side metric)'} | {m} | {theirs[m]:.3f} "
                      f"| {ours[m]:.3f} | {'yes' if ok else '**no**'} |")
    print(f"\nAgreement within {METRIC_TOLERANCE} over all cases (each case scored on all five metrics):\n")
    for m, (ok, n) in agree.items():
        print(f"- {m}: {ok}/{n}")
    if disagreements:
        print(f"\n**{len(disagreements)} disagreement(s)** (tracking tolerance {TRACKING_TOLERANCE:g}, "
              f"metrics {METRIC_TOLERANCE}):\n")
        print("\n".join(f"- {d}" for d in disagreements))
    else:
        print("\nEvery compared value agrees.")
    return exit_status(disagreements)


if __name__ == "__main__":
    sys.exit(main())
