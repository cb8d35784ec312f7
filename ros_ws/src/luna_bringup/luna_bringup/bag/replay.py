"""``luna replay``: play a field bag through the stack, record inputs and outputs, write a report.

1. start the stack (the ``luna up`` topology, every node on ``use_sim_time``; processes whose outputs
   the bag provides, e.g. map_server for a bag with a lane graph, are left out) unless ``--no-stack``
   (a stack already running, e.g. from ``ros2 launch`` on the vehicle computer);
2. wait until every node of the topology is up (managed nodes: active, or failed for good) and the
   stack subscribes to the bag's input topics (never a fixed sleep);
3. play the bag's inputs (``luna bag play`` semantics; recorded stack outputs are left out so they do
   not collide with the live ones) while recording every topic on the graph into ``-o`` on bag time;
4. let the stack settle, stop it, finalise the bag, and write ``<out>/report/report.html`` (+ ``.md``,
   PNGs) with ``report.write_report``; the stack's log goes to ``<out>/report/stack.log``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter

from .ros import init_ros
from .msgtypes import MessageTypes
from .play import PlayReport, Player
from .reader import BagError, BagReader
from .record import Recorder, drain
from .topics import is_replay_input
from .writer import BagExistsError, BagWriter, resolve_output

#: Starts the stack, logging to the given file; the context manager stops it on exit.
StackStarter = Callable[[Path], AbstractContextManager]


@dataclass
class TopologyStack:
    """The ``luna up`` topology as a StackStarter (all nodes with ``use_sim_time``), its node names, and
    the processes left out because the bag provides their outputs."""

    topology: object  # luna_bringup.topology.Topology
    nodes: list[str]
    left_out: dict[str, list[str]]  # process -> its output topics the bag provides

    def __call__(self, log_path: Path) -> AbstractContextManager:
        from luna_bringup.supervisor import Supervisor
        from luna_bringup.topology import config_dir

        return Supervisor(self.topology, config_dir(), use_sim_time=True,
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


def topology_stack(topology: Path | None = None, only: str = "", provided: set[str] = frozenset()
                   ) -> TopologyStack:
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
    check = Supervisor(spec, config_dir(), use_sim_time=True)
    for process in spec.processes:
        check.command(process)
    return TopologyStack(spec, [n for p in spec.processes for n in p.nodes], left_out)


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


@dataclass
class ReplayResult:
    output: Path
    report: Path
    play: PlayReport
    recorded: dict[str, int]
    notes: list[str]  # how the run went: dead processes, nodes not ready, inputs nobody subscribed to


def replay(bag: Path, output: Path, storage: str = "mcap", stack: StackStarter | None = None,
           rate: float = 1.0, topics: list[str] | None = None, ready_timeout: float = 120.0,
           settle: float = 3.0, progress: bool = True, stop: threading.Event | None = None) -> ReplayResult:
    """Play ``bag`` through ``stack`` (None: a stack already running) and record everything into ``output``."""
    stop = stop or threading.Event()
    reader = BagReader(bag)  # BagError for an unreadable bag, before anything starts
    if topics is None:
        topics = [t for t in reader.topics if is_replay_input(t)]
    writer = BagWriter(output, storage, MessageTypes())
    report_dir = output / "report"
    report_dir.mkdir()
    own_context = not rclpy.ok()
    if own_context:
        init_ros()
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
    try:
        player = Player(node, reader, rate=rate, topics=topics)
        player.prepare()
        readiness = StackReadiness(node, list(getattr(stack, "nodes", [])))
        died: list[str] = []
        with (stack(report_dir / "stack.log") if stack else nullcontext()) as running:
            started = time.monotonic()
            not_ready = readiness.wait(ready_timeout, stop)
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
            died = [f"process {p.spec.name} exited with code {p.popen.returncode} during the replay"
                    for p in getattr(running, "dead", lambda: [])()]
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
    from .report import write_report  # matplotlib: imported only when a report is written

    notes = [f"process {p} not started: the bag provides its output {', '.join(t)}"
             for p, t in getattr(stack, "left_out", {}).items()]
    notes += died + [f"node {n} was not ready when playback started" for n in not_ready]
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
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with BagReader(args.bag) as reader:
            provided = set(args.topics or [t for t in reader.topics if is_replay_input(t)])
        stack = None if args.no_stack else topology_stack(args.topology, args.only, provided)
        result = replay(Path(args.bag), output, storage, stack, args.rate, args.topics, args.ready_timeout,
                        args.settle, progress=not args.quiet, stop=stop)
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
    parser.add_argument("--only", default="", help="comma-separated process or node names to start (default: "
                        "every process except those whose outputs the bag provides, e.g. map_server)")
    parser.add_argument("--ready-timeout", type=float, default=120.0,
                        help="wait this long (s) for every node to be up (managed nodes: active) and for the "
                        "stack to subscribe to the inputs")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="keep recording this long (s) after the last message")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
