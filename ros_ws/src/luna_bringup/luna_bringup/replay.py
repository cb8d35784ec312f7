"""``luna replay``: play a field bag through the stack, record inputs and outputs, write a report.

1. start the stack (the ``luna up`` topology, every node on ``use_sim_time``; processes whose outputs
   the bag provides, e.g. map_server for a bag with a lane graph, are left out) unless ``--no-stack``
   (a stack already running, e.g. from ``ros2 launch`` on the vehicle computer);
2. wait until every node of the topology is up (managed nodes: active, or failed for good) and the
   stack subscribes to the bag's input topics (never a fixed sleep);
3. play the bag's inputs (``luna bag play`` semantics; recorded stack outputs are left out so they do
   not collide with the live ones) while recording every topic on the graph into ``-o`` on bag time.
   In lock step (the default when a decision_inference node runs) bag time stops at every decision
   instant k T_d until the decision for it is out, so every T_d of the bag gets its decision however
   slow the machine's forward pass is (a replay is about what the stack decides, not about timing);
4. let the stack settle, stop it, finalise the bag, and write ``<out>/report/report.html`` (+ ``.md``,
   PNGs) with ``luna_bags.report.write_report``; the stack's log goes to ``<out>/report/stack.log``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter

from luna_bags.msgtypes import MessageTypes
from luna_bags.play import PlayReport, Player
from luna_bags.reader import BagError, BagReader
from luna_bags.record import Recorder, drain
from luna_bags.ros import init_ros
from luna_bags.signals import stop_on_signals
from luna_bags.topics import DECISION, SCENE, is_replay_input
from luna_bags.writer import BagExistsError, BagWriter, resolve_output

#: Starts the stack, logging to the given file; the context manager stops it on exit.
StackStarter = Callable[[Path], AbstractContextManager]


@dataclass
class TopologyStack:
    """The ``luna up`` topology as a StackStarter (all nodes with ``use_sim_time``), its node names, and
    the processes left out because the bag provides their outputs."""

    topology: object  # luna_bringup.topology.Topology
    nodes: list[str]
    left_out: dict[str, list[str]]  # process -> its output topics the bag provides
    params_dir: Path | None = None  # None: luna_bringup's config directory

    def __call__(self, log_path: Path) -> AbstractContextManager:
        from luna_bringup.supervisor import Supervisor
        from luna_bringup.topology import config_dir

        return Supervisor(self.topology, self.params_dir or config_dir(), use_sim_time=True,
                          out=log_path.open("w", encoding="utf-8"))


def node_outputs(node_name: str) -> set[str]:
    """Absolute output topics a stack node declares in its INTERFACE (empty if it cannot be loaded)."""
    import importlib

    from luna_nodes.docs import NODE_MODULES

    target = NODE_MODULES.get(node_name)
    if target is None:
        return set()
    module, _, attr = target.partition(":")
    try:
        interface = getattr(importlib.import_module(module), attr or "INTERFACE")
    except (ImportError, AttributeError):
        return set()
    return {"/" + topic.lstrip("/") for topic, _, _ in interface.outputs}


def topology_stack(topology: Path | None = None, only: str = "", provided: set[str] = frozenset(),
                   params_dir: Path | None = None) -> TopologyStack:
    """Load the topology, leave out (unless ``only`` names processes) every process whose nodes publish
    a topic the bag provides (``provided``: e.g. the bag's lane graph replaces map_server, so two maps
    never compete), and check every command line now: a missing executable or a bad topology fails
    before anything is created (TopologyError, a ValueError)."""
    from luna_bringup.supervisor import Supervisor
    from luna_bringup.topology import config_dir, load_topology

    spec = load_topology(topology)
    left_out: dict[str, list[str]] = {}
    if only:
        spec = spec.select([n.strip() for n in only.split(",") if n.strip()])
    else:
        for process in spec.processes:
            clash = sorted(set().union(*(node_outputs(n) for n in process.nodes)) & set(provided))
            if clash:
                left_out[process.name] = clash
        if left_out:
            spec = spec.select([p.name for p in spec.processes if p.name not in left_out])
    check = Supervisor(spec, params_dir or config_dir(), use_sim_time=True)
    for process in spec.processes:
        check.command(process)
    return TopologyStack(spec, [n for p in spec.processes for n in p.nodes], left_out, params_dir)


class StackReadiness:
    """Tells when every named node is on the graph and, if it is a managed node, active.

    Create it before the stack starts: it listens to each node's lifecycle ``transition_event`` so a
    node whose activation failed (back to unconfigured, or errored) is reported at once instead of
    being waited for. ``wait`` needs ``node`` to be spun by another thread (``get_state`` calls).
    """

    def __init__(self, node: Node, names: list[str]) -> None:
        from lifecycle_msgs.msg import TransitionEvent

        self.node = node
        self.states: dict[str, str] = {n: "not started" for n in names}
        self.failed: dict[str, str] = {}
        self._subs = [node.create_subscription(TransitionEvent, f"/{n}/transition_event",
                                               lambda m, n=n: self._on_transition(n, m), 10) for n in names]

    def _on_transition(self, name: str, event) -> None:
        from lifecycle_msgs.msg import State

        failed_configure = (event.start_state.id == State.TRANSITION_STATE_CONFIGURING
                            and event.goal_state.id == State.PRIMARY_STATE_UNCONFIGURED)
        if failed_configure or event.goal_state.id in (State.TRANSITION_STATE_ERRORPROCESSING,
                                                       State.PRIMARY_STATE_FINALIZED):
            self.failed[name] = f"failed: {event.start_state.label} -> {event.goal_state.label}"

    def wait(self, timeout: float, stop: threading.Event) -> list[str]:
        """Block until all are ready, one failed for good, or the timeout; the not-ready ones with why."""
        from lifecycle_msgs.msg import State
        from lifecycle_msgs.srv import GetState

        clients: dict[str, object] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stop.is_set():
            present = dict(self.node.get_node_names_and_namespaces())
            for name in [n for n, s in self.states.items() if s != "ready" and n not in self.failed]:
                if name not in present:
                    continue
                services = {s for s, _ in self.node.get_service_names_and_types_by_node(name, present[name])}
                if not services:
                    continue  # on the graph, its services not discovered yet
                service = next((s for s in services if s.endswith(f"{name}/get_state")), None)
                if service is None:
                    self.states[name] = "ready"  # not a managed node: on the graph means ready
                    continue
                client = clients.setdefault(name, self.node.create_client(GetState, service))
                future = client.call_async(GetState.Request())
                answered = time.monotonic() + 2.0
                while not future.done() and time.monotonic() < answered:
                    time.sleep(0.01)
                if future.done() and future.result() is not None:
                    state = future.result().current_state
                    self.states[name] = "ready" if state.id == State.PRIMARY_STATE_ACTIVE else state.label
            if all(s == "ready" or n in self.failed for n, s in self.states.items()):
                break
            time.sleep(0.1)
        for client in clients.values():
            self.node.destroy_client(client)
        for sub in self._subs:
            self.node.destroy_subscription(sub)
        return [f"{n} ({self.failed.get(n, s)})" for n, s in self.states.items() if s != "ready"]


class DecisionLockStep:
    """The player's ``Hold`` for ``luna replay``: at each decision instant it waits until the decision
    stamped at (or after) that instant is out; it does not wait when no scene is there to decide on
    (the start of a bag), nor longer than ``timeout``.

    The instants are the decision node's own (multiples of its ``decision_period``, read from the running
    node). ``summary`` says how many instants got their decision and how long bag time was held.
    """

    # s of wall time for the scene of an instant to show up before not waiting at all. The scene node
    # shares the CPU with the decision process (its forward pass and the explainer take both cores for
    # seconds), so on 2 cores the scene of an instant came 3 s late and a 3 s grace skipped its decision.
    SCENE_GRACE = 10.0

    def __init__(self, node: Node, period: float, timeout: float, max_scene_age: float) -> None:
        import luna_msgs.msg as lm

        from luna_msgs_py import qos

        self.node, self.timeout, self.max_scene_age = node, timeout, max_scene_age
        self.period_ns = int(round(period * 1e9))
        self.held: list[tuple[int, float, str]] = []  # (instant ns, wall s waited, why the wait ended)
        self._decisions_ns: list[int] = []
        self._scenes_ns: list[int] = []
        self._lock = threading.Lock()
        self._subs = [node.create_subscription(lm.DecisionDistribution, DECISION, self._on_decision, qos.RELIABLE),
                      node.create_subscription(lm.SceneDescriptor, SCENE, self._on_scene, qos.RELIABLE)]

    @staticmethod
    def _ns(stamp) -> int:
        return stamp.sec * 1_000_000_000 + stamp.nanosec

    def _on_decision(self, msg) -> None:
        with self._lock:
            self._decisions_ns.append(self._ns(msg.header.stamp))

    def _on_scene(self, msg) -> None:
        with self._lock:
            self._scenes_ns.append(self._ns(msg.header.stamp))

    def _decided(self, instant_ns: int) -> bool:
        """A decision stamped in [instant, next instant) (1 us slack: the node's clock is a float)."""
        with self._lock:
            return any(instant_ns - 1000 <= d < instant_ns + self.period_ns - 1000 for d in self._decisions_ns)

    def _has_scene_for(self, instant_ns: int) -> bool:
        oldest = instant_ns - int(self.max_scene_age * 1e9)
        with self._lock:
            return any(oldest <= s <= instant_ns for s in self._scenes_ns)

    def wait(self, instant_ns: int, stop: threading.Event) -> None:
        started = time.monotonic()
        ended = "stopped"
        while not stop.is_set():
            if self._decided(instant_ns):
                ended = "decided"
                break
            if time.monotonic() - started >= self.timeout:
                ended = f"no decision within --lockstep-timeout {self.timeout:g} s"
                break
            if time.monotonic() - started > self.SCENE_GRACE and not self._has_scene_for(instant_ns):
                ended = "no scene to decide on"
                break
            time.sleep(0.005)
        self.held.append((instant_ns, time.monotonic() - started, ended))

    def summary(self) -> str:
        decided = [w for t, w, _ in self.held if self._decided(t)]
        line = (f"lock step on T_d = {self.period_ns * 1e-9:g} s: {len(decided)} of {len(self.held)} decision "
                f"instants of the bag decided")
        if decided:
            line += f" (bag time held {np.median(decided):.1f} s median, {max(decided):.1f} s max for a decision)"
        # Why each miss ended, apart: "no scene" and "no decision in time" have different causes.
        missed: dict[str, list[float]] = {}
        for t, _, ended in self.held:
            if not self._decided(t):
                missed.setdefault(ended, []).append(t * 1e-9)
        for ended, instants in missed.items():
            line += f"; none at bag time {', '.join(f'{t:.1f}' for t in instants[:5])} s ({ended})"
        return line

    def close(self) -> None:
        for sub in self._subs:
            self.node.destroy_subscription(sub)


def decision_parameters(node: Node, timeout: float = 10.0) -> dict | None:
    """``decision_period`` and ``max_scene_age`` of the running decision_inference node (None: not running)."""
    from rcl_interfaces.srv import GetParameters

    names = ["decision_period", "max_scene_age"]
    service = "/decision_inference/get_parameters"
    client = node.create_client(GetParameters, service)
    try:
        if not client.wait_for_service(timeout_sec=timeout):
            return None
        deadline = time.monotonic() + timeout
        future = None
        while time.monotonic() < deadline and (future is None or not future.done()):
            # Sent again every 2 s: a server that takes the request before it has discovered our
            # response reader drops the answer (Fast DDS, ros2/rmw_fastrtps#390).
            future = client.call_async(GetParameters.Request(names=names))
            resend = min(deadline, time.monotonic() + 2.0)
            while not future.done() and time.monotonic() < resend:
                time.sleep(0.01)
        if future is None or not future.done() or future.result() is None:
            return None
        return {n: v.double_value for n, v in zip(names, future.result().values)}
    finally:
        node.destroy_client(client)


@dataclass
class ReplayResult:
    output: Path
    report: Path
    play: PlayReport
    recorded: dict[str, int]
    notes: list[str]  # how the run went: dead processes, nodes not ready, inputs nobody subscribed to


def replay(bag: Path, output: Path, storage: str = "mcap", stack: StackStarter | None = None,
           rate: float = 1.0, topics: list[str] | None = None, ready_timeout: float = 120.0,
           settle: float = 3.0, progress: bool = True, stop: threading.Event | None = None,
           lockstep: bool = True, lockstep_timeout: float = 120.0) -> ReplayResult:
    """Play ``bag`` through ``stack`` (None: a stack already running) and record everything into ``output``;
    with ``lockstep``, bag time waits at every decision instant for its decision (``DecisionLockStep``)."""
    stop = stop or threading.Event()
    reader = BagReader(bag)  # BagError for an unreadable bag, before anything starts
    if topics is None:
        topics = [t for t in reader.topics if is_replay_input(t)]
    writer = BagWriter(output, storage, MessageTypes())
    report_dir = output / "report"
    report_dir.mkdir()
    own_context = not rclpy.ok()
    if own_context:
        from luna_bringup.topology import fast_discovery_profile

        init_ros(fast_discovery_profile())
    node = Node("luna_replay", parameter_overrides=[Parameter("use_sim_time", value=True)])
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinning = threading.Event()
    recorder = Recorder(node, writer)

    def spin() -> None:
        while not spinning.is_set():
            executor.spin_once(timeout_sec=0.05)

    spinner = threading.Thread(target=spin, name="replay-recorder", daemon=True)
    spinner.start()
    lock: DecisionLockStep | None = None
    lock_notes: list[str] = []
    try:
        readiness = StackReadiness(node, list(getattr(stack, "nodes", [])))
        died: list[str] = []
        with (stack(report_dir / "stack.log") if stack else nullcontext()) as running:
            started = time.monotonic()
            not_ready = readiness.wait(ready_timeout, stop)
            # Lock step needs a decision node: one this replay started and is ready, or (no stack of
            # ours) one already running.
            started_nodes = getattr(stack, "nodes", None)
            deciding = started_nodes is None or ("decision_inference" in started_nodes and not any(
                n.startswith("decision_inference ") for n in not_ready))
            if lockstep:
                found = decision_parameters(node) if deciding else None
                if found is None:
                    lock_notes.append("played in real time, not in lock step: no decision_inference node answered")
                else:
                    lock = DecisionLockStep(node, found["decision_period"], lockstep_timeout, found["max_scene_age"])
            player = Player(node, reader, rate=rate, topics=topics, hold=lock)
            player.prepare()
            left = max(1.0, ready_timeout - (time.monotonic() - started))
            missing = player.wait_for_subscribers(timeout=left, stop=stop)
            recorder.discover()
            _wait_for_matches(recorder, timeout=10.0, stop=stop)
            timer = node.create_timer(0.5, recorder.discover, clock=_steady_clock())
            player.play(stop, progress=progress)
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline and not stop.is_set():
                time.sleep(0.05)
            spinning.set()
            spinner.join()
            node.destroy_timer(timer)
            drain(executor, recorder)
            recorder.flush_pending()
            died = [f"{event} (during the replay)" for event in getattr(running, "events", [])]
            if lock is not None:
                lock_notes.append(lock.summary())
                lock.close()
    finally:
        spinning.set()
        if spinner.is_alive():
            spinner.join()
        writer.close()
        executor.shutdown()
        node.destroy_node()
        if own_context:
            rclpy.try_shutdown()
        reader.close()
    from luna_bags.report import write_report  # matplotlib: imported only when a report is written

    notes = [f"process {p} not started: the bag provides its output {', '.join(t)}"
             for p, t in getattr(stack, "left_out", {}).items()]
    notes += lock_notes + died + [f"node {n} was not ready when playback started" for n in not_ready]
    notes += [f"nothing in the stack subscribed to {t}" for t in missing]
    notes += [f"{t} not played: {why}" for t, why in player.report.skipped_topics.items()]
    notes += [f"{n} undecodable messages on {t} skipped" for t, n in player.report.undecodable.items()]
    notes += [f"recording: {w}" for w in recorder.warnings]
    report = write_report(output, report_dir, title=f"LUNA-AD replay of {bag.name}", notes=notes)
    return ReplayResult(output, report, player.report, dict(writer.counts), notes)


def _steady_clock():
    from rclpy.clock import Clock, ClockType
    return Clock(clock_type=ClockType.STEADY_TIME)


def _wait_for_matches(recorder: Recorder, timeout: float, stop: threading.Event) -> None:
    """Wait until each recording subscription matched the publishers the graph lists for its topic."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if all(sub.get_publisher_count() >= len(recorder.node.get_publishers_info_by_topic(topic)) > 0
               or not recorder.node.get_publishers_info_by_topic(topic)
               for topic, sub in recorder.subscriptions.items()):
            return
        time.sleep(0.02)


def run(args: argparse.Namespace) -> int:
    try:
        output, storage = resolve_output(args.output, args.storage)
    except (BagExistsError, ValueError) as err:
        print(f"luna replay: {err}", file=sys.stderr)
        return 2
    stop = stop_on_signals()
    try:
        with BagReader(args.bag) as reader:
            provided = set(args.topics or [t for t in reader.topics if is_replay_input(t)])
        stack = None if args.no_stack else topology_stack(args.topology, args.only, provided, args.params_dir)
        result = replay(Path(args.bag), output, storage, stack, args.rate, args.topics, args.ready_timeout,
                        args.settle, progress=not args.quiet, stop=stop, lockstep=not args.no_lockstep,
                        lockstep_timeout=args.lockstep_timeout)
    except (BagError, ValueError) as err:
        print(f"luna replay: {err}", file=sys.stderr)
        return 2
    for line in result.play.lines():
        print(line, file=sys.stderr)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"recorded {sum(result.recorded.values())} messages into {result.output}", file=sys.stderr)
    print(f"report: {result.report}", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", help="field bag to replay (directory, .mcap or .db3)")
    parser.add_argument("-o", "--output", required=True, help="bag to record the inputs and outputs into")
    parser.add_argument("-s", "--storage", choices=["mcap", "sqlite3"], default=None)
    parser.add_argument("-r", "--rate", type=float, default=1.0, help="playback speed factor")
    parser.add_argument("--topics", nargs="+", help="input topics to play (default: all but stack outputs, "
                        "/rosout, /parameter_events and lifecycle transition events)")
    parser.add_argument("--no-stack", action="store_true", help="do not start the stack (one is running)")
    parser.add_argument("--topology", type=Path, help="topology file (default: luna_bringup's)")
    parser.add_argument("--params-dir", type=Path, help="directory of <node>.yaml parameter files (default: "
                        "luna_bringup's config)")
    parser.add_argument("--only", default="", help="comma-separated process or node names to start (default: "
                        "every process except those whose outputs the bag provides, e.g. map_server)")
    parser.add_argument("--ready-timeout", type=float, default=120.0,
                        help="wait this long (s) for every node to be up (managed nodes: active) and for the "
                        "stack to subscribe to the inputs")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="keep recording this long (s) after the last message")
    parser.add_argument("--no-lockstep", action="store_true",
                        help="play in real time (times --rate) even when decisions take longer than T_d: cycles "
                        "that come due during a forward pass are skipped, as on a vehicle this slow")
    parser.add_argument("--lockstep-timeout", type=float, default=120.0,
                        help="in lock step, the longest (s) bag time waits at a decision instant")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def register(subparsers) -> None:
    """Add ``luna bag`` (luna_bags' commands, started with the stack's DDS profile) and ``luna replay``
    (which runs the stack, so it is the bring-up's) to the ``luna`` command."""
    from luna_bags import cli as bag_cli
    from luna_bringup.topology import fast_discovery_profile

    bag_cli.register(subparsers, fast_discovery_profile())
    p = subparsers.add_parser("replay", help="play a bag through the stack, record its outputs, write a report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
