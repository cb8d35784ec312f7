"""reflection_client: failure + explanation + hindsight -> grounded revision -> memory bank (LUNA-AD Eq. 29).

Pairs each ``luna/explanation`` with its ``luna/failure`` (in either arrival order: DDS does not order
messages across topics). It also buffers what the stack perceived (odometry, tracked objects, traffic
lights, scenes, the lane graph and the route: ``luna_core.hindsight.HindsightRecorder``), waits until
the horizon after the failed decision has been observed, then puts the request with its hindsight
observation in a durable outbox (acknowledged = survives a restart). A worker thread runs the
hindsight check (each alternative of the failed decision rolled out against what happened, with the
teacher's machinery) and, when a revision is due, writes the grounded revision, or the one an
OpenAI-compatible reflection LLM writes if it agrees with the check. New reflection items make
``luna/memory/version`` tell ``decision_inference`` to reload. While the endpoint is unreachable,
requests wait in the outbox and are retried with backoff; the stack keeps driving.
"""

from __future__ import annotations

import collections
import threading

import luna_msgs.msg as lm
from nav_msgs.msg import Odometry
from std_msgs.msg import UInt64

from luna_core.assets import data_dir, live_memory_bank
from luna_core.hindsight import HindsightError, HindsightRecorder
from luna_core.reflection import Outbox, ReflectionConfig, ReflectionRequest, ReflectionSystem
from luna_core.stack import LLMClientConfig, build_llm_client
from luna_core.types import DecisionDistribution, DecisionExplanation, FailureEvent
from luna_msgs_py import convert, qos
from luna_nodes.base import ERROR, WARN, LunaNode, run
from luna_nodes.params import VEHICLE_PARAMS, NodeInterface, ParamSpec, vehicle_parameters

INTERFACE = NodeInterface(
    name="reflection_client",
    summary="Reflects on failures (LUNA-AD Eq. 29) grounded in hindsight: the alternatives of the failed "
            "decision are rolled out against what was perceived after it, and only a revision that "
            "neither collides nor stalls in hindsight is appended to the memory bank (written from the "
            "check, or by a reflection LLM that agrees with it); requests wait in a durable outbox while "
            "the endpoint is down.",
    inputs=[("luna/failure", "luna_msgs/FailureEvent", "reliable, keep last 10"),
            ("luna/explanation", "luna_msgs/DecisionExplanation", "reliable, keep last 10"),
            ("localization/kinematic_state", "nav_msgs/Odometry", "reliable, keep last 50 (hindsight)"),
            ("perception/objects", "luna_msgs/TrackedObjects", "reliable, keep last 5 (hindsight)"),
            ("perception/traffic_lights", "luna_msgs/TrafficLightStateArray", "reliable, keep last 5 (hindsight)"),
            ("luna/scene", "luna_msgs/SceneDescriptor", "reliable, keep last 10 (the revision's facts)"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10 (earlier decisions, "
             "revised after a collision or near miss no decision could avoid any more)"),
            ("map/lane_graph", "luna_msgs/LaneGraph", "reliable, transient local"),
            ("planning/route", "luna_msgs/Route", "reliable, transient local")],
    outputs=[("luna/reflection", "luna_msgs/ReflectionResult", "reliable, keep last 10"),
             ("luna/memory/version", "std_msgs/UInt64", "reliable, transient local")],
    params=[
        ParamSpec("memory_bank", str, "", "Memory bank to append to (the one decision_inference reads); empty = "
                  "the live bank in $LUNA_DATA."),
        ParamSpec("outbox", str, "", "Outbox directory; empty = $LUNA_DATA/reflection_outbox."),
        ParamSpec("endpoint", str, "", "Base URL of an OpenAI-compatible endpoint (DeepSeek, vLLM, llama.cpp, "
                  "Ollama) that writes the revision; empty = the hindsight check's own revision."),
        ParamSpec("model", str, "", "Model name at the endpoint."),
        ParamSpec("api_key_env", str, "", "NAME of the environment variable holding the API key (never the key)."),
        ParamSpec("timeout", float, 60.0, "Per request.", "s", min=0.1),
        ParamSpec("max_tokens", int, 512, "Reflection answer length.", min=16, max=32768),
        ParamSpec("backoff_base", float, 2.0, "First retry delay while the endpoint is down (doubles).", "s",
                  min=0.0, runtime=True),
        ParamSpec("backoff_max", float, 120.0, "Longest retry delay.", "s", min=0.0, runtime=True),
        ParamSpec("pairing_timeout", float, 120.0, "A failure without explanation after this long is dropped.",
                  "s", min=1.0, runtime=True),
        ParamSpec("hindsight_keep", float, 60.0, "How long perceived inputs are buffered for the hindsight "
                  "check (must cover the explanation's latency plus the 6 s horizon).", "s", min=10.0),
        *VEHICLE_PARAMS,
    ],
)


def _pop_match(waiting: collections.OrderedDict, stamp: float, tolerance: float = 1e-3):
    """Remove and return the entry whose failure stamp is ``stamp`` (within ``tolerance``), or None."""
    key = next((s for s in waiting if abs(s - stamp) < tolerance), None)
    return waiting.pop(key) if key is not None else None


def llm_config(params: dict) -> LLMClientConfig:
    """The node's endpoint parameters as the stack's reflection LLM config (the key stays in the environment)."""
    return LLMClientConfig(endpoint=params["endpoint"], model=params["model"], api_key_env=params["api_key_env"],
                           timeout=params["timeout"])


class ReflectionClient(LunaNode):
    def __init__(self) -> None:
        super().__init__(INTERFACE)
        p = self.params
        from luna_core.memory import BankIntegrityError, JournalCorruptionError, MemoryBank
        from luna_core.prompts import PromptManager

        self.bank: MemoryBank | None = None
        self.outbox: Outbox | None = None
        try:
            self.bank = MemoryBank.open(live_memory_bank(p["memory_bank"]), writable=True)
            self.outbox = Outbox(p["outbox"] or data_dir() / "reflection_outbox")
        except (BankIntegrityError, JournalCorruptionError) as exc:
            # A damaged journal holds acknowledged records and is never truncated: reflection stays off
            # (diagnosed, until a person repairs it) while the driving stack runs on.
            if self.bank is not None:
                self.bank.close()
                self.bank = None
            self.diagnostics.set_condition("storage", ERROR, f"reflection off: {exc}")
            self.get_logger().error(f"reflection off: {exc}")
            return
        self.llm = None
        self.prompts = PromptManager()
        self.recorder = HindsightRecorder(vehicle=vehicle_parameters(p), keep=p["hindsight_keep"])
        self.recorder_lock = threading.Lock()  # callbacks and the timer run on the executor's threads
        self.failures: collections.OrderedDict[float, FailureEvent] = collections.OrderedDict()
        self.explanations: collections.OrderedDict[float, DecisionExplanation] = collections.OrderedDict()
        self.observing: list[tuple[DecisionExplanation, FailureEvent]] = []  # paired, horizon not yet observed
        self.result_pub = self.luna_publisher(lm.ReflectionResult, "luna/reflection", qos.RELIABLE)
        self.version_pub = self.luna_publisher(UInt64, "luna/memory/version", qos.LATCHED)
        self.version_pub.publish(UInt64(data=int(self.bank.version)))
        self.luna_subscription(lm.FailureEvent, "luna/failure", self.on_failure, qos.RELIABLE)
        self.luna_subscription(lm.DecisionExplanation, "luna/explanation", self.on_explanation, qos.RELIABLE)
        record = self.recorder
        self._record(Odometry, "localization/kinematic_state", qos.STATE,
                     lambda m: record.update_ego(convert.odometry_to_ego(m)))
        self._record(lm.TrackedObjects, "perception/objects", qos.SENSOR,
                     lambda m: record.update_objects(convert.msg_to_objects(m)))
        self._record(lm.TrafficLightStateArray, "perception/traffic_lights", qos.SENSOR,
                     lambda m: record.update_lights(convert.msg_to_lights(m)))
        self._record(lm.SceneDescriptor, "luna/scene", qos.RELIABLE,
                     lambda m: record.update_scene(convert.msg_to_scene(m)))
        self.decisions: collections.deque[DecisionDistribution] = collections.deque()
        self._record(lm.DecisionDistribution, "luna/decision", qos.RELIABLE, self._on_decision)
        self._record(lm.LaneGraph, "map/lane_graph", qos.LATCHED, lambda m: record.set_map(convert.msg_to_lane_graph(m)))
        self._record(lm.Route, "planning/route", qos.LATCHED, lambda m: record.set_route(convert.msg_to_route(m)))
        self.timer = self.create_periodic(0.5, self.enqueue_observed)
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, name="reflect", daemon=True)
        self.thread.start()
        self.diagnostics.set_value("outbox", len(self.outbox))

    def _record(self, msg_type, topic: str, profile, feed) -> None:
        def callback(msg) -> None:
            with self.recorder_lock:
                feed(msg)
        self.luna_subscription(msg_type, topic, callback, profile)

    def _on_decision(self, msg: lm.DecisionDistribution) -> None:
        decision = convert.msg_to_decision(msg)
        self.decisions.append(decision)
        while self.decisions and decision.stamp - self.decisions[0].stamp > self.params["hindsight_keep"]:
            self.decisions.popleft()

    def on_failure(self, msg: lm.FailureEvent) -> None:
        failure = convert.msg_to_failure(msg)
        explanation = _pop_match(self.explanations, failure.stamp)
        if explanation is not None:
            self.observe(explanation, failure)
            return
        self.failures[failure.stamp] = failure
        self._expire(self.failures, failure.stamp, "failure(s) without an explanation")

    def on_explanation(self, msg: lm.DecisionExplanation) -> None:
        explanation = convert.msg_to_explanation(msg)
        failure = _pop_match(self.failures, explanation.failure_stamp)
        if failure is not None:
            self.observe(explanation, failure)
            return
        # Its failure may still be on the way (another topic); it waits as long as a failure would.
        self.explanations[explanation.failure_stamp] = explanation
        self._expire(self.explanations, explanation.failure_stamp, "explanation(s) without their failure")

    def _expire(self, waiting: collections.OrderedDict, now: float, what: str) -> None:
        dropped = 0
        while waiting and now - next(iter(waiting)) > self.params["pairing_timeout"]:
            waiting.popitem(last=False)
            dropped += 1
        if dropped:
            self.diagnostics.increment("unpaired_dropped", dropped)
            self.diagnostics.set_condition("pairing", WARN, f"dropped {dropped} {what} after "
                                                            f"{self.params['pairing_timeout']:g} s")

    def observe(self, explanation: DecisionExplanation, failure: FailureEvent) -> None:
        """A paired failure waits (in memory) until the horizon after its decision has been observed."""
        self.observing.append((explanation, failure))
        self.diagnostics.set_value("observing", len(self.observing))
        self.enqueue_observed()

    def enqueue_observed(self, everything: bool = False) -> None:
        """Put every pair whose horizon has passed (``everything``: every pair, with what was observed
        so far) in the outbox with its hindsight observation."""
        now = self.now_s()
        with self.recorder_lock:
            ready = [(e, f) for e, f in self.observing if everything or self.recorder.observed(f.decision_stamp, now)]
            self.observing = [pair for pair in self.observing if pair not in ready]
            observations, earlier = [], []
            for explanation, failure in ready:
                try:
                    observations.append(self.recorder.observation(failure.decision_stamp))
                except HindsightError as exc:  # enqueued all the same: its result says why nothing was written
                    observations.append(None)
                    self.diagnostics.increment("no_hindsight")
                    self.diagnostics.set_condition("hindsight", WARN, f"failure at {failure.stamp:.2f} s: {exc}")
                earlier.append(self.recorder.earlier(self.decisions, failure))
            self.recorder.prune(now)
        for (explanation, failure), observation, before in zip(ready, observations, earlier):
            self.outbox.put(ReflectionRequest.from_events(explanation, failure, observation, before))  # durable now
            self.diagnostics.increment("requests_queued")
        if ready:
            self.diagnostics.set_value("observing", len(self.observing))
            self.diagnostics.set_value("outbox", len(self.outbox))
            self.wake.set()

    def _work(self) -> None:
        config = ReflectionConfig(max_tokens=self.params["max_tokens"])
        while not self.stop.is_set():
            self.wake.wait(timeout=0.5)
            self.wake.clear()
            due = self.outbox.due()
            if not due:
                continue
            if self.llm is None and self.params["endpoint"]:
                try:
                    self.llm = build_llm_client(llm_config(self.params))
                except Exception as exc:  # noqa: BLE001 - misconfiguration: diagnosed, requests kept
                    self.diagnostics.set_condition("endpoint", ERROR, f"cannot create the reflection LLM: {exc}")
                    self.stop.wait(self.params["backoff_max"])
                    continue
            system = ReflectionSystem(self.llm, self.prompts, self.bank, config)
            for pending in due:
                if self.stop.is_set():
                    return
                result = system.process(self.outbox, pending, self.params["backoff_base"], self.params["backoff_max"])
                self.diagnostics.set_value("outbox", len(self.outbox))
                self.diagnostics.set_value("outbox_oldest_age", round(self.outbox.oldest_age(), 1))
                if result is None:
                    self.diagnostics.increment("failed_attempts")
                    self.diagnostics.set_condition(
                        "endpoint", WARN, f"{len(self.outbox)} request(s) queued in the outbox, retrying with "
                                          f"backoff (attempt {pending.attempts}): {pending.last_error[:160]}")
                    continue
                self.diagnostics.clear("endpoint")
                self.publish(result)

    def publish(self, result) -> None:
        if self.stop.is_set():
            return  # shutting down: the result is durable in the outbox record and the bank
        result.stamp = self.now_s()
        self.result_pub.publish(convert.reflection_to_msg(result))
        if result.hindsight:
            self.diagnostics.set_value("last_hindsight", result.hindsight[:200])
        if result.error:
            self.diagnostics.increment("invalid_reflections")
            self.diagnostics.set_condition("reflection", WARN, result.error[:200])
            return
        self.diagnostics.clear("reflection")
        key = "memory_items_added" if result.memory_item_id else "normal_answers" if result.normal else \
            "no_grounded_revision"
        self.diagnostics.increment(key)
        if result.memory_item_id:
            self.version_pub.publish(UInt64(data=int(result.memory_version)))
            self.diagnostics.set_value("memory_version", result.memory_version)

    def close(self) -> None:
        if self.outbox is None:  # reflection off (damaged storage): nothing was started
            return
        # Pairs still waiting for their horizon go to the outbox with what was observed until now (the
        # objects then continue at their last velocity), so a stop does not lose them.
        self.enqueue_observed(everything=True)
        self.stop.set()
        self.wake.set()
        # A reflection in flight is not waited for: its request stays in the outbox (not marked done)
        # and is sent again after a restart, so nothing is lost by stopping now.
        self.thread.join(timeout=2.0)
        self.outbox.close()
        self.bank.close()


def main(args=None) -> int:
    return run([ReflectionClient], args)


if __name__ == "__main__":
    raise SystemExit(main())
