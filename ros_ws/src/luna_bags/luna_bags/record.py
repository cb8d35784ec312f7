"""``luna bag record``: record live topics into a rosbag2 bag through raw (serialized) subscriptions.

Topics and types are discovered through the graph (``get_topic_names_and_types``) every
``discovery_period`` and subscribed as they appear, with a QoS that matches every publisher (see
``qos.recording_qos``). Messages are stamped with the node clock at receipt (sim time under
``--use-sim-time``), as ``ros2 bag record`` does. On SIGINT/SIGTERM the recorder stops taking new
work, drains what the middleware already delivered, and finalises the bag: nothing acknowledged is lost.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from tqdm import tqdm

from .ros import init_ros
from .msgtypes import MessageTypes, import_message_class
from .qos import recording_qos, to_bag_qos
from .writer import BagExistsError, BagWriter, resolve_output
from .signals import stop_on_signals


class Recorder:
    """Raw subscriptions on ``node`` feeding a ``BagWriter``; call ``discover()`` periodically."""

    def __init__(self, node: Node, writer: BagWriter, topics: list[str] | None = None,
                 include_hidden: bool = False) -> None:
        self.node = node
        self.writer = writer
        self.wanted = set(topics) if topics else None
        self.include_hidden = include_hidden
        self.subscriptions: dict[str, object] = {}
        self.skipped: dict[str, str] = {}  # topic -> why it is not recorded
        self.warnings: list[str] = []
        self.received = 0
        self._before_clock: list[tuple[str, bytes]] = []  # sim time not started yet (clock reads 0)
        # discover() may run in another thread than the callbacks (luna replay): one writer user at a time.
        self._lock = threading.Lock()

    def discover(self) -> list[str]:
        """Subscribe to topics that appeared since the last call; returns the new ones."""
        new: list[str] = []
        for topic, types in self.node.get_topic_names_and_types():
            if topic in self.subscriptions or topic in self.skipped:
                continue
            if self.wanted is not None and topic not in self.wanted:
                continue
            if self.wanted is None and not self.include_hidden and _hidden(topic):
                continue
            if self._subscribe(topic, types):
                new.append(topic)
        return new

    def missing(self) -> list[str]:
        """Requested topics not seen on the graph yet."""
        return sorted((self.wanted or set()) - set(self.subscriptions) - set(self.skipped))

    def _subscribe(self, topic: str, types: list[str]) -> bool:
        msgtype = types[0]
        if len(types) > 1:
            self.warnings.append(f"{topic}: published with several types {types}; recording {msgtype}")
        cls = import_message_class(msgtype)
        if cls is None:
            self.skipped[topic] = f"type {msgtype} has no Python message class here (package not installed)"
            self.warnings.append(f"{topic}: not recorded: {self.skipped[topic]}")
            return False
        publishers = self.node.get_publishers_info_by_topic(topic)
        offered = [p.qos_profile for p in publishers]
        type_hash = next((str(p.topic_type_hash) for p in publishers if p.topic_type_hash), "")
        with self._lock:
            complete = self.writer.add_topic(topic, msgtype, [to_bag_qos(q) for q in offered], type_hash)
        if not complete:
            self.warnings.append(f"{topic}: no .msg definition of {msgtype} found; recorded without an "
                                 "embedded definition")
        self.subscriptions[topic] = self.node.create_subscription(
            cls, topic, lambda data, t=topic: self._on_message(t, data), recording_qos(offered), raw=True)
        return True

    def _on_message(self, topic: str, data: bytes) -> None:
        now = self.node.get_clock().now().nanoseconds
        with self._lock:
            self.received += 1
            if now == 0:  # on sim time before the first /clock: keep, stamp with the first clock time
                self._before_clock.append((topic, data))
                return
            for early_topic, early in self._before_clock:
                self.writer.write(early_topic, now, early)
            self._before_clock.clear()
            self.writer.write(topic, now, data)

    def flush_pending(self) -> int:
        """Write messages still waiting for a first /clock (stamped 0: the clock never started)."""
        with self._lock:
            for topic, data in self._before_clock:
                self.writer.write(topic, 0, data)
            count = len(self._before_clock)
            self._before_clock.clear()
        if count:
            self.warnings.append(f"no /clock received (--use-sim-time): {count} messages stamped 0")
        return count


def _hidden(topic: str) -> bool:
    return any(part.startswith("_") for part in topic.split("/"))


def drain(executor: SingleThreadedExecutor, recorder: Recorder, quiet_period: float = 0.2,
          limit: float = 2.0) -> None:
    """Execute pending callbacks until none arrive for ``quiet_period`` s (at most ``limit`` s)."""
    deadline = time.monotonic() + limit
    last_count, quiet_since = recorder.received, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_period:
        executor.spin_once(timeout_sec=0.02)
        if recorder.received != last_count:
            last_count, quiet_since = recorder.received, time.monotonic()


def run(args: argparse.Namespace) -> int:
    try:
        path, storage = resolve_output(args.output, args.storage)
    except (BagExistsError, ValueError) as err:
        print(f"luna bag record: {err}", file=sys.stderr)
        return 2
    stop = stop_on_signals()
    init_ros(getattr(args, "fastdds_profile", None))
    node = Node("luna_bag_recorder", parameter_overrides=[Parameter("use_sim_time", value=args.use_sim_time)])
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    writer = BagWriter(path, storage, MessageTypes())
    recorder = Recorder(node, writer, args.topics or None, args.include_hidden)
    print(f"recording to {path} ({storage}); Ctrl-C stops and finalises the bag", file=sys.stderr)
    bar = tqdm(unit="msg", desc="recorded", disable=args.quiet, file=sys.stderr)
    next_discovery = next_flush = 0.0
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            now = time.monotonic()
            if now >= next_discovery:
                for topic in recorder.discover():
                    tqdm.write(f"subscribed to {topic}", file=sys.stderr)
                next_discovery = now + args.discovery_period
            if now >= next_flush:
                writer.flush()
                next_flush = now + args.flush_period
            executor.spin_once(timeout_sec=0.05)
            bar.update(recorder.received - bar.n)
        drain(executor, recorder)
        recorder.flush_pending()
        bar.update(recorder.received - bar.n)
    finally:
        bar.close()
        writer.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    for warning in recorder.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for topic in recorder.missing():
        print(f"warning: {topic}: requested but never published; not in the bag", file=sys.stderr)
    print(f"{path}: {sum(writer.counts.values())} messages", file=sys.stderr)
    for topic, count in sorted(writer.counts.items()):
        print(f"  {topic:40s} {count:8d}", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topics", nargs="*", help="topics to record (default: all, discovered continuously)")
    parser.add_argument("-o", "--output", help="bag directory (out.mcap / out.db3 pick the storage); "
                        "default rosbag2_<date>-<time>")
    parser.add_argument("-s", "--storage", choices=["mcap", "sqlite3"], default=None,
                        help="storage format (default mcap)")
    parser.add_argument("--use-sim-time", action="store_true", help="stamp messages with /clock time")
    parser.add_argument("--include-hidden", action="store_true", help="also record hidden topics (/_...)")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: never)")
    parser.add_argument("--discovery-period", type=float, default=0.5, help="graph polling period (s)")
    parser.add_argument("--flush-period", type=float, default=1.0,
                        help="write buffered messages to disk this often (s); bounds the loss on a crash")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
