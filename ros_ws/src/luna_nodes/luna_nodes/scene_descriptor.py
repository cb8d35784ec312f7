"""scene_descriptor: builds xi_t (luna_core.scene) from the latest inputs at a fixed rate.

``ego_acceleration`` is the reported acceleration (``localization/acceleration``: the simulator's value
in closed loop, as in evaluation) paired with the odometry by stamp, the planner's rule
(``luna_core.ego_history``); only without that topic (e.g. a bag recorded without it) a smoothed
finite difference of the speed, in both nodes alike.

Under ``use_sim_time`` the scene of instant t waits (``input_sync_timeout`` of wall time) for the
odometry, acceleration, objects and lights stamped t (each once it has been heard; the acceleration
also before that, once its topic has a publisher), as the planner does: DDS does not
order topics, and a lock-step simulator's ``/clock`` may overtake the inputs it published before it. It
is built from the latest inputs stamped at or before t (a tick that runs late, after the clock moved
on, still describes its own instant), so a lock-step run gives the same scenes however loaded the
machine is, as long as each input comes within ``input_sync_timeout``. Past it the instant is described
from the newest odometry before it (stamped with that odometry's time), counted as an input sync
timeout and raised as the "lock step" WARN: raise the timeout where the machine is starved. An instant that would otherwise get no scene (its odometry not in, the newest older than
``max_input_age``) waits for that odometry for as long as the clock stands at the instant: a lock-step
driver holds it there until the stack answers, and a starved node's inputs are late, not lost.
Objects follow ``usable_objects`` (an unknown size gets the class's default footprint; at most
``max_tracked_objects`` nearest the ego), diagnosed; the description parameters apply at run time.
"""

from __future__ import annotations

import collections
import math
import time

import luna_msgs.msg as lm
from geometry_msgs.msg import AccelWithCovarianceStamped
from nav_msgs.msg import Odometry

from luna_core.ego_history import EgoHistory
from luna_core.planning.cycle import inputs_missing
from luna_core.scene import SceneConfig, SceneInputError
from luna_core.stack import SceneDescriber
from luna_core.types import LaneGraph, Route, TrackedObjects, TrafficLights
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

from luna_msgs_py import convert, qos
from luna_nodes.base import ERROR, FIRST_ODOMETRY_WAIT, MAX_TRACKED_OBJECTS, WARN, LunaNode, run
from luna_nodes.params import VEHICLE_PARAMS, NodeInterface, ParamSpec, vehicle_parameters

RECENT_KEPT = 20  # inputs of each kind kept to build the scene of an instant (2 s at 10 Hz)
RECENT_EGO = 2.0  # s of odometry kept, for the same reason

INTERFACE = NodeInterface(
    name="scene_descriptor",
    summary="Builds the scene descriptor xi_t (LUNA-AD Eq. 4, Table I) from odometry, tracked objects, "
            "traffic lights, the route and the lane graph, and publishes it at a fixed rate.",
    inputs=[("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 50"),
            ("localization/acceleration", "geometry_msgs/AccelWithCovarianceStamped", "reliable, keep last 50; "
             "ego_acceleration (optional: without it, the speed's smoothed finite difference)"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5"),
            ("perception/traffic_lights", "luna_msgs/TrafficLightStateArray", "reliable, keep last 5"),
            ("planning/route", "luna_msgs/Route", "reliable, transient local; a new route after an earlier one "
             "starts a new mission (the first route the node hears does not: what it did before it "
             "arrived is this mission's): "
             "recent_decisions start empty"),
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
        ParamSpec("input_sync_timeout", float, 0.2, "Under sim time, how long (wall) a scene waits for the "
                  "odometry, objects and lights of its own instant.", "s", min=0.0, runtime=True),
        MAX_TRACKED_OBJECTS,
        *VEHICLE_PARAMS,
    ],
)


class SceneDescriptorNode(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        self.describer = SceneDescriber(scene_config(self.params))
        self.vehicle = vehicle_parameters(self.params)
        self.ego = EgoHistory(RECENT_EGO)  # odometry paired with its acceleration (the planner's rule)
        self.objects: TrackedObjects | None = None
        self.lights: TrafficLights | None = None
        self.route: Route | None = None
        self.graph: LaneGraph | None = None
        # Under sim time the scene of an instant is built from the inputs of that instant (see above).
        self.recent: dict[str, collections.deque] = {k: collections.deque(maxlen=RECENT_KEPT)
                                                     for k in ("objects", "lights")}
        self.publisher = self.luna_publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        # Odometry has a group of its own: a huge objects message must not hold it up (issue 17).
        self.luna_subscription(Odometry, "localization/kinematic_state", self.on_odometry, qos.STATE,
                               callback_group=MutuallyExclusiveCallbackGroup())
        acceleration = self.luna_subscription(AccelWithCovarianceStamped, "localization/acceleration",
                                              self.on_acceleration, qos.STATE)
        self.reports = ((self.ego.accelerations, acceleration),)  # waited for under lock step (await_instant)
        self.luna_subscription(lm.TrackedObjects, "perception/objects", self.on_objects, qos.SENSOR)
        self.luna_subscription(lm.TrafficLightStateArray, "perception/traffic_lights", self.on_lights, qos.SENSOR)
        self.luna_subscription(lm.Route, "planning/route", self.on_route, qos.LATCHED)
        self.luna_subscription(lm.LaneGraph, "map/lane_graph", self.on_lane_graph, qos.LATCHED)
        self.luna_subscription(lm.DecisionDistribution, "luna/decision", self.on_decision, qos.RELIABLE)
        self.timer = self.create_periodic(1.0 / self.params["rate"], self.tick)

    def apply_parameters(self, params: dict) -> None:
        self.describer.config = scene_config(params)

    # -- inputs -------------------------------------------------------------------------------------

    def on_odometry(self, msg: Odometry) -> None:
        self.ego.add_state(convert.odometry_to_ego(msg))  # EgoHistoryError -> rejected, diagnosed

    def on_acceleration(self, msg: AccelWithCovarianceStamped) -> None:
        self.ego.add_acceleration(convert.from_time(msg.header.stamp), float(msg.accel.accel.linear.x))

    def on_objects(self, msg: lm.TrackedObjects) -> None:
        ego = self.ego.latest
        self.objects = self.usable_objects_of(msg, (ego.x, ego.y) if ego is not None else None)
        self.recent["objects"].append(self.objects)

    def on_lights(self, msg: lm.TrafficLightStateArray) -> None:
        self.lights = convert.msg_to_lights(msg)
        self.recent["lights"].append(self.lights)

    def on_route(self, msg: lm.Route) -> None:
        route = convert.msg_to_route(msg)
        if route.starts_mission(self.route):  # the last mission's decisions are not this one's "recent" ones
            self.describer.reset()
        self.route = route

    def on_lane_graph(self, msg: lm.LaneGraph) -> None:
        self.graph = convert.msg_to_lane_graph(msg)
        self.diagnostics.set_value("lanes", len(self.graph.lanes))

    def on_decision(self, msg: lm.DecisionDistribution) -> None:
        self.describer.on_decision(convert.msg_to_decision(msg))

    # -- output -------------------------------------------------------------------------------------

    def missing_inputs(self) -> list[str]:
        return [name for name, value in (("odometry", self.ego.latest), ("route", self.route),
                                         ("lane graph", self.graph)) if value is None]

    def _fresh_odometry_of(self, now: float) -> bool:
        ego = self.ego.at_or_before(now)
        return ego is not None and now - ego.stamp <= self.params["max_input_age"]

    def _clock_past(self, now: float) -> bool:
        return self.get_clock().now().nanoseconds * 1e-9 > now + 1e-6

    def _at(self, kind: str, now: float, latest):
        """The latest input of ``kind`` stamped at or before ``now`` (the latest one if all are newer)."""
        past = [m for m in list(self.recent[kind]) if m.stamp <= now + 1e-6]
        return past[-1] if past else latest

    def tick(self) -> None:
        now = self.now_s()
        ego, objects, lights = self.ego.latest, self.objects, self.lights
        if self.sim_time():
            if ego is None:  # the first instant of a lock-step run: its odometry may still be on the way
                self.wait_until(lambda: self.ego.latest is not None, FIRST_ODOMETRY_WAIT)
            def missing() -> list[str]:
                return inputs_missing(self.ego, now, self.graph, self.route, self.objects, self.lights)
            if not self.await_instant(now, missing, self.params["input_sync_timeout"], self.reports):
                # Without fresh odometry the instant gets no scene at all. A lock-step driver (luna replay,
                # a simulator) holds its clock at the instant until the stack answers, so odometry that is
                # merely late (a starved node) will come: wait for it while the clock stands here; once the
                # clock moves on, the instant is over. The bound only keeps a dead driver from hanging it.
                self.wait_until(lambda: self._fresh_odometry_of(now) or self._clock_past(now), FIRST_ODOMETRY_WAIT)
            ego, objects, lights = (self.ego.at_or_before(now), self._at("objects", now, self.objects),
                                    self._at("lights", now, self.lights))
        missing = self.missing_inputs()
        if missing:
            self.diagnostics.set_condition("inputs", WARN, f"waiting for {', '.join(missing)}")
            return
        age = now - ego.stamp
        if age > self.params["max_input_age"]:
            self.diagnostics.set_condition("inputs", WARN, f"odometry is stale ({age:.2f} s old)")
            return
        self.diagnostics.clear("inputs")
        start = time.perf_counter()
        try:
            scene = self.describer.describe(ego, objects, lights, self.route, self.graph, self.vehicle)
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
