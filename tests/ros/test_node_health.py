"""Node health over real DDS (issue 17): warnings clear when the input recovers, a condition that keeps
changing is not logged at every cycle, run-time parameters are checked by the start-up specs, an
object of unknown size is described and diagnosed instead of dropped, an oversized list is capped."""

from __future__ import annotations

import math

import luna_msgs.msg as lm
from diagnostic_msgs.msg import DiagnosticStatus
from nav_msgs.msg import Odometry

from luna_core import types as T
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.ros.helpers import (Probe, get_parameters, set_parameters, start_node, stop_process,
                               wait_for_subscribers)


def _now(probe: Probe) -> float:
    return probe.node.get_clock().now().nanoseconds * 1e-9


def _ego(stamp: float, x: float = 20.0) -> T.EgoState:
    return T.EgoState(stamp=stamp, x=x, y=0.0, heading=0.0, velocity=8.0)


def test_monitor_rejection_warning_clears_when_odometry_recovers_and_parameters_are_checked(tmp_path,
                                                                                            ros_context):
    proc = start_node("progress_monitor", "progress_monitor", {"decision_period": 0.2}, tmp_path)
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("progress_monitor")
        odom = probe.publisher(Odometry, "localization/kinematic_state", qos.STATE)
        wait_for_subscribers(odom)
        odom.publish(C.ego_to_odometry(_ego(_now(probe), x=math.nan)))
        probe.wait(lambda: diags and "input localization/kinematic_state: rejected" in diags[-1].message, 20.0,
                   "the rejection of a NaN odometry in diagnostics")
        assert diags[-1].level == DiagnosticStatus.WARN
        odom.publish(C.ego_to_odometry(_ego(_now(probe))))
        diags.clear()
        # Before issue 17 the WARN stayed for good (> 60 s); now the next diagnostics after a good message.
        probe.wait(lambda: any(d.level == DiagnosticStatus.OK for d in diags), 10.0, "the rejection cleared after a good odometry")
        assert "input" not in diags[-1].message

        # The finding's kind of request: every bad one refused with a reason, the values unchanged.
        refused = set_parameters(probe, "progress_monitor", stall_speed_threshold=-1.0, stall_window_cycles="x",
                                 decision_period=1.0)
        assert [r.successful for r in refused] == [False, False, False]
        assert "below the minimum 0.0" in refused[0].reason
        assert "expected int, got str 'x'" in refused[1].reason
        assert "read at start-up only" in refused[2].reason and "decision_period" in refused[2].reason
        (applied,) = set_parameters(probe, "progress_monitor", failure_cooldown=1.5)
        assert applied.successful, applied.reason
        assert get_parameters(probe, "progress_monitor", ["stall_speed_threshold", "stall_window_cycles",
                                                          "decision_period", "failure_cooldown"]) == {
            "stall_speed_threshold": 0.5, "stall_window_cycles": 3, "decision_period": 0.2, "failure_cooldown": 1.5}
    finally:
        probe.close()
        out = stop_process(proc)
    assert proc.returncode == 0, out
    assert "set_parameters refused" in out, "a refused change is logged"


def test_scene_keeps_an_object_of_unknown_size_and_logs_a_stale_odometry_once(tmp_path, ros_context):
    proc = start_node("scene_descriptor", "scene_descriptor", {"rate": 20.0, "max_input_age": 5.0}, tmp_path)
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("scene_descriptor")
        scenes = probe.collect(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        odom = probe.publisher(Odometry, "localization/kinematic_state", qos.STATE)
        objects = probe.publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
        route = probe.publisher(lm.Route, "planning/route", qos.LATCHED)
        graph = probe.publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED)
        for p in (odom, objects, route, graph):
            wait_for_subscribers(p)
        now = _now(probe)
        graph.publish(C.lane_graph_to_msg(samples.lane_graph()))
        route.publish(C.route_to_msg(T.Route(now, ["r0", "j"])))
        odom.publish(C.ego_to_odometry(_ego(now)))
        unsized = T.TrackedObject("unsized", T.ObjectClass.VEHICLE, 50.0, 0.0, 0.0, 0.0, 0.0, math.nan, math.nan)
        objects.publish(C.objects_to_msg(T.TrackedObjects(now, [unsized])))
        probe.wait(lambda: any(s.objects for s in scenes), 20.0, "a scene describing the object of unknown size")
        described = C.msg_to_scene([s for s in scenes if s.objects][-1]).objects[0]
        assert (described.id, described.length, described.width) == ("unsized", 5.5, 2.3)
        probe.wait(lambda: diags and "objects: 1 object(s) kept with assumed fields (unsized)" in diags[-1].message,
                   10.0, "the assumed footprint in diagnostics")

        # An oversized list is capped by distance from the ego, with the count in diagnostics.
        (applied,) = set_parameters(probe, "scene_descriptor", max_tracked_objects=5)
        assert applied.successful, applied.reason
        crowd = [T.TrackedObject(f"c{i}", T.ObjectClass.VEHICLE, 22.0 + 10.0 * i, 3.5, 0.0, 0.0, 0.0, 4.5, 1.9)
                 for i in range(8)]
        objects.publish(C.objects_to_msg(T.TrackedObjects(_now(probe), crowd)))
        odom.publish(C.ego_to_odometry(_ego(_now(probe))))
        probe.wait(lambda: diags and "8 objects in one message: kept the 5 nearest, left out the 3 farthest"
                   in diags[-1].message, 10.0, "the cap's count in diagnostics")

        # Odometry goes stale: at 20 Hz the WARN's age changes 20 times a second; it is logged once.
        # 0.5 s, not less: on a loaded machine a 0.2 s hiccup of the node or of this probe's 20 Hz
        # odometry made "stale" come back once during the fresh phase (a fresh-clone run beside 2 jobs).
        (applied,) = set_parameters(probe, "scene_descriptor", max_input_age=0.5)
        assert applied.successful, applied.reason
        probe.wait(lambda: diags and "odometry is stale" in diags[-1].message, 10.0, "the stale-odometry WARN")
        probe.spin_for(3.0)
        diags.clear()
        for _ in range(60):  # 3 s of fresh odometry at 20 Hz
            odom.publish(C.ego_to_odometry(_ego(_now(probe))))
            probe.spin_for(0.05)
        assert diags and all("stale" not in d.message for d in diags[1:]), "fresh odometry clears the WARN"
    finally:
        probe.close()
        out = stop_process(proc)
    assert proc.returncode == 0, out
    stale_lines = [line for line in out.splitlines() if "odometry is stale" in line and "[WARN]" in line]
    assert len(stale_lines) == 1, stale_lines
    assert "inputs: cleared (was: odometry is stale" in out
