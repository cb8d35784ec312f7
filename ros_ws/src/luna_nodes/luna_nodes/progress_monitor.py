"""progress_monitor: collision (Algorithm 1), near-miss, stall (Eq. 23) and blocked checks every T_d -> luna/failure."""

from __future__ import annotations

import luna_msgs.msg as lm
from nav_msgs.msg import Odometry

from luna_core.collision_kinds import CollisionType, describe
from luna_core.geometry import TOUCH_TOLERANCE
from luna_core.holds import HoldParameters
from luna_core.monitor import MonitorParameters
from luna_core.stack import MonitorConfig, build_progress_monitor
from luna_core.ttc import LEAST_MIN_TTC
from luna_msgs_py import convert, qos
from luna_nodes.base import MAX_TRACKED_OBJECTS, WARN, LunaNode, run
from luna_nodes.params import VEHICLE_PARAMS, NodeInterface, ParamSpec, vehicle_parameters

HOLD_PARAMS = ("hold_gap", "hold_headway", "hold_deceleration", "stopped_speed", "vru_distance", "vru_half_width",
               "vru_crossing_time")

INTERFACE = NodeInterface(
    name="progress_monitor",
    summary="Every decision period T_d checks the ego and object boxes since its last check (the last T_d; a "
            "check that load held up covers all it missed) for collisions "
            "(SAT, Algorithm 1; each classified by nuPlan's at-fault rules) and for near misses (a projected time "
            "to collision below nuPlan's 0.95 s bound), and the last H cycles for a stall "
            "(Eq. 23: low progress while no red light, no stopped or slower leader within the stopping "
            "distance and no crossing pedestrian held the ego) or for being blocked (low progress behind a "
            "stopped leader over all H cycles), and publishes the failure tuple (Eq. 24) when there is a failure.",
    inputs=[("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 50"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5"),
            ("luna/scene", "luna_msgs/SceneDescriptor", "reliable; its traffic light and its objects of the "
             "ego lane say what holds the ego"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10")],
    outputs=[("luna/failure", "luna_msgs/FailureEvent", "reliable, keep last 10")],
    params=[
        ParamSpec("decision_period", float, 2.0, "T_d: check period and collision window.", "s",
                  min=0.05, max=10.0),
        ParamSpec("stall_window_cycles", int, 3, "H: decision cycles in the stall window.", min=1, max=1000,
                  runtime=True),
        ParamSpec("stall_speed_threshold", float, 0.5, "v_th: mean speed below which the ego stalls.", "m/s",
                  min=0.0, runtime=True),
        ParamSpec("max_sample_gap", float, 0.3, "How far a sample may be from the instant it stands for.", "s",
                  min=0.01, runtime=True),
        ParamSpec("collision_tolerance", float, TOUCH_TOLERANCE, "Boxes this close count as touching.", "m",
                  min=0.0, runtime=True),
        ParamSpec("near_miss_ttc", float, LEAST_MIN_TTC, "A projected time to collision (nuPlan's rule) below this "
                  "is a near miss; 0 turns the check off.", "s", min=0.0, max=3.0, runtime=True),
        ParamSpec("failure_cooldown", float, 5.0, "A lasting stall or blocked ego, or a collision or near miss with "
                  "the same object, is reported again only after this long.", "s", min=0.0, runtime=True),
        ParamSpec("hold_gap", float, 8.0, "A leader within this bumper gap of a standing ego holds it (plus the "
                  "stopping distance while moving).", "m", min=0.0, runtime=True),
        ParamSpec("hold_headway", float, 1.5, "Time gap per m/s of ego speed added to hold_gap.", "s", min=0.0,
                  runtime=True),
        ParamSpec("hold_deceleration", float, 3.0, "Braking assumed for the stopping distance.", "m/s^2",
                  min=0.1, runtime=True),
        ParamSpec("stopped_speed", float, 0.2, "A leader no faster than this stands (blocked, if it lasts).", "m/s",
                  min=0.0, runtime=True),
        ParamSpec("vru_distance", float, 15.0, "A pedestrian or cyclist this far ahead on or towards the ego path "
                  "holds the ego.", "m", min=0.0, runtime=True),
        ParamSpec("vru_half_width", float, 3.0, "Lateral offset from the ego axis counted as on the ego path.", "m",
                  min=0.0, runtime=True),
        ParamSpec("vru_crossing_time", float, 3.0, "A VRU reaching the ego path within this long holds the ego.",
                  "s", min=0.0, runtime=True),
        MAX_TRACKED_OBJECTS,
        *VEHICLE_PARAMS,
    ],
)


class ProgressMonitorNode(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        self.detector = build_progress_monitor(MonitorConfig(monitor_parameters(self.params),
                                                             self.params["failure_cooldown"]))
        self.monitor = self.detector.monitor
        self.ego_xy: tuple[float, float] | None = None  # the latest odometry's position (the objects cap)
        self.publisher = self.luna_publisher(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        self.luna_subscription(Odometry, "localization/kinematic_state", self.on_odometry, qos.STATE)
        self.luna_subscription(lm.TrackedObjects, "perception/objects",
                               lambda m: self.monitor.update_objects(self.usable_objects_of(m, self.ego_xy)),
                               qos.SENSOR)
        self.luna_subscription(lm.SceneDescriptor, "luna/scene", self.on_scene, qos.RELIABLE)
        self.luna_subscription(lm.DecisionDistribution, "luna/decision",
                               lambda m: self.monitor.on_decision(convert.msg_to_decision(m)), qos.RELIABLE)
        self.timer = self.create_periodic(self.params["decision_period"], self.tick)

    def apply_parameters(self, params: dict) -> None:
        self.monitor.params = monitor_parameters(params)  # ValueError (refused) if MonitorParameters refuses
        self.detector.gate.cooldown = params["failure_cooldown"]

    def on_odometry(self, msg: Odometry) -> None:
        ego = convert.odometry_to_ego(msg)
        self.monitor.update_ego(ego)
        self.ego_xy = (ego.x, ego.y)

    def on_scene(self, msg: lm.SceneDescriptor) -> None:
        self.monitor.update_scene(convert.msg_to_scene(msg))

    def tick(self) -> None:
        now = self.now_s()
        if now <= 0.0:  # sim time not started yet
            return
        tick = self.detector.tick(now)
        d = self.monitor.diagnostics
        for key in ("latency", "frames_checked", "objects_checked", "mean_speed", "dropped_objects",
                    "assumed_objects", "hold", "min_time_to_collision"):
            self.diagnostics.set_value(f"check_{key}" if key == "latency" else key, getattr(d, key))
        if tick.detected is None:
            self.diagnostics.clear("failure")
            return
        admitted = tick.admitted
        if admitted is None:
            return
        self.publisher.publish(convert.failure_to_msg(admitted))
        self.diagnostics.increment("failures_published")
        collisions = [f"{i} ({describe(CollisionType(admitted.collision_kinds[i]))})"
                      if i in admitted.collision_kinds else i for i in admitted.colliding_ids]
        what = ", ".join(filter(None, [f"collision with {', '.join(collisions)}" if collisions else "",
                                       "near miss with " + ", ".join(f"{i} (TTC {t:.1f} s)" for i, t in
                                                                     admitted.near_misses.items())
                                       if admitted.near_miss else "",
                                       "stall" if admitted.stall else "",
                                       f"blocked behind the stopped {admitted.blocked_by}" if admitted.blocked else ""]))
        self.diagnostics.set_condition("failure", WARN, f"{what} under decision '{admitted.issued_decision}'")


def monitor_parameters(params: dict) -> MonitorParameters:
    return MonitorParameters(decision_period=params["decision_period"],
                             stall_window_cycles=params["stall_window_cycles"],
                             stall_speed_threshold=params["stall_speed_threshold"],
                             max_sample_gap=params["max_sample_gap"],
                             collision_tolerance=params["collision_tolerance"],
                             near_miss_ttc=params["near_miss_ttc"],
                             holds=HoldParameters(**{k: params[k] for k in HOLD_PARAMS}),
                             vehicle=vehicle_parameters(params))


def main(args=None) -> int:
    return run([ProgressMonitorNode], args)


if __name__ == "__main__":
    raise SystemExit(main())
