"""luna_core types -> message -> CDR bytes -> message -> luna_core types, for every interface."""

import math

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message

from luna_core import types as T
from luna_msgs_py import convert as C
from tests import samples
from tests.equality import assert_same

CASES = [
    ("ego", samples.ego, C.ego_to_odometry, C.odometry_to_ego),
    ("objects", samples.objects, C.objects_to_msg, C.msg_to_objects),
    ("lights", samples.lights, C.lights_to_msg, C.msg_to_lights),
    ("lane_graph", samples.lane_graph, C.lane_graph_to_msg, C.msg_to_lane_graph),
    ("route", samples.route, C.route_to_msg, C.msg_to_route),
    ("scene", samples.scene, C.scene_to_msg, C.msg_to_scene),
    ("decision", samples.decision, C.decision_to_msg, C.msg_to_decision),
    ("failure", samples.failure, C.failure_to_msg, C.msg_to_failure),
    ("explanation", samples.explanation, C.explanation_to_msg, C.msg_to_explanation),
    ("reflection", samples.reflection, C.reflection_to_msg, C.msg_to_reflection),
    ("trajectory", samples.trajectory, C.trajectory_to_msg, C.msg_to_trajectory),
    # float64 on the wire: the simulator's angle arrives bit-equal (the parity of issue 15)
    ("steering", lambda: (12.345, -0.1234567890123457), lambda v: C.steering_to_msg(*v), C.msg_to_steering),
]


@pytest.mark.parametrize("name,make,to_msg,from_msg", CASES, ids=[c[0] for c in CASES])
def test_round_trip_through_serialized_bytes(name, make, to_msg, from_msg):
    original = make()
    msg = to_msg(original)
    wire = serialize_message(msg)
    back = from_msg(deserialize_message(wire, type(msg)))
    assert_same(original, back, name)


def test_route_without_goal_keeps_nan():
    route = T.Route(1.0, ["a"])
    back = C.msg_to_route(deserialize_message(serialize_message(C.route_to_msg(route)), type(C.route_to_msg(route))))
    assert back.road_ids == ["a"] and math.isnan(back.goal_x) and math.isnan(back.goal_heading)


def test_failure_with_collision_kinds_that_do_not_pair_with_the_ids_is_rejected():
    msg = C.failure_to_msg(samples.failure())
    assert list(msg.collision_kinds) == ["ACTIVE_FRONT", ""]
    msg.collision_kinds = ["ACTIVE_FRONT"]
    with pytest.raises(ValueError, match="2 colliding ids but 1 collision kinds"):
        C.msg_to_failure(msg)


def test_failure_with_near_miss_times_that_do_not_pair_with_the_ids_is_rejected():
    msg = C.failure_to_msg(samples.failure())
    assert list(msg.near_miss_ids) == ["cut-in", "ped-2"] and list(msg.near_miss_ttc) == [0.4, 0.8]
    msg.near_miss_ttc = [0.4]
    with pytest.raises(ValueError, match="2 near-miss ids but 1 times to collision"):
        C.msg_to_failure(msg)


def test_decision_reordered_by_action_codes():
    msg = C.decision_to_msg(samples.decision())
    msg.action_codes = list(reversed(msg.action_codes))
    msg.probabilities = list(reversed(msg.probabilities))
    assert np.allclose(C.msg_to_decision(msg).probabilities, samples.decision().probabilities)


@pytest.mark.parametrize("mutate,match", [
    (lambda m: setattr(m, "action_codes", ["XX"] + list(m.action_codes[1:])), "unknown action codes"),
    (lambda m: setattr(m, "probabilities", [0.5] * 10), "sums to"),
    (lambda m: setattr(m, "probabilities", [float("nan")] + [0.1] * 9), "NaN"),
    (lambda m: setattr(m, "probabilities", [0.1] * 9), "10 action codes but 9"),
    (lambda m: setattr(m, "candidate_set", ["ZZ"]), "candidate set"),
])
def test_bad_decision_messages_are_rejected_with_reason(mutate, match):
    msg = C.decision_to_msg(samples.decision())
    mutate(msg)
    with pytest.raises(ValueError, match=match):
        C.msg_to_decision(msg)


def test_unknown_enum_value_is_named():
    msg = C.objects_to_msg(samples.objects())
    msg.objects[0].object_class = 42
    with pytest.raises(ValueError, match="object class value 42"):
        C.msg_to_objects(msg)


def test_negative_stamp_is_rejected():
    with pytest.raises(ValueError, match="not a finite non-negative time"):
        C.to_time(-1.0)
