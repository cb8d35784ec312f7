"""One populated instance of every luna_core type that crosses a ROS interface (for round trips)."""

from __future__ import annotations

import math

import numpy as np

from luna_core import types as T


def ego() -> T.EgoState:
    return T.EgoState(stamp=12.5, x=101.25, y=-7.5, heading=0.3, velocity=8.2, acceleration=0.0,
                      yaw_rate=0.05, lateral_velocity=0.1)


def objects() -> T.TrackedObjects:
    return T.TrackedObjects(12.5, [
        T.TrackedObject("veh-1", T.ObjectClass.VEHICLE, 120.0, -7.0, 0.28, 7.5, 2.1, 4.8, 1.9),
        T.TrackedObject("ped-7", T.ObjectClass.PEDESTRIAN, 130.5, 2.0, -1.5, 0.1, -1.2, 0.6, 0.6),
        T.TrackedObject("bike", T.ObjectClass.BICYCLE, 90.0, -3.5, 3.0, -5.0, 0.2, 1.8, 0.7),
        T.TrackedObject("cone", T.ObjectClass.STATIC, 140.0, -8.0, 0.0, 0.0, 0.0, 0.4, 0.4),
    ])


def lights() -> T.TrafficLights:
    return T.TrafficLights(12.5, [T.TrafficLightState("conn-3", T.TrafficLightPhase.RED),
                                  T.TrafficLightState("conn-4", T.TrafficLightPhase.GREEN),
                                  T.TrafficLightState("conn-5", T.TrafficLightPhase.YELLOW),
                                  T.TrafficLightState("conn-6", T.TrafficLightPhase.NONE)])


def lane_graph() -> T.LaneGraph:
    xs = np.linspace(0.0, 100.0, 11)
    g = T.LaneGraph(frame_id="map", stamp=1.0)
    for i, (lid, y) in enumerate((("l0", 3.5), ("l1", 0.0))):
        g.add(T.Lane(id=lid, centerline=np.stack([xs, np.full_like(xs, y)], 1),
                     left_boundary=np.stack([xs, np.full_like(xs, y + 1.75)], 1),
                     right_boundary=np.stack([xs, np.full_like(xs, y - 1.75)], 1), speed_limit=13.9,
                     road_id="r0", successors=["j0"] if lid == "l1" else [], predecessors=[],
                     left_neighbor="" if i == 0 else "l0", right_neighbor="l1" if i == 0 else "",
                     in_junction=False))
    g.add(T.Lane(id="j0", centerline=np.array([[100.0, 0.0], [110.0, 5.0]]),
                 left_boundary=np.array([[100.0, 1.75], [109.0, 6.5]]),
                 right_boundary=np.array([[100.0, -1.75], [111.0, 3.5]]), speed_limit=8.0, road_id="j",
                 predecessors=["l1"], in_junction=True))
    return g


def route() -> T.Route:
    return T.Route(2.0, ["r0", "j", "r1"], 180.0, 20.0, 0.5)


def scene() -> T.SceneDescriptor:
    return T.SceneDescriptor(
        stamp=12.5, road_section=T.RoadSection.NEAR_JUNCTION, num_lanes=3, ego_lane_index=2,
        lanes_connect_to_target=[True, True, False], exit_points=[(35.2, 0.12), (36.0, -0.05)],
        ego_speed=8.2, ego_acceleration=-0.4, ego_length=5.176, ego_width=2.297,
        objects=[T.ObjectDescription("veh-1", T.ObjectClass.VEHICLE, 18.9, 0.05, -0.02, 7.8, 4.8, 1.9, "same lane"),
                 T.ObjectDescription("ped-7", T.ObjectClass.PEDESTRIAN, 25.0, 0.9, -1.8, 1.2, 0.6, 0.6, "junction")],
        traffic_light=T.TrafficLightPhase.YELLOW, navigation=T.Navigation.LEFT, recent_decisions=["CK", "DK"],
        has_left_lane=True, has_right_lane=False, junction_distance=17.5)


def decision() -> T.DecisionDistribution:
    p = np.array([0.05, 0.0, 0.0, 0.55, 0.1, 0.0, 0.25, 0.0, 0.0, 0.05])
    return T.DecisionDistribution(stamp=13.0, probabilities=p, candidate_set=T.candidate_set(p, 0.1),
                                  query="Scene: ...", retrieved_ids=["m-1", "m-7", "m-9"], latency=0.41,
                                  scene_stamp=12.5, memory_version=7)


def failure() -> T.FailureEvent:
    return T.FailureEvent(14.0, "AK", 13.0, ["veh-1", "cone"], True, "parked-3", {"veh-1": "ACTIVE_FRONT"},
                          {"cut-in": 0.4, "ped-2": 0.8})


def explanation() -> T.DecisionExplanation:
    return T.DecisionExplanation(15.0, 13.0, 14.0, "Scene: ...", ["CK", "DK"],
                                 "Recommended decisions: CK,DK\nExplanations: ...", 3.2)


def reflection() -> T.ReflectionResult:
    return T.ReflectionResult(20.0, 14.0, False, "Recommended decisions: DK\n...", "refl-1", 8, "")


def trajectory() -> T.Trajectory:
    t = np.arange(0.0, 8.01, 0.5)
    poses = np.stack([101.25 + 8.0 * t, -7.5 + 0.1 * t, np.full_like(t, 0.3)], 1)
    traj = T.Trajectory.from_poses(12.5, t, poses)
    assert math.isclose(traj.velocity[0], math.hypot(4.0, 0.05) / 0.5, rel_tol=1e-9)
    return traj
