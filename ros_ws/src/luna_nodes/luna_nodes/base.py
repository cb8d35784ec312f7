"""What every LUNA node shares: validated parameters, 1 Hz diagnostics, guarded callbacks, main().

Nodes stay thin: they declare their interface (``NodeInterface``), convert messages with
``luna_msgs_py.convert`` and call luna_core. A bad message never crashes a node: the guarded callback
logs it (throttled), counts it and shows it in ``/diagnostics`` until the topic delivers a good one.
``set_parameters`` on a running node is checked against the same specs as the parameter file:
applied, or refused with the reason (``SetParametersResult(successful=False, reason=...)``).
"""

from __future__ import annotations

import faulthandler
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode
from rclpy.node import Node
from rosgraph_msgs.msg import Clock as Clock_

from luna_core.blas import limit_blas_for_good
from luna_core.ego_history import ReportedValues
from luna_core.types import TrackedObjects, usable_objects
from luna_msgs_py import convert, qos
from luna_nodes.params import (NodeInterface, ParameterError, ParamSpec, check_runtime_change,
                               declare_parameters)

OK, WARN, ERROR, STALE = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR,
                          DiagnosticStatus.STALE)

#: A condition is logged again at most this often (s) with the same level and message (numbers aside):
#: a message that changes on every cycle (an age, a count) or a condition that comes and goes must not
#: flood the log.
LOG_REPEAT_PERIOD = 10.0
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")

#: The cap on tracked objects per message (the nearest are kept): a flood of objects must not starve
#: odometry and the cycles. Shared by the nodes that read ``perception/objects``.
MAX_TRACKED_OBJECTS = ParamSpec("max_tracked_objects", int, 256, "Objects per perception message beyond this "
                                "are left out, the farthest from the ego first (diagnosed with the count).",
                                min=1, max=100_000, runtime=True)


#: Wall seconds a sim-time node waits for the very first odometry: a lock-step simulator holds its clock
#: until the stack answers, so a first instant that gave up early would leave the run stuck.
FIRST_ODOMETRY_WAIT = 30.0


class Diagnostics:
    """A node's health: named conditions (each with a level and message) plus key values, published
    as one ``diagnostic_msgs/DiagnosticStatus`` at 1 Hz. The worst condition sets the level.

    Every status also carries ``pid`` and ``process_cpu_s``, the CPU seconds (user + system, all
    threads) of the node's process so far: where a stack's time goes per node is then read from
    /diagnostics alone (``luna-bridge ros --realtime``'s report). Nodes sharing a process report the
    same figure.
    """

    def __init__(self, node: Node, period: float = 1.0) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._conditions: dict[str, tuple[int, str]] = {}
        self._values: dict[str, Any] = {}
        self._logged: dict[tuple[str, int, str], float] = {}  # (condition, level, message sans numbers) -> when
        self._announced: set[str] = set()  # conditions whose latest raise was logged (their clearing is too)
        self._pub = node.create_publisher(DiagnosticArray, "/diagnostics", qos.DIAGNOSTICS)
        # On wall (steady) time even under use_sim_time: a paused, held or finished simulation clock must
        # not silence a node's health (a monitor would take it for dead, and the last counts would be lost).
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._timer = node.create_timer(period, self.publish, clock=steady)
        # Once at once when the node starts spinning: a (re)started node is seen without waiting a period.
        self._first = node.create_timer(0.01, self._publish_first, clock=steady)

    def _publish_first(self) -> None:
        self._first.cancel()
        self.publish()

    def set_condition(self, name: str, level: int, message: str) -> None:
        """Raise (or, with OK, clear) a named condition, e.g. ("decision", WARN, "stale: fallback").

        Logged when raised or changed, except a repeat (same level, same message but for its numbers)
        within ``LOG_REPEAT_PERIOD``; its clearing is logged when its raise was.
        """
        now = time.monotonic()
        with self._lock:
            previous = self._conditions.get(name)
            if level == OK:
                self._conditions.pop(name, None)
                log = previous is not None and name in self._announced
                self._announced.discard(name)
            else:
                self._conditions[name] = (level, message)
                key = (name, level, _NUMBER.sub("#", message))
                log = previous != (level, message) and now - self._logged.get(key, -math.inf) >= LOG_REPEAT_PERIOD
                if log:
                    if len(self._logged) > 256:  # messages naming objects vary without end: forget old ones
                        self._logged = {k: t for k, t in self._logged.items() if now - t < LOG_REPEAT_PERIOD}
                    self._logged[key] = now
                    self._announced.add(name)
        if not log:
            return
        logger = self._node.get_logger()
        if level == OK:
            logger.info(f"{name}: cleared (was: {previous[1]})")
        else:
            (logger.error if level >= ERROR else logger.warning)(f"{name}: {message}")

    def clear(self, name: str) -> None:
        self.set_condition(name, OK, "")

    def set_value(self, key: str, value: Any) -> None:
        with self._lock:
            self._values[key] = value

    def increment(self, key: str, by: int = 1) -> None:
        with self._lock:
            self._values[key] = int(self._values.get(key, 0)) + by

    def value(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._values.get(key, default)

    def status(self) -> DiagnosticStatus:
        with self._lock:
            conditions = dict(self._conditions)
            values = dict(self._values)
        level = max((lvl for lvl, _ in conditions.values()), default=OK)
        message = "; ".join(f"{n}: {m}" for n, (_, m) in sorted(conditions.items())) or "ok"
        return DiagnosticStatus(level=level,
                                name=f"luna: {self._node.get_name()}", message=message,
                                hardware_id=self._node.get_fully_qualified_name(),
                                values=[KeyValue(key=str(k), value=_fmt(v)) for k, v in sorted(values.items())]
                                + [KeyValue(key="pid", value=str(os.getpid())),
                                   KeyValue(key="process_cpu_s", value=f"{time.process_time():.3f}")])

    def publish(self) -> None:
        msg = DiagnosticArray()
        msg.header.stamp = self._node.get_clock().now().to_msg()
        msg.status = [self.status()]
        self._pub.publish(msg)


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


class LunaNodeMixin:
    """Shared behaviour of LunaNode and LunaLifecycleNode (call ``_luna_setup`` in ``__init__``)."""

    interface: NodeInterface

    def _luna_setup(self, interface: NodeInterface) -> None:
        self.interface = interface
        self._periodic_instant = threading.local()  # the instant a periodic callback runs for (sim time)
        self.params = declare_parameters(self, interface.params)
        self.diagnostics = Diagnostics(self)
        self._last_rejection_log = 0.0
        self._silent_reports: set[str] = set()  # reported topics with a publisher that sent nothing (await_instant)
        self.add_on_set_parameters_callback(self._on_set_parameters)

    # -- run-time parameters ------------------------------------------------------------------------

    def start_up_open(self) -> bool:
        """Whether parameters read only at start-up may still change (a managed node: unconfigured)."""
        return False

    def apply_parameters(self, params: dict[str, Any]) -> None:
        """Put changed run-time parameters into effect; ``params`` is the complete new set. Raise
        ValueError to refuse the change. Nodes that read ``self.params`` where they use a value need
        nothing here."""

    def _on_set_parameters(self, parameters) -> SetParametersResult:
        try:
            values = check_runtime_change(self.interface.params, {p.name: p.value for p in parameters},
                                          self.get_name(), self.start_up_open())
            if values:
                self.apply_parameters({**self.params, **values})
        except (ParameterError, ValueError) as exc:
            self.get_logger().warning(f"set_parameters refused: {exc}")
            return SetParametersResult(successful=False, reason=str(exc))
        if values:
            self.params.update(values)
            self.get_logger().info(f"parameters applied: {values}")
        return SetParametersResult(successful=True)

    # -- shared input handling ----------------------------------------------------------------------

    def usable_objects_of(self, msg, origin: tuple[float, float] | None) -> TrackedObjects:
        """A perception message as the safety logic may use it (``luna_core.types.usable_objects``:
        unknown sizes get default footprints, at most ``max_tracked_objects`` nearest ``origin``), with
        the condition "objects" raised while anything had to be assumed, left out or capped."""
        objects = convert.msg_to_objects(msg)
        usable = usable_objects(objects.objects, origin, self.params["max_tracked_objects"])
        problems = usable.problems()
        if problems:
            self.diagnostics.increment("objects_assumed", len(usable.assumed))
            self.diagnostics.increment("objects_dropped", len(usable.dropped))
            self.diagnostics.increment("objects_beyond_cap", usable.beyond_cap)
            self.diagnostics.set_condition("objects", WARN, problems)
        else:
            self.diagnostics.clear("objects")
        objects.objects = usable.objects
        return objects

    def now_s(self) -> float:
        """Node-clock time in seconds (simulation time under use_sim_time). Inside a periodic callback
        under sim time: the instant k * period it runs for (``create_periodic``)."""
        instant = getattr(self._periodic_instant, "value", None)
        return instant if instant is not None else self.get_clock().now().nanoseconds * 1e-9

    def sim_time(self) -> bool:
        return bool(self.get_parameter("use_sim_time").value)

    def create_periodic(self, period: float, callback: Callable[[], None], callback_group=None):
        """Call ``callback`` every ``period`` seconds of node time.

        On wall time this is a plain timer. Under ``use_sim_time`` the calls happen at the instants
        k * period of simulation time, driven by ``/clock`` messages: a lock-step simulator that
        holds the clock gets exactly one call per instant, never a burst after a clock jump, never a
        call at the unset time 0, and nothing runs while the clock stands still. A call is for the
        latest instant due, and ``now_s()`` in it is that instant, not whatever the node clock (or a
        /clock message that arrived late) says by then: on a loaded machine the node clock can lag
        behind /clock, or run ahead of a callback that waited its turn.
        """
        if not self.sim_time():
            return self.create_timer(period, callback, callback_group=callback_group)
        # Integer nanoseconds: /clock carries epoch-scale stamps (a bag at 1.7e9 s), where now / period
        # in floats is off by ~4e-6 (far above any epsilon), so a clock exactly at an instant could be
        # taken for the instant before it and that instant never called (48 of 121 scene instants of
        # the sample bag were lost that way).
        period_ns = int(round(period * 1e9))
        if period_ns <= 0:
            raise ValueError(f"create_periodic: period {period!r} s is not positive")
        state = {"next": None}  # the next instant due, ns

        def on_clock(msg: Clock_) -> None:
            now_ns = msg.clock.sec * 1_000_000_000 + msg.clock.nanosec
            if now_ns <= 0:
                return
            if state["next"] is None:
                state["next"] = -(-now_ns // period_ns) * period_ns  # the first instant at or after now
            if now_ns >= state["next"]:
                k = now_ns // period_ns
                state["next"] = (k + 1) * period_ns
                self._await_clock(now_ns)
                self._periodic_instant.value = k * period_ns / 1e9
                try:
                    callback()
                finally:
                    self._periodic_instant.value = None

        # Own callback group: rclpy's time source updates the node clock from /clock in the default
        # group, which must stay free while _await_clock waits for it.
        group = callback_group or MutuallyExclusiveCallbackGroup()
        return self.create_subscription(Clock_, "/clock", on_clock, qos.CLOCK, callback_group=group)

    def _await_clock(self, now_ns: int, timeout: float = 5.0) -> None:
        """The node clock follows /clock through its own subscription: give it a while to reach ``now_ns``
        before a periodic callback runs (what the callback computes is for its instant in any case;
        this keeps the node clock's other readers, e.g. message stamps, in step)."""
        if not self.wait_until(lambda: self.get_clock().now().nanoseconds >= now_ns, timeout):
            self.diagnostics.set_condition("clock", WARN, f"node clock still behind /clock {now_ns * 1e-9:.3f} s "
                                                          f"after {timeout:.1f} s")
        else:
            self.diagnostics.clear("clock")

    def await_instant(self, now: float, missing: Callable[[], list[str]], timeout: float,
                      reports: Sequence[tuple[ReportedValues, Any]] = ()) -> bool:
        """Lock step (sim time): wait up to ``timeout`` s of wall time until ``missing()`` (what of the
        instant ``now`` is not in yet, named with its latest stamp) is empty. A miss goes on with the
        latest inputs, so its result depends on how loaded the machine is: it is counted
        (``input_sync_timeouts``) and raised as the "lock step" WARN, naming what was missing, until an
        instant's inputs are complete again (``luna demo`` reports the count).

        ``reports`` pairs the ego history's reported values (acceleration, steering angle) with their
        subscriptions: a topic with a publisher is waited for from its first report on (that report may
        come after the first odometry: DDS does not order topics). A publisher that has sent nothing
        within ``timeout`` is not waited for again (WARN "<what> silent"; the fallback applies)."""
        for values, subscription in reports:
            if values.stamp is None and values.what not in self._silent_reports:
                values.expected = subscription.get_publisher_count() > 0
        if self.wait_until(lambda: not missing(), timeout):
            self.diagnostics.clear("lock step")
            return True
        if not self.context.ok():
            return False  # shutting down: nothing was late
        self.diagnostics.increment("input_sync_timeouts")
        self.diagnostics.set_condition("lock step", WARN, f"inputs of t={now:.2f} s incomplete after "
                                                          f"input_sync_timeout ({timeout:g} s), missing "
                                                          f"{', '.join(missing()) or 'nothing by now'}: "
                                                          "went on with the latest")
        for values, _ in reports:
            if values.expected and values.stamp is None:
                values.expected = False
                self._silent_reports.add(values.what)
                self.diagnostics.set_condition(f"{values.what} silent", WARN,
                                               f"the {values.what} topic has a publisher that sent nothing "
                                               f"within input_sync_timeout: no longer waited for")
        return False

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll ``predicate`` for up to ``timeout`` s of wall time (inputs arrive on other threads). False at
        once when the node's context shuts down (SIGINT): the executor's threads must end for the process to
        exit, and a lock-step wait runs up to input_sync_timeout (once held a stop past its 30 s bound)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline or not self.context.ok():
                return False
            time.sleep(0.002)
        return True

    def _qos_warning(self, kind: str, topic: str) -> Callable:
        def on_incompatible(event) -> None:
            self.diagnostics.set_condition(f"qos {topic}", WARN,
                                           f"incompatible QoS with a {kind} (policy {event.last_policy_kind})")
        return on_incompatible

    def luna_publisher(self, msg_type, topic: str, profile, lifecycle: bool = False):
        callbacks = PublisherEventCallbacks(incompatible_qos=self._qos_warning("subscriber", topic))
        create = self.create_lifecycle_publisher if lifecycle else self.create_publisher
        return create(msg_type, topic, profile, event_callbacks=callbacks)

    def luna_subscription(self, msg_type, topic: str, callback: Callable, profile, **kwargs):
        """Subscribe with a guarded callback: exceptions are logged, counted and diagnosed."""
        condition = f"input {topic}"

        def guarded(msg) -> None:
            try:
                callback(msg)
            except Exception as exc:  # noqa: BLE001 - a bad message must never take the node down
                self.reject(topic, exc)
            else:
                self.diagnostics.clear(condition)  # the topic recovered: an earlier rejection is over
        callbacks = SubscriptionEventCallbacks(incompatible_qos=self._qos_warning("publisher", topic))
        return self.create_subscription(msg_type, topic, guarded, profile, event_callbacks=callbacks, **kwargs)

    def reject(self, topic: str, exc: BaseException) -> None:
        """Record an input that could not be used (logged at most once per second)."""
        self.diagnostics.increment("rejected_inputs")
        self.diagnostics.set_condition(f"input {topic}", WARN, f"rejected: {exc}")
        now = time.monotonic()
        if now - self._last_rejection_log > 1.0:
            self._last_rejection_log = now
            self.get_logger().warning(f"rejected input on {topic}: {exc}\n"
                                      f"{''.join(traceback.format_exception_only(type(exc), exc)).strip()}")


class LunaNode(LunaNodeMixin, Node):
    def __init__(self, interface: NodeInterface, **kwargs) -> None:
        super().__init__(interface.name, **kwargs)
        self._luna_setup(interface)


class LunaLifecycleNode(LunaNodeMixin, LifecycleNode):
    """A managed node. With the ``autostart`` parameter it configures and activates itself (as
    nav2's lifecycle manager would), so ``luna up`` needs no lifecycle manager."""

    def __init__(self, interface: NodeInterface, **kwargs) -> None:
        super().__init__(interface.name, **kwargs)
        self._luna_setup(interface)

    def autostart(self) -> None:
        if self.params.get("autostart", True):
            self.trigger_configure()
            self.trigger_activate()

    def start_up_open(self) -> bool:
        return self._state_machine.current_state[1] == "unconfigured"


#: Set (to "1") by the supervisor of ``luna up`` on a standby process (luna_bringup.supervisor).
STANDBY_ENV = "LUNA_STANDBY"


def await_promotion(preload: Callable[[Sequence[str]], None] | None, argv: Sequence[str]) -> bool:
    """A standby: load what the process's nodes load at configure (``preload(argv)``: its models, off the
    ROS graph), then wait until the supervisor promotes it (a line on stdin) to take the place of its
    primary that died. True once promoted; False when told to stop instead (EOF on stdin, SIGINT). A
    failed preload is reported and left to the nodes' own configure after the promotion."""
    started = time.perf_counter()
    try:
        if preload is not None:
            try:
                preload(argv)
            except Exception as exc:  # noqa: BLE001 - the promoted process loads as a fresh one would
                print(f"[WARN] standby: preloading failed, a promotion loads at configure: {exc}", flush=True)
        print(f"[INFO] standby: ready after {time.perf_counter() - started:.1f} s, waiting to take over",
              flush=True)
        line = sys.stdin.readline()
    except KeyboardInterrupt:
        return False
    if line:
        print("[INFO] standby: promoted, joining the ROS graph", flush=True)
    return bool(line)


def run(factories: Sequence[Callable[[], Node]], args: Sequence[str] | None = None, threads: int = 4,
        optional: Sequence[Callable[[], Node]] = (), preload: Callable[[Sequence[str]], None] | None = None) -> int:
    """Create the nodes, spin them on one multi-threaded executor until shutdown; the exit code.

    A node whose parameters are invalid stops the process with exit code 2 and a message naming
    the parameter and the parameter file. The ``optional`` nodes (non-critical ones sharing the
    process, e.g. the explainer) never do: one that cannot be created is reported and left out.
    Started as a standby (``STANDBY_ENV``), the process first runs ``preload`` with its command line and
    waits for its promotion (``await_promotion``) before it creates anything.
    """
    limit_blas_for_good()  # a node works in bursts: idle BLAS helper threads would spin on its cores
    # SIGUSR1 prints every thread's stack: what a supervisor asks of a process that does not stop on SIGINT.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if os.environ.pop(STANDBY_ENV, "") == "1" and not await_promotion(preload, sys.argv if args is None else args):
        return 0
    rclpy.init(args=args)
    nodes: list[Node] = []
    executor = None
    code = 0
    try:
        for factory in factories:
            node = factory()
            nodes.append(node)
            if isinstance(node, LunaLifecycleNode):
                node.autostart()
        for factory in optional:
            try:
                nodes.append(factory())
            except Exception:  # noqa: BLE001 - a non-critical node must not take the process down
                print(f"[ERROR] a non-critical node was not started, the others run without it:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        executor = MultiThreadedExecutor(num_threads=threads)
        for node in nodes:
            executor.add_node(node)
        executor.spin()
    except ParameterError as exc:
        print(f"[FATAL] invalid parameter: {exc}", file=sys.stderr, flush=True)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:  # noqa: BLE001 - report what killed the process, then exit non-zero
        if rclpy.ok():
            print(f"[FATAL] {traceback.format_exc()}", file=sys.stderr, flush=True)
            code = 1
        # else: a shutdown (SIGINT) arrived while the nodes were being built: a clean stop
    finally:
        # Order matters: stop the node's own worker threads (they may still publish), then the
        # executor's threads, then the nodes and the context.
        for node in nodes:
            close = getattr(node, "close", None)
            if callable(close):
                close()
        if executor is not None:
            executor.shutdown(timeout_sec=10.0)
        for node in nodes:
            node.destroy_node()
        rclpy.try_shutdown()
    return code
