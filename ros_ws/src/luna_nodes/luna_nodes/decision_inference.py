"""decision_inference (managed): the heuristic system on the vehicle.

It loads the student and the memory bank in ``configure`` and every T_d turns the latest scene
descriptor into a decision distribution (one forward pass, K retrieved items), published with the
candidate set, the query, the retrieved ids and the latency. It reloads the memory index in the
background when ``luna/memory/version`` (or the bank on disk) changes, without pausing decisions
(unless ``memory_reload`` is false, as in ``luna demo``: a lock-step run must not depend on when a
reflection lands). The ``decision_stack`` executable runs it with the explainer on one model instance.

Model calls never run in a ROS callback: callbacks hand work to a single worker thread.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

import luna_msgs.msg as lm
from rclpy.lifecycle import TransitionCallbackReturn
from std_msgs.msg import UInt64

from luna_core.ego_history import heard_at, unheard
from luna_core.heuristic import HeuristicSystem, check_scene
from luna_core.types import DecisionDistribution, Route
from luna_msgs_py import convert, qos
from luna_nodes.base import ERROR, WARN, LunaLifecycleNode, run
from luna_nodes.params import NodeInterface, ParamSpec, parameters_from_args
from luna_nodes.shared_model import MODEL_PARAMS, SharedHeuristic

SCENES_KEPT = 20  # recent scenes kept to pick the one of a decision instant (2 s at the default 10 Hz)
FIRST_SCENE_WAIT = 10.0  # s of wall time a sim-time cycle waits for the very first scene

DECISION_INTERFACE = NodeInterface(
    name="decision_inference",
    summary="Every T_d predicts the decision distribution pi_hat (LUNA-AD Eq. 16) for the latest scene "
            "descriptor with one forward pass of the student and K retrieved memory items.",
    inputs=[("luna/scene", "luna_msgs/SceneDescriptor", "reliable, keep last 10"),
            ("luna/memory/version", "std_msgs/UInt64", "reliable, transient local"),
            ("planning/route", "luna_msgs/Route", "reliable, transient local; a new route after an earlier one "
             "starts a new mission (the first route the node hears does not: what it did before it "
             "arrived is this mission's): "
             "the next decision retrieves the exact top K (no items kept from the last mission's decision)")],
    outputs=[("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10")],
    params=[ParamSpec("autostart", bool, True, "Configure and activate on start."),
            ParamSpec("decision_period", float, 2.0, "T_d.", "s", min=0.05, max=10.0),
            ParamSpec("max_scene_age", float, 1.0, "Older scenes are not decided on.", "s", min=0.01,
                      runtime=True),
            ParamSpec("input_sync_timeout", float, 0.2, "Under sim time, how long (wall) a cycle waits for "
                      "the scene of its own instant.", "s", min=0.0, runtime=True),
            ParamSpec("memory_poll_period", float, 2.0, "How often the bank on disk is checked for new items "
                      "(besides luna/memory/version).", "s", min=0.1),
            ParamSpec("memory_reload", bool, True, "Load reflection items appended while running; false = decide "
                      "on the bank as it was at configure, so a lock-step run (luna demo) does not depend on "
                      "when a reflection lands (they apply from the next start)."),
            *MODEL_PARAMS],
)


class DecisionInference(LunaLifecycleNode):
    def __init__(self, shared: SharedHeuristic | None = None) -> None:
        super().__init__(DECISION_INTERFACE)
        self.shared = shared or SharedHeuristic()
        self.heuristic: HeuristicSystem | None = None
        self.scenes: collections.deque = collections.deque(maxlen=SCENES_KEPT)  # the latest, oldest first
        self.scene_lock = threading.Lock()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="decide")
        self.memory_worker = ThreadPoolExecutor(1, thread_name_prefix="memory")
        self.cycle_lock = threading.Lock()
        self.busy = False  # a decision is running (under cycle_lock)
        self.deferred: float | None = None  # sim time: the latest instant that came due while busy
        # Sim time: an instant that found no usable scene (none, or all older than max_scene_age) waits for
        # one (under cycle_lock) until a newer instant comes due. In lock step its scene may still be on
        # the way however long it takes (a starved scene node), and bag time stands still until it is
        # decided: giving the instant up after input_sync_timeout lost it for good.
        self.pending: float | None = None
        self.closing = threading.Event()
        self.publisher = None
        self.cycle_timers = []
        self.luna_subscription(lm.SceneDescriptor, "luna/scene", self.on_scene, qos.RELIABLE)
        self.luna_subscription(UInt64, "luna/memory/version", self.on_memory_version, qos.LATCHED)
        self.route: Route | None = None
        self.new_mission = threading.Event()  # consumed by the next decision (one may be running now)
        self.luna_subscription(lm.Route, "planning/route", self.on_route, qos.LATCHED)

    def on_configure(self, state) -> TransitionCallbackReturn:
        try:
            self.heuristic = self.shared.get(self.params)
        except Exception:  # noqa: BLE001 - missing/corrupt model or bank: stay up, diagnosed
            self.diagnostics.set_condition("model", ERROR, self.shared.error)
            return TransitionCallbackReturn.FAILURE
        self.diagnostics.clear("model")
        if self.shared.from_standby:
            self.get_logger().info("configured on the model the standby preloaded")
        self.diagnostics.set_value("memory_version", self.heuristic.memory_version)
        self.publisher = self.luna_publisher(lm.DecisionDistribution, "luna/decision", qos.RELIABLE, lifecycle=True)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        self.cycle_timers = [self.create_periodic(self.params["decision_period"], self.tick)]
        if self.params["memory_reload"]:
            self.cycle_timers.append(self.create_timer(self.params["memory_poll_period"], self.poll_memory))
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        for timer in self.cycle_timers:
            self.destroy_timer(timer)
        self.cycle_timers = []
        return super().on_deactivate(state)

    def on_scene(self, msg: lm.SceneDescriptor) -> None:
        scene = convert.msg_to_scene(msg)
        check_scene(scene)  # a bad scene is rejected here (diagnosed); the last good one stays
        with self.scene_lock:
            self.scenes.append(scene)
        # After the append: _decide's ending checks the scenes and sets `pending` under cycle_lock, so a
        # scene that lands while it ends is seen by one of the two.
        with self.cycle_lock:
            instant = self.pending
            if instant is None or self.busy or self.closing.is_set() or self.usable_scene(instant) is None:
                return
            self.pending, self.busy = None, True
        self.worker.submit(self._decide, instant)

    def on_route(self, msg: lm.Route) -> None:
        route = convert.msg_to_route(msg)
        if route.starts_mission(self.route):
            self.new_mission.set()
        self.route = route

    def on_memory_version(self, msg: UInt64) -> None:
        if self.params["memory_reload"] and self.heuristic is not None and msg.data > self.heuristic.memory_version:
            self.memory_worker.submit(self._reload_memory)

    def poll_memory(self) -> None:
        self.memory_worker.submit(self._reload_memory)

    def _reload_memory(self) -> None:
        try:
            if self.heuristic is not None and self.heuristic.refresh_memory():
                self.diagnostics.set_value("memory_version", self.heuristic.memory_version)
                self.get_logger().info(f"memory bank reloaded: version {self.heuristic.memory_version}")
            self.diagnostics.clear("memory")  # the bank reads again: an earlier reload failure is over
        except Exception as exc:  # noqa: BLE001 - a broken bank must not stop decisions on the old index
            self.diagnostics.set_condition("memory", WARN, f"reload failed, deciding on the loaded items: {exc}")

    def tick(self) -> None:
        if self.heuristic is None or self.publisher is None:
            return
        now = self.now_s()
        with self.cycle_lock:
            self.pending = None  # a newer instant is due: the older one waiting for a scene is over
            if self.busy and self.sim_time():
                # Simulated time is only worth its instants: the latest one waiting is decided next (its
                # own scene, its own stamp), so a lock-step replay or simulator misses none.
                self.deferred = now
                self.diagnostics.increment("deferred_cycles")
                return
            if self.busy:
                self.diagnostics.increment("skipped_cycles_busy")
                self.diagnostics.set_condition("latency", WARN, "the previous decision is still running: cycle "
                                                                "skipped")
                return
            self.busy = True
        self.worker.submit(self._decide, now)

    def _decide(self, now: float) -> None:
        awaits_scene = False  # sim time: no usable scene for this instant yet (see `pending`)
        try:
            if self.sim_time():
                if not self.scenes:  # worth waiting for (lock step: the first instant of a replay)
                    self.wait_until(lambda: bool(self.scenes), FIRST_SCENE_WAIT)
                self.await_instant(now, lambda: self._missing_scene_of(now),
                                   self.params["input_sync_timeout"])
            scene = self.usable_scene(now)
            if scene is None:
                awaits_scene = self.sim_time()
                latest = self.scene_for(now)
                why = "waiting for luna/scene" if latest is None else f"scene is stale ({now - latest.stamp:.2f} s old)"
                self.diagnostics.set_condition("inputs", WARN, why + (": the instant is decided when one comes"
                                                                      if awaits_scene else ""))
                return
            self.diagnostics.clear("inputs")
            if self.new_mission.is_set():
                self.new_mission.clear()
                self.heuristic.reset()
            try:
                decision = self.heuristic.decide(scene)
            except Exception as exc:  # noqa: BLE001 - a bad scene or a model error: no decision this cycle
                self.diagnostics.set_condition("decision", ERROR, f"decision failed: {exc}")
                self.diagnostics.increment("failed_decisions")
                return
            self.diagnostics.clear("decision")
            self._diagnose_prompt(decision)
            if self.closing.is_set():
                return
            decision.stamp = max(now, scene.stamp)  # never older than the scene it was computed from
            self.publisher.publish(convert.decision_to_msg(decision))
            self.diagnostics.set_value("latency_s", decision.latency)
            self.diagnostics.set_value("top_action", decision.top_action)
            self.diagnostics.increment("decisions")
            if decision.latency <= self.params["decision_period"]:
                self.diagnostics.clear("latency")
        finally:
            with self.cycle_lock:
                following, self.deferred = self.deferred, None
                if following is None and awaits_scene:
                    if self.usable_scene(now) is not None:
                        following = now  # it landed while this cycle ended: decide the instant now
                    else:
                        self.pending = now
                        self.diagnostics.increment("instants_awaiting_scene")
                self.busy = following is not None and not self.closing.is_set()
            if self.busy:
                self.worker.submit(self._decide, following)

    def _missing_scene_of(self, now: float) -> list[str]:
        """The scene of instant ``now``, named with the latest one's stamp, while it is not in (lock step)."""
        latest = self.scenes[-1].stamp if self.scenes else None
        return [] if latest is not None and heard_at(latest, now) else [unheard("luna/scene", latest)]

    def scene_for(self, now: float):
        """The scene to decide on at ``now``: the latest; under sim time the latest one not after ``now``
        (a replay or simulator may already have moved on: the decision is the instant's, as in lock step)."""
        with self.scene_lock:
            scenes = list(self.scenes)
        if not scenes:
            return None
        if self.sim_time():
            past = [s for s in scenes if s.stamp <= now + 1e-6]
            return past[-1] if past else scenes[0]
        return scenes[-1]

    def usable_scene(self, now: float):
        """The scene to decide on at ``now`` if it is recent enough (``max_scene_age``), else None."""
        scene = self.scene_for(now)
        return scene if scene is not None and now - scene.stamp <= self.params["max_scene_age"] else None

    def _diagnose_prompt(self, decision: DecisionDistribution) -> None:
        if decision.examples_dropped or decision.objects_dropped:
            self.diagnostics.increment("shortened_prompts")
            self.diagnostics.set_condition(
                "prompt", WARN, f"prompt longer than the context window: left out {decision.examples_dropped} "
                                f"retrieved example(s) and the {decision.objects_dropped} farthest object(s)")
        else:
            self.diagnostics.clear("prompt")

    def close(self) -> None:
        # Queued work is dropped; a forward pass in flight finishes (seconds) without publishing.
        self.closing.set()
        self.worker.shutdown(wait=True, cancel_futures=True)
        self.memory_worker.shutdown(wait=True, cancel_futures=True)


def preload_model(shared: SharedHeuristic, argv) -> None:
    """A standby's preload: the model of decision_inference's parameters on ``argv``."""
    shared.preload(parameters_from_args(argv, "decision_inference", DECISION_INTERFACE.params))


def main(args=None) -> int:
    """decision_inference alone, with its own model instance."""
    shared = SharedHeuristic()
    return run([lambda: DecisionInference(shared)], args, preload=lambda argv: preload_model(shared, argv))


if __name__ == "__main__":
    raise SystemExit(main())
