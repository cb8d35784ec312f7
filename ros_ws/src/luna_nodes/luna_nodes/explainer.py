"""explainer: on each failure event, explains the decision that was being executed.

Generation runs in a worker that yields to the periodic decision (the student pauses between tokens
while a decision is pending). In the ``decision_stack`` executable it shares decision_inference's model
instance; ``explainer`` alone loads its own.
"""

from __future__ import annotations

import collections
import threading

import luna_msgs.msg as lm

from luna_core.stack import executed_decision
from luna_core.types import DecisionDistribution, FailureEvent
from luna_msgs_py import convert, qos
from luna_nodes.base import ERROR, WARN, LunaNode, run
from luna_nodes.params import NodeInterface, ParamSpec
from luna_nodes.shared_model import MODEL_PARAMS, SharedHeuristic


EXPLAINER_INTERFACE = NodeInterface(
    name="explainer",
    summary="On each failure event explains the decision that was being executed (LUNA-AD Eq. 25-28), "
            "asynchronously, yielding to the periodic decision.",
    inputs=[("luna/failure", "luna_msgs/FailureEvent", "reliable, keep last 10"),
            ("luna/decision", "luna_msgs/DecisionDistribution", "reliable, keep last 10")],
    outputs=[("luna/explanation", "luna_msgs/DecisionExplanation", "reliable, keep last 10")],
    params=[ParamSpec("decision_history", float, 30.0, "How long past decisions are kept to be explained.", "s",
                      min=1.0, runtime=True),
            ParamSpec("max_queue", int, 8, "Pending explanations beyond this drop the oldest.", min=1, max=1000,
                      runtime=True),
            ParamSpec("max_tokens", int, 200, "Generated tokens per explanation with the student on an "
                      "accelerator.", min=1, max=4096, runtime=True),
            ParamSpec("cpu_max_tokens", int, 96, "Generated tokens per explanation with the student on the CPU, "
                      "where each token waits for the periodic decision.", min=1, max=4096, runtime=True),
            ParamSpec("max_time", float, 60.0, "Wall time per explanation before it is cut (the text then ends "
                      "at its last complete sentence).", "s", min=0.1, runtime=True),
            *MODEL_PARAMS],
)


class Explainer(LunaNode):
    def __init__(self, shared: SharedHeuristic | None = None) -> None:
        super().__init__(EXPLAINER_INTERFACE)
        self.shared = shared or SharedHeuristic()
        self.decisions: collections.deque[DecisionDistribution] = collections.deque()
        self.queue: collections.deque[FailureEvent] = collections.deque()
        self.queue_ready = threading.Condition()
        self.stop = threading.Event()
        self.publisher = self.luna_publisher(lm.DecisionExplanation, "luna/explanation", qos.RELIABLE)
        self.luna_subscription(lm.DecisionDistribution, "luna/decision", self.on_decision, qos.RELIABLE)
        self.luna_subscription(lm.FailureEvent, "luna/failure", self.on_failure, qos.RELIABLE)
        self.thread = threading.Thread(target=self._work, name="explain", daemon=True)
        self.thread.start()

    def on_decision(self, msg: lm.DecisionDistribution) -> None:
        d = convert.msg_to_decision(msg)
        self.decisions.append(d)
        while self.decisions and d.stamp - self.decisions[0].stamp > self.params["decision_history"]:
            self.decisions.popleft()

    def on_failure(self, msg: lm.FailureEvent) -> None:
        with self.queue_ready:
            self.queue.append(convert.msg_to_failure(msg))
            while len(self.queue) > self.params["max_queue"]:
                dropped = self.queue.popleft()
                self.diagnostics.increment("dropped_failures")
                self.diagnostics.set_condition("queue", WARN, f"explanation queue full: dropped the failure at "
                                                              f"{dropped.stamp:.2f} s")
            self.queue_ready.notify()

    def decision_for(self, failure: FailureEvent) -> DecisionDistribution | None:
        """The decision executed when the failure happened (``luna_core.stack.executed_decision``)."""
        return executed_decision(list(self.decisions), failure)

    def _load_model(self) -> None:
        """Load (or, in the composed process, look up) the shared model now, so that health says at once
        whether explanations can be made."""
        try:
            self.shared.get(self.params)
        except Exception:  # noqa: BLE001 - reported; retried at the next failure to explain
            self.diagnostics.set_condition("model", ERROR, f"{self.shared.error}: failures cannot be explained")
            return
        self.diagnostics.clear("model")

    def _work(self) -> None:
        self._load_model()
        while not self.stop.is_set():
            with self.queue_ready:
                self.queue_ready.wait_for(lambda: self.queue or self.stop.is_set(), timeout=0.5)
                if not self.queue:
                    continue
                failure = self.queue.popleft()
            self._explain(failure)

    def _explain(self, failure: FailureEvent) -> None:
        decision = self.decision_for(failure)
        if decision is None:
            self.diagnostics.set_condition("explanation", WARN, f"no decision known for the failure at "
                                                                f"{failure.stamp:.2f} s")
            return
        self._load_model()
        if self.shared.system is None:
            return
        try:
            system = self.shared.system
            budget = self.params["cpu_max_tokens"] if system.on_cpu else self.params["max_tokens"]
            explanation = system.explain(decision, failure, stop=self.stop, max_tokens=budget,
                                         max_time=self.params["max_time"])
        except Exception as exc:  # noqa: BLE001 - keep serving later failures
            self.diagnostics.set_condition("explanation", ERROR, f"explanation failed: {exc}")
            return
        if self.stop.is_set():
            return
        self.diagnostics.clear("explanation")
        explanation.stamp = self.now_s()
        self.publisher.publish(convert.explanation_to_msg(explanation))
        self.diagnostics.set_value("last_latency_s", round(explanation.latency, 3))
        self.diagnostics.set_value("last_stop_reason", explanation.stop_reason)
        self.diagnostics.increment("explanations")
        if explanation.names_repaired:
            self.diagnostics.increment("action_names_repaired", explanation.names_repaired)

    def close(self) -> None:
        self.stop.set()
        with self.queue_ready:
            self.queue_ready.notify_all()
        self.thread.join(timeout=30.0)  # generation stops at the next token once ``stop`` is set


def main(args=None) -> int:
    return run([Explainer], args)


if __name__ == "__main__":
    raise SystemExit(main())
