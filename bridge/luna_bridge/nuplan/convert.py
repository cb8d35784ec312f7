"""Conversions between the nuPlan devkit's planner-side objects and ``luna_core.types``.

Plain functions over plain data: every devkit object is read through the attributes the devkit
(v1.2) defines, so the functions run (and are tested) without the devkit, on any object with the
same attributes. The devkit-facing class is ``luna_bridge.nuplan.planner``.

Devkit attributes read (nuplan.common.actor_state, nuplan.common.maps):

* ``EgoState``: ``time_point.time_us``, ``rear_axle`` (x, y, heading),
  ``dynamic_car_state.rear_axle_velocity_2d`` / ``rear_axle_acceleration_2d`` (x longitudinal,
  y lateral, ego frame), ``dynamic_car_state.angular_velocity``, ``tire_steering_angle``;
* ``VehicleParameters``: ``width``, ``front_length``, ``rear_length``, ``wheel_base``,
  ``cog_position_from_rear_axle``;
* ``DetectionsTracks.tracked_objects.tracked_objects``: ``track_token``, ``tracked_object_type.name``,
  ``center`` (box centre x, y, heading), ``box.length`` / ``box.width``, ``velocity`` (map frame; agents
  only, static objects have none);
* ``TrafficLightStatusData``: ``status.name`` (GREEN, YELLOW, RED, UNKNOWN), ``lane_connector_id``;
* map: ``get_map_object(id, layer)`` for roadblocks / roadblock connectors (``interior_edges``),
  ``get_proximal_map_objects(point, radius, layers)`` for lanes / lane connectors; a lane edge gives
  ``id``, ``baseline_path`` / ``left_boundary`` / ``right_boundary`` ``.discrete_path`` (poses with x, y),
  ``speed_limit_mps`` (may be None), ``get_roadblock_id()``, ``incoming_edges``, ``outgoing_edges``,
  ``adjacent_edges`` (left, right).

nuPlan's map frame is the same REP-103 convention as ours (x east, y north, headings counter-clockwise
from x), and its ego poses refer to the rear axle like ``luna_core.types.EgoState``, so poses carry
over unchanged; times become seconds (float) from the devkit's microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Iterable, Sequence

import numpy as np

from luna_core.types import (EgoState, Lane, LaneGraph, ObjectClass, PlannerInput, Route, TrackedObject,
                             TrackedObjects, TrafficLightPhase, TrafficLights, TrafficLightState, Trajectory,
                             VehicleParameters)


class NuPlanConversionError(ValueError):
    """A devkit object that cannot be converted; the message names the object and the problem."""


class MapLayer(IntEnum):
    """The devkit's ``SemanticMapLayer`` values this adapter queries (the planner passes the devkit's
    own enum; this stand-in lets the conversion run without it)."""

    LANE = 0
    LANE_CONNECTOR = 11
    ROADBLOCK = 17
    ROADBLOCK_CONNECTOR = 18


#: Devkit ``TrackedObjectType`` name -> our class. nuPlan's metrics and PDM-Closed both treat cones,
#: barriers, construction signs and generic objects as static obstacles; ``EGO`` is never an obstacle.
OBJECT_CLASSES: dict[str, ObjectClass] = {
    "VEHICLE": ObjectClass.VEHICLE, "PEDESTRIAN": ObjectClass.PEDESTRIAN, "BICYCLE": ObjectClass.BICYCLE,
    "TRAFFIC_CONE": ObjectClass.STATIC, "BARRIER": ObjectClass.STATIC, "CZONE_SIGN": ObjectClass.STATIC,
    "GENERIC_OBJECT": ObjectClass.STATIC}

#: Devkit ``TrafficLightStatusType`` name -> our phase (UNKNOWN carries no information: NONE).
LIGHT_PHASES: dict[str, TrafficLightPhase] = {
    "GREEN": TrafficLightPhase.GREEN, "YELLOW": TrafficLightPhase.YELLOW, "RED": TrafficLightPhase.RED,
    "UNKNOWN": TrafficLightPhase.NONE}


def _seconds(time_point: Any) -> float:
    return int(time_point.time_us) * 1e-6


# --------------------------------------------------------------------------------------------------
# Ego and vehicle
# --------------------------------------------------------------------------------------------------


def vehicle_from_nuplan(params: Any) -> VehicleParameters:
    """Our ``VehicleParameters`` from the devkit's (``get_pacifica_parameters()`` gives the defaults)."""
    return VehicleParameters(width=float(params.width), front_length=float(params.front_length),
                             rear_length=float(params.rear_length), wheelbase=float(params.wheel_base),
                             cog_position_from_rear_axle=float(params.cog_position_from_rear_axle))


def ego_state_from_nuplan(ego: Any) -> EgoState:
    """The devkit ``EgoState`` (rear axle, ego-frame velocity/acceleration) as our ``EgoState``."""
    dyn = ego.dynamic_car_state
    velocity, accel = dyn.rear_axle_velocity_2d, dyn.rear_axle_acceleration_2d
    state = EgoState(stamp=_seconds(ego.time_point), x=float(ego.rear_axle.x), y=float(ego.rear_axle.y),
                     heading=float(ego.rear_axle.heading), velocity=float(velocity.x),
                     acceleration=float(accel.x), yaw_rate=float(dyn.angular_velocity),
                     steering_angle=float(ego.tire_steering_angle), lateral_velocity=float(velocity.y))
    if not state.is_finite():
        bad = [k for k, v in vars(state).items() if not math.isfinite(v)]
        raise NuPlanConversionError(f"ego state at time_us {ego.time_point.time_us}: non-finite {', '.join(bad)}")
    return state


def ego_history_from_nuplan(ego_states: Iterable[Any]) -> list[EgoState]:
    """The history buffer's ego states, oldest first (as the devkit stores them)."""
    history = [ego_state_from_nuplan(e) for e in ego_states]
    if not history:
        raise NuPlanConversionError("the planner input's history buffer holds no ego state")
    stamps = np.array([e.stamp for e in history])
    if np.any(np.diff(stamps) <= 0.0):
        k = int(np.argmax(np.diff(stamps) <= 0.0))
        raise NuPlanConversionError(f"ego history is not in increasing time order at entry {k + 1} "
                                    f"({stamps[k]:.6f} s then {stamps[k + 1]:.6f} s)")
    return history


# --------------------------------------------------------------------------------------------------
# Observations
# --------------------------------------------------------------------------------------------------


def tracked_objects_from_nuplan(observation: Any, stamp: float) -> TrackedObjects:
    """``DetectionsTracks`` (or its ``TrackedObjects``) as our ``TrackedObjects`` at ``stamp`` (s).

    Ids are the devkit's track tokens (temporally consistent); static objects get zero velocity.
    """
    if not hasattr(observation, "tracked_objects"):
        raise NuPlanConversionError(f"observation of type {type(observation).__name__} has no tracked objects: "
                                    "the planner observes DetectionsTracks")
    container = observation.tracked_objects
    items = getattr(container, "tracked_objects", container)
    out: list[TrackedObject] = []
    for k, obj in enumerate(items):
        type_name = obj.tracked_object_type.name
        if type_name == "EGO":
            continue
        if type_name not in OBJECT_CLASSES:
            raise NuPlanConversionError(f"tracked object {k} ({obj.track_token}): unknown type {type_name!r}")
        velocity = getattr(obj, "velocity", None)
        vx, vy = (0.0, 0.0) if velocity is None else (float(velocity.x), float(velocity.y))
        out.append(TrackedObject(id=str(obj.track_token), object_class=OBJECT_CLASSES[type_name],
                                 x=float(obj.center.x), y=float(obj.center.y), heading=float(obj.center.heading),
                                 vx=vx, vy=vy, length=float(obj.box.length), width=float(obj.box.width)))
    return TrackedObjects(stamp, out)


def traffic_lights_from_nuplan(data: Iterable[Any] | None, stamp: float) -> TrafficLights:
    """``TrafficLightStatusData`` list -> our lights, keyed by the lane connector they control."""
    lights = []
    for tl in data or ():
        name = tl.status.name
        if name not in LIGHT_PHASES:
            raise NuPlanConversionError(f"traffic light on lane connector {tl.lane_connector_id}: "
                                        f"unknown status {name!r}")
        lights.append(TrafficLightState(str(tl.lane_connector_id), LIGHT_PHASES[name]))
    return TrafficLights(stamp, lights)


# --------------------------------------------------------------------------------------------------
# Map and route
# --------------------------------------------------------------------------------------------------


def _polyline(path: Sequence[Any], what: str) -> np.ndarray:
    pts = np.array([[float(p.x), float(p.y)] for p in path], dtype=np.float64).reshape(-1, 2)
    if len(pts) < 2:
        raise NuPlanConversionError(f"{what} has {len(pts)} point(s), need at least 2")
    if not np.all(np.isfinite(pts)):
        raise NuPlanConversionError(f"{what} contains non-finite coordinates")
    keep = np.concatenate([[True], np.any(np.diff(pts, axis=0) != 0.0, axis=1)])  # drop repeated points
    if keep.sum() < 2:
        raise NuPlanConversionError(f"{what} has zero length")
    return pts[keep]


def lane_from_nuplan(edge: Any, in_junction: bool) -> Lane:
    """A devkit lane (``in_junction=False``) or lane connector (``True``) as our ``Lane``.

    The roadblock id becomes ``road_id`` (route roadblocks and lane roads then match); a missing
    speed limit becomes 0 (unknown)."""
    lane_id = str(edge.id)
    left, right = edge.adjacent_edges
    limit = edge.speed_limit_mps
    return Lane(id=lane_id,
                centerline=_polyline(edge.baseline_path.discrete_path, f"lane {lane_id} baseline path"),
                left_boundary=_polyline(edge.left_boundary.discrete_path, f"lane {lane_id} left boundary"),
                right_boundary=_polyline(edge.right_boundary.discrete_path, f"lane {lane_id} right boundary"),
                speed_limit=float(limit) if limit is not None and math.isfinite(limit) else 0.0,
                road_id=str(edge.get_roadblock_id()),
                successors=[str(e.id) for e in edge.outgoing_edges],
                predecessors=[str(e.id) for e in edge.incoming_edges],
                left_neighbor=str(left.id) if left is not None else "",
                right_neighbor=str(right.id) if right is not None else "",
                in_junction=in_junction)


def collect_lane_edges(map_api: Any, roadblock_ids: Iterable[str] = (), point: Any = None, radius: float = 0.0,
                       layers: Any = MapLayer) -> list[tuple[Any, bool]]:
    """(edge, is_lane_connector) of every lane of the given roadblocks / roadblock connectors and, with
    a ``point`` (the devkit's ``Point2D``), of every lane and lane connector within ``radius`` (m).

    ``layers`` names the ``SemanticMapLayer`` members (the devkit enum, or ``MapLayer``). A route
    roadblock id the map does not know is an error naming it.
    """
    out: dict[str, tuple[Any, bool]] = {}
    unknown = []
    for rid in roadblock_ids:
        block, connector = map_api.get_map_object(str(rid), layers.ROADBLOCK), False
        if block is None:
            block, connector = map_api.get_map_object(str(rid), layers.ROADBLOCK_CONNECTOR), True
        if block is None:
            unknown.append(str(rid))
            continue
        for edge in block.interior_edges:
            out.setdefault(str(edge.id), (edge, connector))
    if unknown:
        raise NuPlanConversionError(f"route roadblock id(s) not in the map: {', '.join(unknown)}")
    if point is not None:
        near = map_api.get_proximal_map_objects(point, radius, [layers.LANE, layers.LANE_CONNECTOR])
        for layer, connector in ((layers.LANE, False), (layers.LANE_CONNECTOR, True)):
            for edge in near.get(layer, []):
                out.setdefault(str(edge.id), (edge, connector))
    return list(out.values())


def extend_lane_graph(graph: LaneGraph, edges: Iterable[tuple[Any, bool]]) -> list[str]:
    """Add the lanes of ``edges`` (from ``collect_lane_edges``) that ``graph`` lacks; returns their ids.

    The graph grows as the ego drives (the devkit's maps are city-sized: only the route and the
    neighbourhood are converted); successor / neighbour ids may name lanes not added yet, which
    every ``luna_core`` consumer skips."""
    added = []
    for edge, connector in edges:
        if str(edge.id) not in graph.lanes:
            graph.add(lane_from_nuplan(edge, connector))
            added.append(str(edge.id))
    return added


def route_from_nuplan(roadblock_ids: Iterable[str], mission_goal: Any, stamp: float) -> Route:
    """The route roadblocks (roadblocks and roadblock connectors, in driving order) and goal pose."""
    ids = [str(r) for r in roadblock_ids]
    if not ids:
        raise NuPlanConversionError("the planner initialization has no route roadblock ids")
    if mission_goal is None:
        return Route(stamp, ids)
    return Route(stamp, ids, float(mission_goal.x), float(mission_goal.y), float(mission_goal.heading))


def planner_input_from_nuplan(ego_states: Iterable[Any], observation: Any, traffic_light_data: Iterable[Any] | None,
                              lane_graph: LaneGraph, route: Route, vehicle: VehicleParameters) -> PlannerInput:
    """Our ``PlannerInput`` from the devkit history buffer's ego states and current observation."""
    history = ego_history_from_nuplan(ego_states)
    now = history[-1].stamp
    return PlannerInput(time=now, ego_history=history, objects=tracked_objects_from_nuplan(observation, now),
                        traffic_lights=traffic_lights_from_nuplan(traffic_light_data, now),
                        lane_graph=lane_graph, route=route, vehicle=vehicle)


# --------------------------------------------------------------------------------------------------
# Trajectory out
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RearAxleSample:
    """One trajectory sample in the devkit's terms (``EgoState.build_from_rear_axle`` arguments)."""

    time_us: int
    x: float
    y: float
    heading: float
    velocity: float  # longitudinal, m/s
    acceleration: float  # longitudinal, m/s^2
    steering_angle: float  # tire steering angle of a kinematic bicycle on this path, rad
    yaw_rate: float  # rad/s


def rear_axle_samples(trajectory: Trajectory, vehicle: VehicleParameters, origin_s: float = 0.0,
                      origin_us: int = 0, max_steering_angle: float = math.pi / 3) -> list[RearAxleSample]:
    """Our trajectory as devkit samples. Times in microseconds count from ``origin_us``, the devkit
    time of our stamp ``origin_s`` (pass the current ego state's two: a trajectory stamped now then
    starts exactly at the devkit's current time, which its interpolation requires; a float round
    trip through seconds could land a microsecond late). Steering = atan(wheelbase x path curvature),
    curvature = d heading / d arc length (0 where the vehicle does not move), clipped to the
    bicycle's limit; yaw rate = d heading / d t."""
    t = np.asarray(trajectory.t, dtype=np.float64)
    if len(t) < 2:
        raise NuPlanConversionError(f"planner trajectory has {len(t)} sample(s); the devkit interpolates "
                                    "between at least 2")
    if not trajectory.is_finite():
        raise NuPlanConversionError("planner trajectory contains non-finite values")
    if np.any(np.diff(t) <= 0.0):
        raise NuPlanConversionError("planner trajectory times are not strictly increasing")
    heading = np.unwrap(np.asarray(trajectory.heading, dtype=np.float64))
    xy = np.column_stack([trajectory.x, trajectory.y])
    s = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(xy, axis=0).T))])
    ds = np.gradient(s)
    dh = np.gradient(heading)
    curvature = np.where(ds > 1e-3, dh / np.maximum(ds, 1e-3), 0.0)
    steering = np.clip(np.arctan(vehicle.wheelbase * curvature), -max_steering_angle, max_steering_angle)
    yaw_rate = np.gradient(heading, t)
    times_us = int(origin_us) + np.round((trajectory.stamp - origin_s + t) * 1e6).astype(np.int64)
    return [RearAxleSample(int(times_us[k]), float(trajectory.x[k]), float(trajectory.y[k]),
                           float(trajectory.heading[k]), float(trajectory.velocity[k]),
                           float(trajectory.acceleration[k]), float(steering[k]), float(yaw_rate[k]))
            for k in range(len(t))]
