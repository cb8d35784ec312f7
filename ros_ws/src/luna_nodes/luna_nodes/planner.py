"""planner (managed): replans on a timer from the latest inputs and decision -> planning/trajectory.

The planning algorithm is luna_core's (``make_planner``): the decision-guided Diffusion-ES planner by
default, or a baseline. This node only gathers inputs and publishes; the degraded modes are luna_core's
(``luna_core.planning.cycle.plan_cycle``), the ego history with its acceleration too
(``luna_core.ego_history``, shared with the scene descriptor):

* decision older than ``decision_timeout`` (default 2 T_d) or invalid: plan without the decision term
  (the decision contract of ``luna_core.decision``: validated in ``convert``, followed and aged by the
  planner's ``DecisionTracker`` with this node's ``DecisionTiming``);
* objects with unknown fields: ``usable_objects`` (an unknown size gets the class's default footprint, an
  object without a usable position is left out, at most ``max_tracked_objects`` nearest the ego), diagnosed;
* no lane graph or route yet, an empty lane graph, or stale odometry: a comfortable stop;
* nothing feasible: the planner's least-bad trajectory, or its emergency brake (counted per mode in
  ``/diagnostics``: ``mode_<mode>`` values, ``decision_flips`` and ``safety_gated``);
* planner exception or non-finite output: a comfortable stop along the route (or straight ahead);
* a planning cycle longer than the replan period counts as a missed deadline.

Under ``use_sim_time`` the cycle at sim time t waits (briefly, ``input_sync_timeout`` of wall time)
for the inputs stamped t (odometry, acceleration, objects, lights; each one once it has been heard),
so a lock-step bridge gets the same result as an in-process run. Before the first odometry it waits
longer (``FIRST_ODOMETRY_WAIT``): a lock-step bridge holds the clock until it gets a trajectory, so a
first cycle that gave up early would leave the node idle until the bridge times out.
"""

from __future__ import annotations

import json
import threading
import time

import luna_msgs.msg as lm
from geometry_msgs.msg import AccelWithCovarianceStamped
from nav_msgs.msg import Odometry
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import TransitionCallbackReturn
from visualization_msgs.msg import MarkerArray

from luna_core.decision import DEFAULT_DECISION_PERIOD, DEFAULT_GAMMA_P, DecisionTiming, DecisionTimingError
from luna_core.ego_history import EgoHistory
from luna_core.planning.factory import PlannerConfigError, make_planner, planner_names
from luna_core.planning.cycle import ERROR as CYCLE_ERROR
from luna_core.planning.cycle import CycleInputs, CyclePolicy, instant_missing, plan_cycle
from luna_core.types import DecisionDistribution, LaneGraph, Route, TrackedObjects, TrafficLights
from luna_msgs_py import convert, qos
from luna_nodes import markers
from luna_nodes.base import ERROR, FIRST_ODOMETRY_WAIT, MAX_TRACKED_OBJECTS, WARN, LunaLifecycleNode, run
from luna_nodes.params import VEHICLE_PARAMS, NodeInterface, ParamSpec, parameters_from_args, vehicle_parameters

INTERFACE = NodeInterface(
    name="planner",
    summary="Decision-guided motion planner (LUNA-AD Sec. III-D): Diffusion-ES per candidate action, "
            "selection by Eq. 22; replans on a timer and always publishes a valid trajectory.",
    inputs=[("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 50 (2 s history kept)"),
            ("localization/acceleration", "geometry_msgs/AccelWithCovarianceStamped", "reliable, keep last 50; "
             "optional"),
            ("vehicle/status/steering_status", "luna_msgs/SteeringReport", "reliable, keep last 50; optional "
             "(without it the steering angle is estimated from the yaw rate)"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5"),
            ("perception/traffic_lights", "luna_msgs/TrafficLightStateArray", "reliable, keep last 5"),
            ("map/lane_graph", "luna_msgs/LaneGraph", "reliable, transient local"),
            ("planning/route", "luna_msgs/Route", "reliable, transient local; a new route after an earlier one "
             "starts a new mission (the first route the node hears does not: what it did before it "
             "arrived is this mission's): the "
             "next cycle resets the planner (no warm start or decision in force from the last one)"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10")],
    outputs=[("planning/trajectory", "luna_msgs/Trajectory", "reliable, keep last 10"),
             ("planning/debug/candidates", "visualization_msgs/MarkerArray", "reliable, keep last 10")],
    params=[
        ParamSpec("autostart", bool, True, "Configure and activate on start (no lifecycle manager needed)."),
        ParamSpec("planner", str, "luna", "Planning algorithm.", choices=planner_names()),
        ParamSpec("replan_period", float, 0.5, "Planning cycle.", "s", min=0.02, max=10.0),
        ParamSpec("time_budget", float, 0.4, "Search budget per cycle; the best trajectory found so far is "
                  "published when it runs out.", "s", min=0.01),
        ParamSpec("deterministic", str, "auto", "Search without the wall-clock time_budget, every stage at its "
                  "full size (luna, diffusion-es): the same inputs give the same trajectory however loaded the "
                  "machine. auto = on under use_sim_time (lock step, replay on bag time), off on wall time.",
                  choices=("auto", "on", "off")),
        ParamSpec("decision_timeout", float, 0.0, "A decision older than this is ignored: fallback objective "
                  "without the decision term. 0 = 2 decision_period (2 T_d).", "s", min=0.0, runtime=True),
        ParamSpec("history_duration", float, 2.0, "Ego history passed to the planner.", "s", min=0.0, max=10.0,
                  runtime=True),
        ParamSpec("input_sync_timeout", float, 0.2, "Under sim time, how long (wall) a cycle waits for the "
                  "odometry (and at decision instants the decision) of its own instant.", "s", min=0.0,
                  runtime=True),
        ParamSpec("decision_period", float, DEFAULT_DECISION_PERIOD, "T_d of the decision node (common.param.yaml),"
                  " for the lock-step wait and the default decision_timeout; 0 = never wait for decisions "
                  "(decision_timeout must then be set).", "s", min=0.0, runtime=True),
        ParamSpec("max_input_age", float, 1.0, "Odometry older than this: publish a stop and report.", "s",
                  min=0.01, runtime=True),
        MAX_TRACKED_OBJECTS,
        ParamSpec("population", int, 128, "Diffusion-ES population (luna, diffusion-es).", min=4, max=4096),
        ParamSpec("gamma_p", float, DEFAULT_GAMMA_P, "Candidate-set threshold of Eq. 19 (common.param.yaml); "
                  "used only for a decision published without its candidate set.", min=0.0, max=1.0),
        ParamSpec("safety_first", bool, True, "Eq. 22 safety first (luna): a* among the candidate actions whose best "
                  "trajectory keeps the time-to-collision bound, when any does; false = the paper's Eq. 22 over all."),
        ParamSpec("blocked_lateral_to_keep", bool, True, "A candidate lane change the map does not allow here "
                  "gives its probability to keeping the lane at its speed (CL -> CK; luna); false = it is dropped."),
        ParamSpec("diffusion_model", str, "", "Folder of the diffusion prior; empty = the bundled default."),
        ParamSpec("device", str, "cpu", "Torch device of the diffusion denoiser (luna, diffusion-es); auto = CUDA "
                  "when present. The search's noise is drawn on the CPU, so devices differ only by rounding.",
                  choices=("auto", "cpu", "cuda")),
        ParamSpec("autocast", str, "none", "The denoiser's matrix products in this dtype (torch autocast; luna, "
                  "diffusion-es): bfloat16 makes a cycle ~1.6-1.9x faster on a CPU with AVX512-BF16 or AMX, but changes the "
                  "samples (not evaluated in closed loop yet: docs/benchmarks.md).", choices=("none", "bfloat16")),
        *VEHICLE_PARAMS,
    ],
)


class PlannerNode(LunaLifecycleNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        self.lock = threading.Lock()
        self.new_mission = threading.Event()  # a route of a new mission came (Route.starts_mission)
        # Odometry paired with the reported acceleration and steering angle by stamp (luna_core.ego_history,
        # as the scene descriptor does): the planner and the student see the same ego_acceleration, and
        # the tracker starts from the wheels' measured angle.
        self.ego = EgoHistory(self.params["history_duration"])
        self.objects: TrackedObjects | None = None
        self.lights: TrafficLights | None = None
        self.graph: LaneGraph | None = None
        self.route: Route | None = None
        self.decision: DecisionDistribution | None = None
        self.planner = None
        self.timer = None
        self.trajectory_pub = None
        self.markers_pub = None
        inputs = MutuallyExclusiveCallbackGroup()  # inputs keep flowing while a cycle runs
        sub = lambda t, topic, cb, q: self.luna_subscription(t, topic, cb, q, callback_group=inputs)  # noqa: E731
        # Odometry has a group of its own: a huge objects message must not hold it up (issue 17).
        self.luna_subscription(Odometry, "localization/kinematic_state", self.on_odometry, qos.STATE,
                               callback_group=MutuallyExclusiveCallbackGroup())
        # Waited for under lock step from their first report on once they have a publisher (await_instant).
        self.reports = ((self.ego.accelerations,
                         sub(AccelWithCovarianceStamped, "localization/acceleration", self.on_acceleration, qos.STATE)),
                        (self.ego.steering_angles,
                         sub(lm.SteeringReport, "vehicle/status/steering_status", self.on_steering, qos.STATE)))
        sub(lm.TrackedObjects, "perception/objects", self.on_objects, qos.SENSOR)
        sub(lm.TrafficLightStateArray, "perception/traffic_lights", self.on_lights, qos.SENSOR)
        sub(lm.LaneGraph, "map/lane_graph", self.on_lane_graph, qos.LATCHED)
        sub(lm.Route, "planning/route", self.on_route, qos.LATCHED)
        sub(lm.DecisionDistribution, "luna/decision", self.on_decision, qos.RELIABLE)
        self.cycle_group = MutuallyExclusiveCallbackGroup()

    # -- lifecycle ----------------------------------------------------------------------------------

    def on_configure(self, state) -> TransitionCallbackReturn:
        p = self.params
        try:
            timing = decision_timing(p)
        except DecisionTimingError as exc:
            self.diagnostics.set_condition("planner", ERROR, str(exc))
            return TransitionCallbackReturn.FAILURE
        options = planner_options(p, timing, self.deterministic())
        preloaded = _PRELOADED.pop(_preload_key(p["planner"], options), None)
        try:
            self.planner = preloaded or make_planner(p["planner"], options)
        except (PlannerConfigError, OSError, ValueError) as exc:
            self.diagnostics.set_condition("planner", ERROR, f"cannot build planner '{p['planner']}': {exc}")
            return TransitionCallbackReturn.FAILURE
        self.trajectory_pub = self.luna_publisher(lm.Trajectory, "planning/trajectory", qos.RELIABLE, lifecycle=True)
        self.markers_pub = self.luna_publisher(MarkerArray, "planning/debug/candidates", qos.RELIABLE,
                                               lifecycle=True)
        self.diagnostics.set_value("missed_deadlines", 0)
        self.get_logger().info(f"configured planner '{p['planner']}'"
                               + (" (deterministic search)" if options.get("deterministic") else "")
                               + (", preloaded by the standby" if preloaded is not None else ""))
        return TransitionCallbackReturn.SUCCESS

    def deterministic(self) -> bool:
        """Whether the search ignores the wall clock: on sim time a lock-step simulator or a replay waits
        for every cycle anyway, and a budget cut would make the result depend on the machine's load."""
        return deterministic_search(self.params["deterministic"], self.sim_time())

    def apply_parameters(self, params: dict) -> None:
        with self.lock:
            self.ego.duration = params["history_duration"]
        timing = decision_timing(params)  # DecisionTimingError (a ValueError) refuses the change
        tracker = getattr(self.planner, "decisions", None)
        if tracker is not None:  # the planner ages decisions with the node's timing
            tracker.timing = timing

    def on_activate(self, state) -> TransitionCallbackReturn:
        self.timer = self.create_periodic(self.params["replan_period"], self.cycle, self.cycle_group)
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        if self.timer is not None:
            self.destroy_timer(self.timer)
            self.timer = None
        return super().on_deactivate(state)

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self.planner = None
        return TransitionCallbackReturn.SUCCESS

    # -- inputs -------------------------------------------------------------------------------------

    def on_odometry(self, msg: Odometry) -> None:
        with self.lock:  # EgoHistoryError (a ValueError) -> rejected, diagnosed
            self.ego.add_state(convert.odometry_to_ego(msg))

    def on_acceleration(self, msg: AccelWithCovarianceStamped) -> None:
        with self.lock:
            self.ego.add_acceleration(convert.from_time(msg.header.stamp), float(msg.accel.accel.linear.x))

    def on_steering(self, msg: lm.SteeringReport) -> None:
        with self.lock:
            self.ego.add_steering_angle(*convert.msg_to_steering(msg))

    def on_objects(self, msg: lm.TrackedObjects) -> None:
        with self.lock:
            ego = self.ego.latest
        self.objects = self.usable_objects_of(msg, (ego.x, ego.y) if ego is not None else None)

    def on_lights(self, msg: lm.TrafficLightStateArray) -> None:
        self.lights = convert.msg_to_lights(msg)

    def on_lane_graph(self, msg: lm.LaneGraph) -> None:
        self.graph = convert.msg_to_lane_graph(msg)

    def on_route(self, msg: lm.Route) -> None:
        route = convert.msg_to_route(msg)
        if route.starts_mission(self.route):
            self.new_mission.set()  # the next cycle resets the planner (a cycle may be running now)
        self.route = route

    def on_decision(self, msg: lm.DecisionDistribution) -> None:
        self.decision = convert.msg_to_decision(msg)  # raises (-> rejected, diagnosed) if invalid

    # -- the planning cycle -------------------------------------------------------------------------

    def inputs_at(self, now: float) -> CycleInputs:
        with self.lock:
            history = list(self.ego.states)
        return CycleInputs(now, history, self.objects, self.lights, self.graph, self.route, self.decision)

    def policy(self) -> CyclePolicy:
        p = self.params
        return CyclePolicy(p["max_input_age"], decision_timing(p), follows_decisions=p["planner"] == "luna",
                           vehicle=vehicle_parameters(p))

    def cycle(self) -> None:
        if self.planner is None or self.trajectory_pub is None:
            return
        if self.new_mission.is_set():  # no warm start or decision in force from the last mission
            self.new_mission.clear()
            self.planner.reset()
        started = time.perf_counter()
        now = self.now_s()
        if self.sim_time():
            # Lock step: the odometry, acceleration, objects, lights (and, at a decision instant, the
            # decision) of this very instant.
            if self.ego.latest is None:  # nothing could be published: worth waiting for (a loaded start-up)
                self.wait_until(lambda: self.ego.latest is not None, FIRST_ODOMETRY_WAIT)
            self.await_instant(now, lambda: instant_missing(self.ego, self.inputs_at(now), self.policy()),
                               self.params["input_sync_timeout"], self.reports)
        # The degraded modes are luna_core's (planning.cycle); this node maps the outcome to its topics.
        out = plan_cycle(self.planner, self.inputs_at(now), self.policy())
        for key, condition in out.conditions.items():
            if condition is None:
                self.diagnostics.clear(key)
            else:
                self.diagnostics.set_condition(key, ERROR if condition.severity == CYCLE_ERROR else WARN,
                                               condition.message)
        for counter in out.counts:
            self.diagnostics.increment(counter)
        if out.trajectory is None:
            return
        self.trajectory_pub.publish(convert.trajectory_to_msg(out.trajectory))
        # Markers show this cycle's candidates, none when the planner was bypassed.
        self.markers_pub.publish(markers.candidate_markers(self.planner if out.planned else None,
                                                           convert.to_time(now)))
        elapsed = time.perf_counter() - started
        self.diagnostics.set_value("cycle_time_s", elapsed)
        self.diagnostics.increment("cycles")
        if elapsed > self.params["replan_period"]:
            self.diagnostics.increment("missed_deadlines")


def decision_timing(params: dict) -> DecisionTiming:
    """T_d and the decision timeout of the node's parameters (0 = 2 T_d)."""
    return DecisionTiming(params["decision_period"], params["decision_timeout"])


def deterministic_search(mode: str, sim_time: bool) -> bool:
    return mode == "on" or (mode == "auto" and sim_time)


def planner_options(p: dict, timing: DecisionTiming, deterministic: bool) -> dict:
    """``make_planner``'s options from the node's parameters."""
    if p["planner"] not in ("luna", "diffusion-es"):
        return {}
    options = {"population": p["population"], "gamma_p": p["gamma_p"], "time_budget": p["time_budget"],
               "deterministic": deterministic, "decision_period": timing.period, "decision_timeout": timing.timeout,
               "device": p["device"], "autocast": p["autocast"], "safety_first": p["safety_first"],
               "blocked_lateral_to_keep": p["blocked_lateral_to_keep"]}
    if p["diffusion_model"]:
        options["model_path"] = p["diffusion_model"]
    return options


#: Planners a standby built before its node existed, by ``_preload_key``; configure takes the one that
#: matches its parameters (a standby promoted after a parameter file changed builds anew).
_PRELOADED: dict[str, object] = {}


def _preload_key(name: str, options: dict) -> str:
    return json.dumps([name, options], sort_keys=True)


def preload(argv) -> None:
    """A standby's preload: the planner of the node's parameters on ``argv`` (the diffusion prior read,
    one search run so that torch's first-call set-up is paid before the promotion)."""
    p = parameters_from_args(argv, "planner", INTERFACE.params)
    options = planner_options(p, decision_timing(p), deterministic_search(p["deterministic"], p["use_sim_time"]))
    planner = make_planner(p["planner"], options)
    if getattr(planner, "prior", None) is not None:  # luna, diffusion-es
        planner.prior.warm_up()
    _PRELOADED[_preload_key(p["planner"], options)] = planner


def main(args=None) -> int:
    return run([PlannerNode], args, preload=preload)


if __name__ == "__main__":
    raise SystemExit(main())
