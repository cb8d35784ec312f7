"""progress_monitor over DDS: a scripted stall and collision produce one failure tuple (Eq. 24)."""

import contextlib

import luna_msgs.msg as lm
from nav_msgs.msg import Odometry

from luna_core import types as T
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.ros.helpers import Probe, start_node, stop_process, wait_for_subscribers

# The monitor's inputs: (message type, topic, QoS).
ODOM = (Odometry, "localization/kinematic_state", qos.STATE)
OBJECTS = (lm.TrackedObjects, "perception/objects", qos.SENSOR)
DECISIONS = (lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
SCENES = (lm.SceneDescriptor, "luna/scene", qos.RELIABLE)


@contextlib.contextmanager
def monitor_node(tmp_path, ros_context, inputs):
    """A progress_monitor process (T_d = 0.2 s, H = 3, 30 s cooldown) and a probe publishing ``inputs``
    ((type, topic, QoS) each, waited for) and collecting luna/failure: (probe, failures, publishers)."""
    proc = start_node("progress_monitor", "progress_monitor",
                      {"decision_period": 0.2, "stall_window_cycles": 3, "failure_cooldown": 30.0}, tmp_path)
    probe = Probe(ros_context)
    try:
        failures = probe.collect(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        publishers = [probe.publisher(*spec) for spec in inputs]
        for p in publishers:
            wait_for_subscribers(p)
        yield probe, failures, publishers
    finally:
        probe.close()
        out = stop_process(proc)
    assert proc.returncode == 0, out


def test_stalled_ego_touching_an_object_yields_failure_with_decision(tmp_path, ros_context):
    inputs = [ODOM, OBJECTS, DECISIONS]
    with monitor_node(tmp_path, ros_context, inputs) as (probe, failures, (odom, objects, decisions)):
        clock = probe.node.get_clock()
        # The ego (rear axle at the origin, box centre 1.46 m ahead) touches a stopped car 4 m ahead.
        car = T.TrackedObject("car-9", T.ObjectClass.VEHICLE, 4.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
        far = T.TrackedObject("far", T.ObjectClass.VEHICLE, 60.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
        decision = samples.decision()
        sent_decision = False
        for i in range(60):  # 3 s at 20 Hz: more than H * T_d = 0.6 s
            now = clock.now().nanoseconds * 1e-9
            if not sent_decision:
                decision.stamp = now
                decisions.publish(C.decision_to_msg(decision))
                sent_decision = True
            odom.publish(C.ego_to_odometry(T.EgoState(now, 0.0, 0.0, 0.0, 0.0)))
            if i % 2 == 0:
                objects.publish(C.objects_to_msg(T.TrackedObjects(now, [car, far])))
            probe.spin_for(0.05)
        probe.wait(lambda: failures, 10.0, "a failure event")
        first = C.msg_to_failure(failures[0])
        events = [C.msg_to_failure(f) for f in failures]
        assert any(e.colliding_ids == ["car-9"] for e in events)
        assert any(e.stall for e in events), "3 s at standstill under no light is a stall (H T_d = 0.6 s)"
        # the cooldown (30 s) reports each failure once, however long it lasts
        assert sum(len(e.colliding_ids) for e in events) == 1 and sum(e.stall for e in events) == 1
        assert all("far" not in e.colliding_ids for e in events)
        assert first.issued_decision == decision.top_action


def test_standing_behind_a_stopped_car_in_the_scene_is_reported_as_blocked_not_as_a_stall(tmp_path, ros_context):
    with monitor_node(tmp_path, ros_context, [ODOM, SCENES]) as (probe, failures, (odom, scenes)):
        clock = probe.node.get_clock()
        # The scene descriptor sees a stopped car 0.5 m ahead of the ego's bumper in the ego lane.
        parked = T.ObjectDescription("parked-1", T.ObjectClass.VEHICLE, 0.5 + (5.176 + 4.5) / 2, 0.0, 0.0, 0.0,
                                     4.5, 1.9, "same lane")
        for i in range(60):  # 3 s at 20 Hz, standing still
            now = clock.now().nanoseconds * 1e-9
            odom.publish(C.ego_to_odometry(T.EgoState(now, 0.0, 0.0, 0.0, 0.0)))
            if i % 2 == 0:
                scenes.publish(C.scene_to_msg(T.SceneDescriptor(now, T.RoadSection.NORMAL_MULTI_LANE, 1, 1,
                                                                objects=[parked])))
            probe.spin_for(0.05)
        probe.wait(lambda: failures, 10.0, "a failure event")
        events = [C.msg_to_failure(f) for f in failures]
        assert all(e.blocked_by == "parked-1" and not e.stall and not e.colliding_ids for e in events)
        assert len(events) == 1  # once per cooldown


def test_closing_in_on_a_leader_that_then_leaves_the_lane_is_published_as_a_near_miss(tmp_path, ros_context):
    with monitor_node(tmp_path, ros_context, [ODOM, OBJECTS]) as (probe, failures, (odom, objects)):
        clock = probe.node.get_clock()
        start = clock.now().nanoseconds * 1e-9
        # The ego at 10 m/s closes in on a 4 m/s leader (bumper gap 7.7 - 6 t m: projected TTC 0.5 s at
        # 0.8 s), which then changes lanes: no contact, a near miss.
        for i in range(40):  # 2 s at 20 Hz
            now = clock.now().nanoseconds * 1e-9
            t = now - start
            odom.publish(C.ego_to_odometry(T.EgoState(now, 10.0 * t, 0.0, 0.0, 10.0)))
            if i % 2 == 0:
                lead = T.TrackedObject("lead", T.ObjectClass.VEHICLE, 14.0 + 4.0 * t, 0.0 if t <= 0.8 else 3.5,
                                       0.0, 4.0, 0.0, 4.5, 1.9)
                objects.publish(C.objects_to_msg(T.TrackedObjects(now, [lead])))
            probe.spin_for(0.05)
        probe.wait(lambda: failures, 10.0, "a failure event")
        events = [C.msg_to_failure(f) for f in failures]
        assert len(events) == 1 and not events[0].colliding_ids and not events[0].stall
        assert list(events[0].near_misses) == ["lead"] and events[0].near_misses["lead"] < 0.95
