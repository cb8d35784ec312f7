"""scene_descriptor over DDS: publishes xi_t from real inputs and survives bad ones."""

import math

import numpy as np
import pytest

import luna_msgs.msg as lm
from builtin_interfaces.msg import Time
from geometry_msgs.msg import AccelWithCovarianceStamped
from nav_msgs.msg import Odometry
from rosgraph_msgs.msg import Clock

from luna_core import types as T
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.ros.helpers import Probe, start_node, stop_process, wait_for_subscribers


@pytest.fixture
def scene_node(tmp_path, ros_context):
    proc = start_node("scene_descriptor", "scene_descriptor", {"rate": 20.0, "max_input_age": 5.0}, tmp_path)
    probe = Probe(ros_context)
    yield proc, probe
    probe.close()
    out = stop_process(proc)
    assert proc.returncode == 0, out


def _inputs(probe):
    pubs = {
        "odom": probe.publisher(Odometry, "localization/kinematic_state", qos.STATE),
        "objects": probe.publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR),
        "route": probe.publisher(lm.Route, "planning/route", qos.LATCHED),
        "graph": probe.publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED),
    }
    for p in pubs.values():
        wait_for_subscribers(p)
    return pubs


def _ego(stamp: float, x: float = 20.0, y: float = 0.0) -> T.EgoState:
    return T.EgoState(stamp=stamp, x=x, y=y, heading=0.0, velocity=8.0)


def test_publishes_scene_with_lane_and_objects(scene_node):
    _, probe = scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs = _inputs(probe)
    now = probe.node.get_clock().now().nanoseconds * 1e-9
    pubs["graph"].publish(C.lane_graph_to_msg(samples.lane_graph()))
    pubs["route"].publish(C.route_to_msg(T.Route(now, ["r0", "j"])))
    lead = T.TrackedObject("lead", T.ObjectClass.VEHICLE, 40.0, 0.0, 0.0, 5.0, 0.0, 4.5, 1.9)
    pubs["objects"].publish(C.objects_to_msg(T.TrackedObjects(now, [lead])))
    pubs["odom"].publish(C.ego_to_odometry(_ego(now)))
    probe.wait(lambda: any(s.objects for s in scenes), 20.0, "a scene describing the lead vehicle")
    scene = C.msg_to_scene([s for s in scenes if s.objects][-1])
    assert scene.num_lanes == 2 and scene.ego_lane_index == 2  # l0 (left), l1 (right, ego)
    assert scene.has_left_lane and not scene.has_right_lane
    obj = scene.objects[0]
    assert obj.id == "lead" and obj.lane_relation == "same lane"
    # polar frame at the ego box centre: 20 m rear axle -> centre 1.461 m ahead
    assert obj.distance == pytest.approx(40.0 - 20.0 - T.VehicleParameters().rear_axle_to_center, abs=0.01)
    assert abs(obj.bearing) < 1e-6


def test_a_new_route_starts_a_new_mission_without_the_last_ones_recent_decisions(scene_node):
    """The prompt's recent decisions are this mission's: a route delivered again keeps them, a new route
    (a new mission; the bridge's next scenario) empties them, as luna-bridge eval starts each scenario."""
    _, probe = scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs = _inputs(probe)
    decisions = probe.publisher(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
    wait_for_subscribers(decisions)
    now = probe.node.get_clock().now().nanoseconds * 1e-9
    route = T.Route(now, ["r0", "j"])
    pubs["graph"].publish(C.lane_graph_to_msg(samples.lane_graph()))
    pubs["route"].publish(C.route_to_msg(route))
    p = np.zeros(len(T.ACTION_CODES))
    p[T.ACTION_CODES.index("DK")] = 1.0
    decisions.publish(C.decision_to_msg(T.DecisionDistribution(now, p, ["DK"])))

    def latest_recent() -> list[str] | None:
        pubs["odom"].publish(C.ego_to_odometry(_ego(probe.node.get_clock().now().nanoseconds * 1e-9)))
        return list(scenes[-1].recent_decisions) if scenes else None
    probe.wait(lambda: latest_recent() == ["DK"], 20.0, "a scene whose recent decisions hold DK")
    pubs["route"].publish(C.route_to_msg(route))  # the same route again: the same mission
    count = len(scenes)
    probe.wait(lambda: latest_recent() is not None and len(scenes) > count + 5, 20.0, "more scenes")
    assert scenes[-1].recent_decisions == ["DK"]
    pubs["route"].publish(C.route_to_msg(T.Route(now + 10.0, ["r0", "j"])))
    probe.wait(lambda: latest_recent() == [], 20.0, "a scene of the new mission without recent decisions")


@pytest.mark.parametrize("sim_scene_node", [0.2], indirect=True, ids=["input_sync_timeout 0.2 s"])
def test_lock_step_acceleration_publisher_that_stays_silent_is_given_up_and_diagnosed(sim_scene_node):
    """A publisher on localization/acceleration that never sends: the first instant waits its
    input_sync_timeout, then is described with the fallback (the speed's finite difference, 0 here), the
    node says so in /diagnostics and later instants no longer wait for it."""
    _, probe = sim_scene_node
    diags = probe.diagnostics("scene_descriptor")
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs, clock = _lock_step_inputs(probe)
    wait_for_subscribers(probe.publisher(AccelWithCovarianceStamped, "localization/acceleration", qos.STATE))
    first = BAG_EPOCH * 1_000_000_000
    for k in range(2):
        ns = first + k * 100_000_000
        clock.publish(Clock(clock=_stamp(ns)))
        pubs["odom"].publish(_odometry_at(ns))
        probe.wait(lambda: _scene_at(scenes, ns) is not None, 30.0, f"the scene of {ns} ns")
        assert C.msg_to_scene(_scene_at(scenes, ns)).ego_acceleration == 0.0
    probe.wait(lambda: any("acceleration topic has a publisher that sent nothing" in d.message for d in diags),
               20.0, "diagnostics naming the silent acceleration publisher")


def test_bad_odometry_is_rejected_and_diagnosed_node_stays_up(scene_node):
    proc, probe = scene_node
    diags = probe.diagnostics("scene_descriptor")
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs = _inputs(probe)
    now = probe.node.get_clock().now().nanoseconds * 1e-9
    pubs["graph"].publish(C.lane_graph_to_msg(samples.lane_graph()))
    pubs["route"].publish(C.route_to_msg(T.Route(now, ["r0", "j"])))
    pubs["odom"].publish(C.ego_to_odometry(_ego(now, x=math.nan)))
    probe.wait(lambda: any("rejected" in d.message for d in diags), 20.0, "diagnostics naming the rejected input")
    assert not scenes
    pubs["odom"].publish(C.ego_to_odometry(_ego(now + 0.1)))
    pubs["odom"].publish(C.ego_to_odometry(_ego(now)))  # out of order: rejected, the newer one stays
    probe.wait(lambda: scenes, 20.0, "a scene after a valid odometry message")
    assert proc.poll() is None

    def rejected() -> int:
        return max((int(kv.value) for d in diags for kv in d.values if kv.key == "rejected_inputs"), default=0)
    probe.wait(lambda: rejected() >= 2, 20.0, "the NaN and the out-of-order odometry counted as rejected")


# -- lock step on sim time (luna replay, a simulator) ------------------------------------------------------

BAG_EPOCH = 1_699_999_998  # s: the sample bag's first instant; epoch-scale stamps are what /clock carries


def _stamp(ns: int) -> Time:
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _odometry_at(ns: int):
    msg = C.ego_to_odometry(_ego(ns * 1e-9))
    msg.header.stamp = _stamp(ns)  # exact: the float conversion would round the nanoseconds
    return msg


@pytest.fixture
def sim_scene_node(request, tmp_path, ros_context):
    """The node on sim time. Its input_sync_timeout is generous (10 s of wall time) unless a test asks for
    the default through indirect parametrization: past that timeout an instant whose odometry is late
    (a starved node on a loaded CI machine) is described from the odometry before it, a degraded mode
    that the tests of instants and accelerations are not about."""
    sync_timeout = getattr(request, "param", 10.0)
    proc = start_node("scene_descriptor", "scene_descriptor", {"rate": 10.0, "input_sync_timeout": sync_timeout},
                      tmp_path, extra_args=["-p", "use_sim_time:=true"])
    probe = Probe(ros_context)
    yield proc, probe
    probe.close()
    out = stop_process(proc)
    assert proc.returncode == 0, out


def _lock_step_inputs(probe):
    pubs = _inputs(probe)
    clock = probe.publisher(Clock, "/clock", qos.CLOCK)
    wait_for_subscribers(clock, count=2)  # rclpy's time source and the node's per-instant ticks
    pubs["graph"].publish(C.lane_graph_to_msg(samples.lane_graph()))
    pubs["route"].publish(C.route_to_msg(T.Route(float(BAG_EPOCH), ["r0", "j"])))
    return pubs, clock


def _scene_at(scenes: list, ns: int):
    return next((s for s in scenes if s.header.stamp == _stamp(ns)), None)


def test_lock_step_describes_every_instant_of_an_epoch_clock(sim_scene_node):
    """Every 0.1 s instant of a clock at bag (epoch) time gets its scene. In floats, now / period at 1.7e9 s
    is off by more than any epsilon: a clock exactly at 0.1 s after the epoch was taken for the instant
    before and that instant was never described (48 of the sample bag's 121)."""
    _, probe = sim_scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs, clock = _lock_step_inputs(probe)
    missed = []
    for k in range(25):
        ns = BAG_EPOCH * 1_000_000_000 + k * 100_000_000
        clock.publish(Clock(clock=_stamp(ns)))  # as a bag plays: the clock tick, then the instant's inputs
        pubs["odom"].publish(_odometry_at(ns))
        try:  # lock step: the next instant only once this one is described
            probe.wait(lambda: _scene_at(scenes, ns) is not None, 30.0 if k == 0 else 15.0, f"the scene of {ns} ns")
        except TimeoutError:
            missed.append(round(k * 0.1, 1))
    assert not missed, f"no scene for the instants {missed} s after the epoch"


@pytest.mark.parametrize("sim_scene_node", [0.2], indirect=True, ids=["input_sync_timeout 0.2 s"])
def test_lock_step_instant_waits_for_its_late_odometry(sim_scene_node):
    """The clock holds at an instant whose odometry comes 1.5 s (wall) late, long after
    input_sync_timeout, while the newest odometry before it is older than max_input_age: the instant is
    described once its odometry is in (a starved node's inputs are late, not lost), not given up as stale.
    The missed sync names what was missing, with the latest stamp heard."""
    _, probe = sim_scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    diags = probe.diagnostics("scene_descriptor")
    pubs, clock = _lock_step_inputs(probe)
    first = BAG_EPOCH * 1_000_000_000
    clock.publish(Clock(clock=_stamp(first)))
    pubs["odom"].publish(_odometry_at(first))
    probe.wait(lambda: _scene_at(scenes, first) is not None, 30.0, "the scene of the first instant")
    held = first + 1_000_000_000  # 1 s on: the odometry of `first` is stale there (max_input_age 0.5 s)
    clock.publish(Clock(clock=_stamp(held)))
    probe.spin_for(1.5)
    assert _scene_at(scenes, held) is None, "a scene of the held instant before its odometry was published"
    probe.wait(lambda: any(f"missing odometry (latest {BAG_EPOCH:.2f} s)" in d.message for d in diags), 10.0,
               "the lock-step WARN naming the missing odometry and its latest stamp")
    pubs["odom"].publish(_odometry_at(held))
    probe.wait(lambda: _scene_at(scenes, held) is not None, 10.0, "the scene of the held instant")


@pytest.mark.parametrize("sim_scene_node", [120.0], indirect=True, ids=["input_sync_timeout 120 s"])
def test_sigint_ends_a_lock_step_wait_and_the_node_exits_cleanly(sim_scene_node):
    """SIGINT while an instant waits for its odometry (input_sync_timeout 120 s): the wait ends with the
    context and the node exits with 0 within stop_process's 15 s, not killed after it (a node that outlived
    its stop bound once failed the parity test with exit -9)."""
    proc, probe = sim_scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs, clock = _lock_step_inputs(probe)
    first = BAG_EPOCH * 1_000_000_000
    clock.publish(Clock(clock=_stamp(first)))
    pubs["odom"].publish(_odometry_at(first))
    probe.wait(lambda: _scene_at(scenes, first) is not None, 30.0, "the scene of the first instant")
    clock.publish(Clock(clock=_stamp(first + 100_000_000)))  # its odometry never comes: the tick waits
    probe.spin_for(2.0)
    assert _scene_at(scenes, first + 100_000_000) is None, "the instant was described without its odometry"
    out = stop_process(proc)
    assert "did not stop on SIGINT" not in out and proc.returncode == 0, out


def _acceleration_at(ns: int, value: float) -> AccelWithCovarianceStamped:
    msg = AccelWithCovarianceStamped()
    msg.header.stamp = _stamp(ns)
    msg.header.frame_id = "base_link"
    msg.accel.accel.linear.x = value
    return msg


def test_lock_step_scene_carries_the_reported_acceleration_of_its_instant(sim_scene_node):
    """ego_acceleration is the acceleration the simulator reports for the instant (as in evaluation and
    as the planner pairs it), in either arrival order; not a finite difference of the speed (the
    speed here is constant: a difference would give 0). The first instant's acceleration comes after its
    odometry: the topic has a publisher, so it is waited for before anything was heard on it."""
    _, probe = sim_scene_node
    scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
    pubs, clock = _lock_step_inputs(probe)
    accel = probe.publisher(AccelWithCovarianceStamped, "localization/acceleration", qos.STATE)
    wait_for_subscribers(accel)
    first = BAG_EPOCH * 1_000_000_000
    for k, (value, accel_first) in enumerate([(1.5, False), (-0.75, True), (0.25, False)]):
        ns = first + k * 100_000_000
        clock.publish(Clock(clock=_stamp(ns)))
        if accel_first:
            accel.publish(_acceleration_at(ns, value))
        pubs["odom"].publish(_odometry_at(ns))
        if not accel_first:  # after its odometry: the instant waits for it
            probe.spin_for(0.5)
            assert _scene_at(scenes, ns) is None, f"instant {k} described before its acceleration came"
            accel.publish(_acceleration_at(ns, value))
        probe.wait(lambda: _scene_at(scenes, ns) is not None, 30.0 if k == 0 else 15.0, f"the scene of {ns} ns")
        assert C.msg_to_scene(_scene_at(scenes, ns)).ego_acceleration == pytest.approx(value), k
