"""progress_monitor: collision (Algorithm 1) and stall (Eq. 23) checks every T_d -> luna/failure."""

from __future__ import annotations

import luna_msgs.msg as lm
from nav_msgs.msg import Odometry

from luna_core.failure_gate import FailureGate
from luna_core.geometry import TOUCH_TOLERANCE
from luna_core.monitor import MonitorParameters, ProgressMonitor
from luna_nodes import convert, qos
from luna_nodes.base import WARN, LunaNode, run
from luna_nodes.params import NodeInterface, ParamSpec

INTERFACE = NodeInterface(
    name="progress_monitor",
    summary="Every decision period T_d checks the last T_d of ego and object boxes for collisions "
            "(SAT, Algorithm 1) and the last H cycles for a stall (Eq. 23), and publishes the failure "
            "tuple (Eq. 24) when there is a failure.",
    inputs=[("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 5"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5"),
            ("luna/scene", "luna_msgs/SceneDescriptor", "reliable; its traffic_light is the phase of the "
             "light governing the ego's path"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10")],
    outputs=[("luna/failure", "luna_msgs/FailureEvent", "reliable, keep last 10")],
    params=[
        ParamSpec("decision_period", float, 2.0, "T_d: check period and collision window.", "s",
                  min=0.05, max=10.0),
        ParamSpec("stall_window_cycles", int, 3, "H: decision cycles in the stall window.", min=1, max=1000),
        ParamSpec("stall_speed_threshold", float, 0.5, "v_th: mean speed below which the ego stalls.", "m/s",
                  min=0.0),
        ParamSpec("max_sample_gap", float, 0.3, "How far a sample may be from the instant it stands for.", "s",
                  min=0.01),
        ParamSpec("collision_tolerance", float, TOUCH_TOLERANCE, "Boxes this close count as touching.", "m",
                  min=0.0),
        ParamSpec("failure_cooldown", float, 5.0, "A lasting stall, or a collision with the same object, is "
                  "reported again only after this long.", "s", min=0.0),
    ],
)


class ProgressMonitorNode(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        p = self.params
        self.monitor = ProgressMonitor(MonitorParameters(
            decision_period=p["decision_period"], stall_window_cycles=p["stall_window_cycles"],
            stall_speed_threshold=p["stall_speed_threshold"], max_sample_gap=p["max_sample_gap"],
            collision_tolerance=p["collision_tolerance"]))
        self.gate = FailureGate(p["failure_cooldown"])
        self.publisher = self.luna_publisher(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        self.luna_subscription(Odometry, "localization/kinematic_state",
                               lambda m: self.monitor.update_ego(convert.odometry_to_ego(m)), qos.SENSOR)
        self.luna_subscription(lm.TrackedObjects, "perception/objects",
                               lambda m: self.monitor.update_objects(convert.msg_to_objects(m)), qos.SENSOR)
        self.luna_subscription(lm.SceneDescriptor, "luna/scene", self.on_scene, qos.RELIABLE)
        self.luna_subscription(lm.DecisionDistribution, "luna/decision",
                               lambda m: self.monitor.on_decision(convert.msg_to_decision(m)), qos.RELIABLE)
        self.timer = self.create_periodic(p["decision_period"], self.tick)

    def on_scene(self, msg: lm.SceneDescriptor) -> None:
        scene = convert.msg_to_scene(msg)
        self.monitor.update_light(scene.stamp, scene.traffic_light)

    def tick(self) -> None:
        now = self.now_s()
        if now <= 0.0:  # sim time not started yet
            return
        event = self.monitor.check(now)
        d = self.monitor.diagnostics
        for key in ("latency", "frames_checked", "objects_checked", "mean_speed", "dropped_objects"):
            self.diagnostics.set_value(f"check_{key}" if key == "latency" else key, getattr(d, key))
        if event is None:
            self.diagnostics.clear("failure")
            return
        admitted = self.gate.admit(event)
        if admitted is None:
            return
        self.publisher.publish(convert.failure_to_msg(admitted))
        self.diagnostics.increment("failures_published")
        what = ", ".join(filter(None, [f"collision with {admitted.colliding_ids}" if admitted.colliding_ids else "",
                                       "stall" if admitted.stall else ""]))
        self.diagnostics.set_condition("failure", WARN, f"{what} under decision '{admitted.issued_decision}'")


def main(args=None) -> int:
    return run([ProgressMonitorNode], args)


if __name__ == "__main__":
    raise SystemExit(main())
