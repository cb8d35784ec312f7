"""Conversions between luna_core types and ROS messages (both directions).

The only place that knows both worlds: nodes call these and hand luna_core plain dataclasses. Stamps
are float seconds on the node clock; ``header.frame_id`` is the map frame for everything spatial.
"""

from __future__ import annotations

import math

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Point, Pose, Quaternion, Vector3
from nav_msgs.msg import Odometry
from std_msgs.msg import Header

import luna_msgs.msg as lm
from luna_core import types as T
from luna_core.decision import check_decision

# -- primitives -------------------------------------------------------------------------------------


def to_time(seconds: float) -> Time:
    if not math.isfinite(seconds) or seconds < 0.0:
        raise ValueError(f"stamp {seconds!r} is not a finite non-negative time")
    ns = int(round(seconds * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def from_time(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def to_duration(seconds: float) -> Duration:
    ns = int(round(seconds * 1e9))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def from_duration(d: Duration) -> float:
    return d.sec + d.nanosec * 1e-9


def header(stamp: float, frame_id: str = "map") -> Header:
    return Header(stamp=to_time(stamp), frame_id=frame_id)


def yaw_to_quaternion(yaw: float) -> Quaternion:
    return Quaternion(x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0))


def quaternion_to_yaw(q: Quaternion) -> float:
    return math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))


def pose(x: float, y: float, yaw: float) -> Pose:
    p = Pose()
    p.position = Point(x=float(x), y=float(y), z=0.0)
    p.orientation = yaw_to_quaternion(float(yaw))
    return p


def pose_xy_yaw(p: Pose) -> tuple[float, float, float]:
    return p.position.x, p.position.y, quaternion_to_yaw(p.orientation)


def to_points(polyline: np.ndarray) -> list[Point]:
    return [Point(x=float(x), y=float(y), z=0.0) for x, y in np.asarray(polyline).reshape(-1, 2)]


def from_points(points) -> np.ndarray:
    return np.array([[p.x, p.y] for p in points], dtype=np.float64).reshape(-1, 2)


# -- enums ------------------------------------------------------------------------------------------

_OBJECT_CLASS = {T.ObjectClass.VEHICLE: lm.TrackedObject.VEHICLE,
                 T.ObjectClass.PEDESTRIAN: lm.TrackedObject.PEDESTRIAN,
                 T.ObjectClass.BICYCLE: lm.TrackedObject.BICYCLE,
                 T.ObjectClass.STATIC: lm.TrackedObject.STATIC}
_OBJECT_CLASS_BACK = {v: k for k, v in _OBJECT_CLASS.items()}
_PHASE = {T.TrafficLightPhase.GREEN: lm.TrafficLightState.GREEN,
          T.TrafficLightPhase.YELLOW: lm.TrafficLightState.YELLOW,
          T.TrafficLightPhase.RED: lm.TrafficLightState.RED,
          T.TrafficLightPhase.NONE: lm.TrafficLightState.UNKNOWN}
_PHASE_BACK = {v: k for k, v in _PHASE.items()}
_SECTION = {T.RoadSection.NORMAL_MULTI_LANE: lm.SceneDescriptor.NORMAL_MULTI_LANE,
            T.RoadSection.NEAR_JUNCTION: lm.SceneDescriptor.NEAR_JUNCTION,
            T.RoadSection.JUNCTION: lm.SceneDescriptor.JUNCTION}
_SECTION_BACK = {v: k for k, v in _SECTION.items()}
_NAV = {T.Navigation.NONE: lm.SceneDescriptor.NAV_NONE, T.Navigation.LEFT: lm.SceneDescriptor.NAV_LEFT,
        T.Navigation.RIGHT: lm.SceneDescriptor.NAV_RIGHT,
        T.Navigation.STRAIGHT: lm.SceneDescriptor.NAV_STRAIGHT}
_NAV_BACK = {v: k for k, v in _NAV.items()}


def _lookup(table: dict, value, what: str):
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"unknown {what} value {value!r}") from None


# -- ego --------------------------------------------------------------------------------------------


def ego_to_odometry(ego: T.EgoState, frame_id: str = "map", child_frame_id: str = "base_link") -> Odometry:
    """Rear-axle ego state -> nav_msgs/Odometry (twist in the body frame, as REP-105 says)."""
    msg = Odometry()
    msg.header = header(ego.stamp, frame_id)
    msg.child_frame_id = child_frame_id
    msg.pose.pose = pose(ego.x, ego.y, ego.heading)
    msg.twist.twist.linear = Vector3(x=float(ego.velocity), y=float(ego.lateral_velocity), z=0.0)
    msg.twist.twist.angular = Vector3(x=0.0, y=0.0, z=float(ego.yaw_rate))
    return msg


def odometry_to_ego(msg: Odometry, acceleration: float = 0.0) -> T.EgoState:
    """nav_msgs/Odometry -> EgoState. Odometry has no acceleration: pass it when known."""
    x, y, yaw = pose_xy_yaw(msg.pose.pose)
    tw = msg.twist.twist
    return T.EgoState(stamp=from_time(msg.header.stamp), x=x, y=y, heading=yaw, velocity=tw.linear.x,
                      acceleration=acceleration, yaw_rate=tw.angular.z, lateral_velocity=tw.linear.y)


def steering_to_msg(stamp: float, angle: float) -> lm.SteeringReport:
    """A measured front-wheel steering angle (rad) -> luna_msgs/SteeringReport."""
    return lm.SteeringReport(stamp=to_time(stamp), steering_tire_angle=float(angle))


def msg_to_steering(msg: lm.SteeringReport) -> tuple[float, float]:
    """luna_msgs/SteeringReport -> (stamp s, angle rad)."""
    return from_time(msg.stamp), float(msg.steering_tire_angle)


# -- perception -------------------------------------------------------------------------------------


def objects_to_msg(objs: T.TrackedObjects, frame_id: str = "map") -> lm.TrackedObjects:
    msg = lm.TrackedObjects(header=header(objs.stamp, frame_id))
    msg.objects = [lm.TrackedObject(id=o.id, object_class=_lookup(_OBJECT_CLASS, o.object_class, "object class"),
                                    pose=pose(o.x, o.y, o.heading),
                                    velocity=Vector3(x=float(o.vx), y=float(o.vy), z=0.0),
                                    length=float(o.length), width=float(o.width)) for o in objs.objects]
    return msg


def msg_to_objects(msg: lm.TrackedObjects) -> T.TrackedObjects:
    out = []
    for o in msg.objects:
        x, y, yaw = pose_xy_yaw(o.pose)
        out.append(T.TrackedObject(o.id, _lookup(_OBJECT_CLASS_BACK, o.object_class, "object class"), x, y, yaw,
                                   o.velocity.x, o.velocity.y, o.length, o.width))
    return T.TrackedObjects(from_time(msg.header.stamp), out)


def lights_to_msg(lights: T.TrafficLights, frame_id: str = "map") -> lm.TrafficLightStateArray:
    return lm.TrafficLightStateArray(
        header=header(lights.stamp, frame_id),
        lights=[lm.TrafficLightState(lane_id=s.lane_id, phase=_lookup(_PHASE, s.phase, "traffic light phase"))
                for s in lights.lights])


def msg_to_lights(msg: lm.TrafficLightStateArray) -> T.TrafficLights:
    return T.TrafficLights(from_time(msg.header.stamp),
                           [T.TrafficLightState(s.lane_id, _lookup(_PHASE_BACK, s.phase, "traffic light phase"))
                            for s in msg.lights])


# -- map and route ----------------------------------------------------------------------------------


def lane_graph_to_msg(graph: T.LaneGraph) -> lm.LaneGraph:
    msg = lm.LaneGraph(header=header(graph.stamp, graph.frame_id))
    msg.lanes = [lm.Lane(id=lane.id, road_id=lane.road_id, centerline=to_points(lane.centerline),
                         left_boundary=to_points(lane.left_boundary),
                         right_boundary=to_points(lane.right_boundary), speed_limit=float(lane.speed_limit),
                         successors=list(lane.successors), predecessors=list(lane.predecessors),
                         left_neighbor=lane.left_neighbor, right_neighbor=lane.right_neighbor,
                         in_junction=bool(lane.in_junction)) for lane in graph.lanes.values()]
    return msg


def msg_to_lane_graph(msg: lm.LaneGraph) -> T.LaneGraph:
    graph = T.LaneGraph(frame_id=msg.header.frame_id or "map", stamp=from_time(msg.header.stamp))
    for m in msg.lanes:
        graph.add(T.Lane(id=m.id, centerline=from_points(m.centerline), left_boundary=from_points(m.left_boundary),
                         right_boundary=from_points(m.right_boundary), speed_limit=m.speed_limit,
                         road_id=m.road_id, successors=list(m.successors), predecessors=list(m.predecessors),
                         left_neighbor=m.left_neighbor, right_neighbor=m.right_neighbor,
                         in_junction=m.in_junction))
    return graph


def route_to_msg(route: T.Route, frame_id: str = "map") -> lm.Route:
    """A route without a goal keeps NaN goal coordinates (and a zero heading) in the message."""
    heading = route.goal_heading if math.isfinite(route.goal_heading) else 0.0
    return lm.Route(header=header(route.stamp, frame_id), road_ids=list(route.road_ids),
                    goal_pose=pose(route.goal_x, route.goal_y, heading))


def msg_to_route(msg: lm.Route) -> T.Route:
    x, y, yaw = pose_xy_yaw(msg.goal_pose)
    if not (math.isfinite(x) and math.isfinite(y)):
        yaw = math.nan
    return T.Route(from_time(msg.header.stamp), list(msg.road_ids), x, y, yaw)


# -- scene descriptor -------------------------------------------------------------------------------


def scene_to_msg(scene: T.SceneDescriptor, frame_id: str = "map") -> lm.SceneDescriptor:
    msg = lm.SceneDescriptor(header=header(scene.stamp, frame_id))
    msg.road_section = _lookup(_SECTION, scene.road_section, "road section")
    msg.num_lanes = int(scene.num_lanes)
    msg.ego_lane_index = int(scene.ego_lane_index)
    msg.lanes_connect_to_target = [bool(b) for b in scene.lanes_connect_to_target]
    msg.exit_point_distances = [float(d) for d, _ in scene.exit_points]
    msg.exit_point_bearings = [float(b) for _, b in scene.exit_points]
    msg.ego_speed = float(scene.ego_speed)
    msg.ego_acceleration = float(scene.ego_acceleration)
    msg.ego_length = float(scene.ego_length)
    msg.ego_width = float(scene.ego_width)
    msg.objects = [lm.ObjectDescription(id=o.id, object_class=_lookup(_OBJECT_CLASS, o.object_class, "object class"),
                                        distance=float(o.distance), bearing=float(o.bearing),
                                        heading=float(o.heading), speed=float(o.speed), length=float(o.length),
                                        width=float(o.width), lane_relation=o.lane_relation)
                   for o in scene.objects]
    msg.traffic_light = _lookup(_PHASE, scene.traffic_light, "traffic light phase")
    msg.navigation = _lookup(_NAV, scene.navigation, "navigation")
    msg.recent_decisions = list(scene.recent_decisions)
    msg.has_left_lane = bool(scene.has_left_lane)
    msg.has_right_lane = bool(scene.has_right_lane)
    msg.junction_distance = float(scene.junction_distance)
    return msg


def msg_to_scene(msg: lm.SceneDescriptor) -> T.SceneDescriptor:
    return T.SceneDescriptor(
        stamp=from_time(msg.header.stamp), road_section=_lookup(_SECTION_BACK, msg.road_section, "road section"),
        num_lanes=msg.num_lanes, ego_lane_index=msg.ego_lane_index,
        lanes_connect_to_target=list(msg.lanes_connect_to_target),
        exit_points=list(zip(msg.exit_point_distances, msg.exit_point_bearings)),
        ego_speed=msg.ego_speed, ego_acceleration=msg.ego_acceleration, ego_length=msg.ego_length,
        ego_width=msg.ego_width,
        objects=[T.ObjectDescription(o.id, _lookup(_OBJECT_CLASS_BACK, o.object_class, "object class"), o.distance,
                                     o.bearing, o.heading, o.speed, o.length, o.width, o.lane_relation)
                 for o in msg.objects],
        traffic_light=_lookup(_PHASE_BACK, msg.traffic_light, "traffic light phase"),
        navigation=_lookup(_NAV_BACK, msg.navigation, "navigation"),
        recent_decisions=list(msg.recent_decisions), has_left_lane=msg.has_left_lane,
        has_right_lane=msg.has_right_lane, junction_distance=msg.junction_distance)


# -- decisions, failures, explanations, reflections ---------------------------------------------------


def decision_to_msg(d: T.DecisionDistribution, frame_id: str = "map") -> lm.DecisionDistribution:
    return lm.DecisionDistribution(
        header=header(d.stamp, frame_id), action_codes=list(T.ACTION_CODES),
        probabilities=[float(p) for p in d.probabilities], candidate_set=list(d.candidate_set), query=d.query,
        retrieved_ids=list(d.retrieved_ids), latency=float(d.latency), scene_stamp=to_time(d.scene_stamp),
        memory_version=int(d.memory_version))


def msg_to_decision(msg: lm.DecisionDistribution, validate: bool = True) -> T.DecisionDistribution:
    """Message -> DecisionDistribution, reordering by ``action_codes``; raises ValueError on bad content."""
    codes = list(msg.action_codes)
    probs = list(msg.probabilities)
    if len(codes) != len(probs):
        raise ValueError(f"decision has {len(codes)} action codes but {len(probs)} probabilities")
    unknown = [c for c in codes if c not in T.ACTION_INDEX]
    if unknown:
        raise ValueError(f"decision names unknown action codes {unknown}")
    ordered = np.zeros(T.NUM_ACTIONS)
    for c, p in zip(codes, probs):
        ordered[T.ACTION_INDEX[c]] = p
    decision = T.DecisionDistribution(stamp=from_time(msg.header.stamp), probabilities=ordered,
                                      candidate_set=list(msg.candidate_set), query=msg.query,
                                      retrieved_ids=list(msg.retrieved_ids), latency=msg.latency,
                                      scene_stamp=from_time(msg.scene_stamp), memory_version=msg.memory_version)
    # The decision contract's one validation (luna_core.decision), at the ROS boundary.
    return check_decision(decision) if validate else decision


def failure_to_msg(f: T.FailureEvent, frame_id: str = "map") -> lm.FailureEvent:
    return lm.FailureEvent(header=header(f.stamp, frame_id), issued_decision=f.issued_decision,
                           decision_stamp=to_time(f.decision_stamp), colliding_ids=list(f.colliding_ids),
                           collision_kinds=[f.collision_kinds.get(i, "") for i in f.colliding_ids],
                           stall=bool(f.stall), blocked_by=f.blocked_by, near_miss_ids=list(f.near_misses),
                           near_miss_ttc=[float(t) for t in f.near_misses.values()])


def msg_to_failure(msg: lm.FailureEvent) -> T.FailureEvent:
    """Message -> FailureEvent; raises ValueError when the collision types do not pair with the ids or
    the near misses' times to collision with theirs."""
    ids, kinds = list(msg.colliding_ids), list(msg.collision_kinds)
    if kinds and len(kinds) != len(ids):
        raise ValueError(f"failure event has {len(ids)} colliding ids but {len(kinds)} collision kinds")
    near_ids, near_ttc = list(msg.near_miss_ids), list(msg.near_miss_ttc)
    if len(near_ids) != len(near_ttc):
        raise ValueError(f"failure event has {len(near_ids)} near-miss ids but {len(near_ttc)} times to collision")
    return T.FailureEvent(from_time(msg.header.stamp), msg.issued_decision, from_time(msg.decision_stamp),
                          ids, msg.stall, msg.blocked_by, {i: k for i, k in zip(ids, kinds) if k},
                          {i: float(t) for i, t in zip(near_ids, near_ttc)})


def explanation_to_msg(e: T.DecisionExplanation, frame_id: str = "map") -> lm.DecisionExplanation:
    return lm.DecisionExplanation(header=header(e.stamp, frame_id), decision_stamp=to_time(e.decision_stamp),
                                  failure_stamp=to_time(e.failure_stamp), query=e.query,
                                  candidate_set=list(e.candidate_set), text=e.text, latency=float(e.latency))


def msg_to_explanation(msg: lm.DecisionExplanation) -> T.DecisionExplanation:
    return T.DecisionExplanation(from_time(msg.header.stamp), from_time(msg.decision_stamp),
                                 from_time(msg.failure_stamp), msg.query, list(msg.candidate_set), msg.text,
                                 msg.latency)


def reflection_to_msg(r: T.ReflectionResult, frame_id: str = "map") -> lm.ReflectionResult:
    return lm.ReflectionResult(header=header(r.stamp, frame_id), failure_stamp=to_time(r.failure_stamp),
                               normal=bool(r.normal), revised_answer=r.revised_answer,
                               memory_item_id=r.memory_item_id, memory_version=int(r.memory_version),
                               error=r.error)


def msg_to_reflection(msg: lm.ReflectionResult) -> T.ReflectionResult:
    return T.ReflectionResult(from_time(msg.header.stamp), from_time(msg.failure_stamp), msg.normal,
                              msg.revised_answer, msg.memory_item_id, msg.memory_version, msg.error)


# -- trajectory -------------------------------------------------------------------------------------


def trajectory_to_msg(traj: T.Trajectory) -> lm.Trajectory:
    msg = lm.Trajectory(header=header(traj.stamp, traj.frame_id))
    msg.points = [lm.TrajectoryPoint(time_from_start=to_duration(float(t)), pose=pose(x, y, h),
                                     velocity=float(v), acceleration=float(a))
                  for t, x, y, h, v, a in zip(traj.t, traj.x, traj.y, traj.heading, traj.velocity,
                                              traj.acceleration)]
    return msg


def msg_to_trajectory(msg: lm.Trajectory) -> T.Trajectory:
    n = len(msg.points)
    cols = np.zeros((6, n))
    for i, p in enumerate(msg.points):
        x, y, yaw = pose_xy_yaw(p.pose)
        cols[:, i] = (from_duration(p.time_from_start), x, y, yaw, p.velocity, p.acceleration)
    return T.Trajectory(from_time(msg.header.stamp), *cols, frame_id=msg.header.frame_id or "map")
