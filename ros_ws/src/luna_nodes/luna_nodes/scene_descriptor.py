"""scene_descriptor: builds xi_t (luna_core.scene) from the latest inputs at a fixed rate.

Objects follow ``usable_objects`` (an unknown size gets the class's default footprint; at most
``max_tracked_objects`` nearest the ego), diagnosed; the description parameters apply at run time.
"""

from __future__ import annotations

import math
import time

import luna_msgs.msg as lm
from nav_msgs.msg import Odometry

from luna_core.scene import SceneConfig, SceneInputError, build_scene
from luna_core.types import EgoState, LaneGraph, Route, TrackedObjects, TrafficLights
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

from luna_nodes import convert, qos
from luna_nodes.base import ERROR, MAX_TRACKED_OBJECTS, WARN, LunaNode, run
from luna_nodes.params import NodeInterface, ParamSpec

INTERFACE = NodeInterface(
    name="scene_descriptor",
    summary="Builds the scene descriptor xi_t (LUNA-AD Eq. 4, Table I) from odometry, tracked objects, "
            "traffic lights, the route and the lane graph, and publishes it at a fixed rate.",
    inputs=[("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 5"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5"),
            ("perception/traffic_lights", "luna_msgs/TrafficLightStateArray", "reliable, keep last 5"),
            ("planning/route", "luna_msgs/Route", "reliable, transient local"),
            ("map/lane_graph", "luna_msgs/LaneGraph", "reliable, transient local"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10 (recent decisions)")],
    outputs=[("luna/scene", "luna_msgs/SceneDescriptor", "reliable, keep last 10")],
    params=[
        ParamSpec("rate", float, 10.0, "Publication rate.", "Hz", min=0.1, max=100.0),
        ParamSpec("max_input_age", float, 0.5, "Odometry older than this (node clock) is stale: no scene "
                  "is published and diagnostics report it.", "s", min=0.01, runtime=True),
        ParamSpec("near_junction_distance", float, 20.0, "d of CALMM-Drive: 'near a junction' threshold.",
                  "m", min=0.0, runtime=True),
        ParamSpec("vru_range", float, 30.0, "VRU field-of-view radius.", "m", min=0.0, runtime=True),
        ParamSpec("vru_half_angle", float, math.radians(75.0), "VRU field-of-view half angle.", "rad",
                  min=0.0, max=math.pi, runtime=True),
        ParamSpec("max_objects", int, 12, "Cap on described objects (closest kept).", min=0, max=200, runtime=True),
        ParamSpec("max_object_distance", float, 80.0, "Vehicles and static objects further away are not "
                  "described.", "m", min=0.0, runtime=True),
        MAX_TRACKED_OBJECTS,
    ],
)


class SceneDescriptorNode(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        self.config = scene_config(self.params)
        self.ego: EgoState | None = None
        self.objects: TrackedObjects | None = None
        self.lights: TrafficLights | None = None
        self.route: Route | None = None
        self.graph: LaneGraph | None = None
        self.recent_decisions: list[str] = []
        self.publisher = self.luna_publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        # Odometry has a group of its own: a huge objects message must not hold it up (issue 17).
        self.luna_subscription(Odometry, "localization/kinematic_state", self.on_odometry, qos.SENSOR,
                               callback_group=MutuallyExclusiveCallbackGroup())
        self.luna_subscription(lm.TrackedObjects, "perception/objects", self.on_objects, qos.SENSOR)
        self.luna_subscription(lm.TrafficLightStateArray, "perception/traffic_lights", self.on_lights, qos.SENSOR)
        self.luna_subscription(lm.Route, "planning/route", self.on_route, qos.LATCHED)
        self.luna_subscription(lm.LaneGraph, "map/lane_graph", self.on_lane_graph, qos.LATCHED)
        self.luna_subscription(lm.DecisionDistribution, "luna/decision", self.on_decision, qos.RELIABLE)
        self.timer = self.create_periodic(1.0 / self.params["rate"], self.tick)

    def apply_parameters(self, params: dict) -> None:
        self.config = scene_config(params)

    # -- inputs -------------------------------------------------------------------------------------

    def on_odometry(self, msg: Odometry) -> None:
        ego = convert.odometry_to_ego(msg)
        if not ego.is_finite():
            raise ValueError("odometry contains NaN or inf")
        if self.ego is not None:
            dt = ego.stamp - self.ego.stamp
            if dt < 0:
                raise ValueError(f"odometry stamp {ego.stamp:.3f} s is older than the last one "
                                 f"({self.ego.stamp:.3f} s)")
            # Odometry carries no acceleration: differentiate the speed (smoothed).
            if dt > 1e-3:
                raw = (ego.velocity - self.ego.velocity) / dt
                ego.acceleration = 0.7 * self.ego.acceleration + 0.3 * raw
            else:
                ego.acceleration = self.ego.acceleration
        self.ego = ego

    def on_objects(self, msg: lm.TrackedObjects) -> None:
        ego = self.ego
        self.objects = self.usable_objects_of(msg, (ego.x, ego.y) if ego is not None else None)

    def on_lights(self, msg: lm.TrafficLightStateArray) -> None:
        self.lights = convert.msg_to_lights(msg)

    def on_route(self, msg: lm.Route) -> None:
        self.route = convert.msg_to_route(msg)

    def on_lane_graph(self, msg: lm.LaneGraph) -> None:
        self.graph = convert.msg_to_lane_graph(msg)
        self.diagnostics.set_value("lanes", len(self.graph.lanes))

    def on_decision(self, msg: lm.DecisionDistribution) -> None:
        top = convert.msg_to_decision(msg).top_action
        self.recent_decisions = (self.recent_decisions + [top])[-2:]

    # -- output -------------------------------------------------------------------------------------

    def missing_inputs(self) -> list[str]:
        return [name for name, value in (("odometry", self.ego), ("route", self.route),
                                         ("lane graph", self.graph)) if value is None]

    def tick(self) -> None:
        missing = self.missing_inputs()
        if missing:
            self.diagnostics.set_condition("inputs", WARN, f"waiting for {', '.join(missing)}")
            return
        age = self.now_s() - self.ego.stamp
        if age > self.params["max_input_age"]:
            self.diagnostics.set_condition("inputs", WARN, f"odometry is stale ({age:.2f} s old)")
            return
        self.diagnostics.clear("inputs")
        start = time.perf_counter()
        try:
            scene = build_scene(self.ego, self.objects, self.lights, self.route, self.graph,
                                self.recent_decisions, config=self.config)
        except SceneInputError as exc:
            self.diagnostics.set_condition("scene", ERROR, str(exc))
            return
        self.diagnostics.clear("scene")
        self.publisher.publish(convert.scene_to_msg(scene))
        self.diagnostics.set_value("build_latency_s", time.perf_counter() - start)
        self.diagnostics.set_value("described_objects", len(scene.objects))
        self.diagnostics.set_value("dropped_objects", len(scene.dropped_objects))
        self.diagnostics.increment("scenes_published")


def scene_config(params: dict) -> SceneConfig:
    return SceneConfig(near_junction_distance=params["near_junction_distance"], vru_range=params["vru_range"],
                       vru_half_angle=params["vru_half_angle"], max_objects=params["max_objects"],
                       max_object_distance=params["max_object_distance"])


def main(args=None) -> int:
    return run([SceneDescriptorNode], args)


if __name__ == "__main__":
    raise SystemExit(main())
