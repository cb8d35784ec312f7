"""``luna bag play``: publish a bag's messages with their original timing, on bag time.

Messages go out as raw (serialized) publications in receive-time order, each at
``start + (t - t0) / rate`` of wall time. ``/clock`` carries bag time (``--clock-rate`` ticks, plus one
tick before any message that is ahead of the last tick), so a stack with ``use_sim_time`` runs on the
bag's time; a bag that recorded ``/clock`` itself (a simulation, ``luna bag from-scenario``) is played
with its own clock instead. Publishers offer the recorded QoS (transient local for map and route).

What cannot be played is skipped and reported, never fatal: topics whose type has no Python class
here, messages that do not decode (damaged chunks), per-topic header stamps that step back; the damage
the reader worked around (truncation, corrupt chunks) is reported alongside.

With ``hold`` (``luna replay``'s lock step), bag time stops at every multiple of ``hold.period_ns``: the
player publishes everything up to that instant and a ``/clock`` tick at it, calls ``hold.wait`` (e.g.
until the decision of that instant is out), and goes on with the schedule shifted by the wait.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from rosbags.interfaces import MessageDefinition, QosDurability
from rosgraph_msgs.msg import Clock
from builtin_interfaces.msg import Time
from tqdm import tqdm

from .ros import init_ros
from .msgtypes import MessageTypes, UnknownMessageType, import_message_class
from .qos import playback_qos
from .reader import BagError, BagIssue, BagMessage, BagReader
from .topics import CLOCK
from .signals import stop_on_signals



@dataclass
class PlayReport:
    published: Counter = field(default_factory=Counter)
    skipped_topics: dict[str, str] = field(default_factory=dict)  # topic -> why
    undecodable: Counter = field(default_factory=Counter)
    header_steps_back: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    issues: list[BagIssue] = field(default_factory=list)
    clock_source: str = "generated"  # "generated" | "bag" | "off"
    loops: int = 0

    def lines(self) -> list[str]:
        """The report as text lines: what was played, then everything skipped or damaged."""
        out = [f"published {sum(self.published.values())} messages on {len(self.published)} topics "
               f"(clock: {self.clock_source})"]
        out += [f"  {topic:40s} {count:8d}" for topic, count in sorted(self.published.items())]
        out += [f"skipped topic {topic}: {why}" for topic, why in sorted(self.skipped_topics.items())]
        out += [f"skipped {n} undecodable messages on {topic}" for topic, n in sorted(self.undecodable.items())]
        out += [f"{topic}: header stamp stepped back {n} times (played in receive order)"
                for topic, n in sorted(self.header_steps_back.items())]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"bag: {issue}" for issue in self.issues]
        return out


class Hold(Protocol):
    """Where and how long playback holds bag time (see the module docstring)."""

    period_ns: int

    def wait(self, instant_ns: int, stop: threading.Event) -> None:
        """Return once playback may go on past ``instant_ns`` (bag time, ns)."""


def _stamp_ns(msg: object) -> int | None:
    header = getattr(msg, "header", None)
    stamp = getattr(header, "stamp", None)
    if stamp is None or not hasattr(stamp, "nanosec"):
        return None
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _time_msg(ns: int) -> Time:
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


class Player:
    """Plays ``reader`` on ``node``: ``prepare()`` creates publishers, ``play()`` runs until the end."""

    def __init__(self, node: Node, reader: BagReader, types: MessageTypes | None = None, rate: float = 1.0,
                 start_offset: float = 0.0, topics: list[str] | None = None, loop: bool = False,
                 clock: str = "auto", clock_rate: float = 100.0, validate: bool = True,
                 hold: Hold | None = None) -> None:
        if not rate > 0.0:
            raise ValueError(f"--rate must be positive, got {rate}")
        if start_offset < 0.0:
            raise ValueError(f"--start must be >= 0 s, got {start_offset}")
        if clock not in ("auto", "generate", "bag", "off"):
            raise ValueError(f"clock mode {clock!r}: choose auto, generate, bag or off")
        self.node, self.reader, self.rate, self.loop = node, reader, rate, loop
        self.hold = hold
        self.types = types or MessageTypes()
        self.validate = validate
        self.clock_period = 1.0 / clock_rate if clock_rate > 0 else float("inf")
        self.report = PlayReport(issues=reader.issues)
        unknown = sorted(set(topics or []) - set(reader.topics))
        for topic in unknown:
            self.report.warnings.append(f"{topic}: requested but not in the bag")
        self.selected = [t for t in (topics or list(reader.topics)) if t in reader.topics]
        if clock == "auto":
            clock = "bag" if CLOCK in self.selected else "generate"
        self.report.clock_source = clock
        if clock != "bag" and CLOCK in self.selected:
            self.selected.remove(CLOCK)
        first, last = reader.time_range()
        self.first_ns, self.last_ns = first, last
        self.start_ns = first + int(round(start_offset * 1e9))
        self.publishers: dict[str, object] = {}
        self.clock_pub = node.create_publisher(Clock, CLOCK, 10) if clock == "generate" else None
        # Holding needs a /clock tick at the instant even when the bag's own clock is played.
        self.hold_clock_pub = self.clock_pub or (node.create_publisher(Clock, CLOCK, 10)
                                                 if hold is not None and clock == "bag" else None)
        self._last_stamp: dict[str, int] = {}
        self._last_clock = -1

    # -- set-up ------------------------------------------------------------------------------------

    def prepare(self) -> list[str]:
        """Create a publisher for every playable topic; returns the topics that will be played."""
        for topic in self.selected:
            info = self.reader.topics[topic]
            if info.count == 0:
                continue
            cls = import_message_class(info.msgtype)
            if cls is None:
                defined = "its definition is in the bag" if info.msgdef.data else "the bag has no definition"
                self.report.skipped_topics[topic] = (f"type {info.msgtype} is not installed here ({defined}); "
                                                     "install its interface package to play it")
                continue
            self._check_definition(topic, info.msgtype, info.msgdef, info.digest)
            self.publishers[topic] = self.node.create_publisher(cls, topic, playback_qos(info.offered_qos))
        return list(self.publishers)

    def _check_definition(self, topic: str, msgtype: str, msgdef: MessageDefinition, digest: str) -> None:
        try:
            self.types.ensure(msgtype)
        except UnknownMessageType:
            try:
                if not self.types.learn_from_bag(msgtype, msgdef):
                    self.report.warnings.append(f"{topic}: no definition of {msgtype}; messages are not checked")
                    return
            except UnknownMessageType as err:
                self.report.warnings.append(f"{topic}: {err}; messages are not checked")
                return
        local = self.types.typestore.hash_rihs01(msgtype)
        if digest and digest.startswith("RIHS01_") and digest != local and set(digest[7:]) != {"0"}:
            self.report.warnings.append(f"{topic}: recorded with a different definition of {msgtype} "
                                        f"({digest[:19]}... vs installed {local[:19]}...); messages that do "
                                        "not decode are skipped")

    def wait_for_subscribers(self, topics: list[str] | None = None, timeout: float = 30.0,
                             stop: threading.Event | None = None) -> list[str]:
        """Block until each topic (default: all played) has a subscriber; returns those still without one."""
        pending = [t for t in (topics or list(self.publishers)) if t in self.publishers]
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline and not (stop and stop.is_set()):
            pending = [t for t in pending if self.publishers[t].get_subscription_count() == 0]
            time.sleep(0.02)
        return pending

    # -- playing -----------------------------------------------------------------------------------

    def play(self, stop: threading.Event | None = None, progress: bool = True) -> PlayReport:
        stop = stop or threading.Event()
        total = sum(self.reader.topics[t].count for t in self.publishers)
        with tqdm(total=total, unit="msg", desc="playing", disable=not progress, file=sys.stderr) as bar:
            while not stop.is_set():
                self._publish_latched_before_start()
                self._play_once(stop, bar)
                if not self.loop or stop.is_set():
                    break
                self.report.loops += 1
                self._last_stamp.clear()
                self._last_clock = -1
                bar.reset()
        self.wait_for_acks()
        return self.report

    def wait_for_acks(self, timeout: float = 5.0) -> None:
        """Wait until reliable subscribers acknowledged everything published (before the process exits)."""
        deadline = time.monotonic() + timeout
        for topic, pub in self.publishers.items():
            left = max(0.0, deadline - time.monotonic())
            if not pub.wait_for_all_acked(Duration(seconds=left)):
                self.report.warnings.append(f"{topic}: not every subscriber acknowledged the last messages "
                                            f"within {timeout:.0f} s")

    def _publish_latched_before_start(self) -> None:
        """With --start, deliver the last message of each transient-local topic (map, route) before it."""
        if self.start_ns <= self.first_ns:
            return
        latched = [t for t in self.publishers
                   if any(q.durability is QosDurability.TRANSIENT_LOCAL for q in self.reader.topics[t].offered_qos)]
        last: dict[str, BagMessage] = {}
        for msg in self.reader.messages(latched, stop_ns=self.start_ns):
            last[msg.topic] = msg
        for msg in last.values():
            self._publish(msg)

    def _play_once(self, stop: threading.Event, bar: tqdm) -> None:
        wall0 = time.monotonic()
        next_tick = wall0
        next_hold = None
        if self.hold is not None:
            period = self.hold.period_ns
            next_hold = -(-self.start_ns // period) * period  # the first multiple at or after the start

        def bag_now() -> int:
            return self.start_ns + int((time.monotonic() - wall0) * self.rate * 1e9)

        for msg in self.reader.messages(list(self.publishers), start_ns=self.start_ns):
            while next_hold is not None and msg.timestamp > next_hold and not stop.is_set():
                # Everything up to the instant is out: stop bag time there until the hold lets go.
                if self._last_clock < next_hold and self.hold_clock_pub is not None:
                    self.hold_clock_pub.publish(Clock(clock=_time_msg(next_hold)))
                    self._last_clock = next_hold
                held = time.monotonic()
                self.hold.wait(next_hold, stop)
                wall0 += time.monotonic() - held
                next_tick = time.monotonic()
                next_hold += self.hold.period_ns
            due = wall0 + (msg.timestamp - self.start_ns) / 1e9 / self.rate
            while not stop.is_set():
                now = time.monotonic()
                if now >= due:
                    break
                if self.clock_pub is not None and now >= next_tick:
                    # Never past the next message: bag_now() reads the clock again, later than ``now``
                    # under load, and a tick beyond the stamp would also run past a hold's instant.
                    self._tick(min(bag_now(), msg.timestamp))
                    next_tick = now + self.clock_period
                    continue
                stop.wait(min(due, next_tick if self.clock_pub is not None else due) - now)
            if stop.is_set():
                return
            if self.clock_pub is not None and msg.timestamp > self._last_clock:
                self._tick(msg.timestamp)
            self._publish(msg)
            bar.update(1)

    def _tick(self, bag_ns: int) -> None:
        bag_ns = max(bag_ns, self._last_clock)  # the generated clock never runs backwards within a loop
        self.clock_pub.publish(Clock(clock=_time_msg(bag_ns)))
        self._last_clock = bag_ns

    def _publish(self, msg: BagMessage) -> None:
        if self.validate and not self._check(msg):
            return
        self.publishers[msg.topic].publish(msg.data)
        self.report.published[msg.topic] += 1
        if msg.topic == CLOCK:
            self._last_clock = max(self._last_clock, msg.timestamp)  # a bag's clock carries its receive time

    def _check(self, msg: BagMessage) -> bool:
        msgtype = self.reader.topics[msg.topic].msgtype
        if not self.types.known(msgtype):
            return True  # nothing to check against (warned in prepare)
        try:
            decoded = self.types.deserialize(msg.data, msgtype)
        except Exception:  # rosbags raises assorted errors on malformed CDR
            self.report.undecodable[msg.topic] += 1
            return False
        stamp = _stamp_ns(decoded)
        if stamp is not None:
            if stamp < self._last_stamp.get(msg.topic, -1):
                self.report.header_steps_back[msg.topic] += 1
            self._last_stamp[msg.topic] = max(stamp, self._last_stamp.get(msg.topic, -1))
        return True


def run(args: argparse.Namespace) -> int:
    try:
        reader = BagReader(args.bag)
    except BagError as err:
        print(f"luna bag play: {err}", file=sys.stderr)
        return 2
    for issue in reader.issues:
        print(f"bag: {issue}", file=sys.stderr)
    stop = stop_on_signals()
    init_ros(getattr(args, "fastdds_profile", None))
    node = Node("luna_bag_player")
    try:
        player = Player(node, reader, rate=args.rate, start_offset=args.start, topics=args.topics,
                        loop=args.loop, clock=args.clock, clock_rate=args.clock_rate, validate=not args.no_check)
        if not player.prepare():
            print("luna bag play: nothing to play; " + "; ".join(player.report.lines()[1:]), file=sys.stderr)
            return 1
        if args.wait_for_subscribers:
            for topic in player.wait_for_subscribers(timeout=args.wait_for_subscribers, stop=stop):
                print(f"warning: {topic}: no subscriber after {args.wait_for_subscribers} s", file=sys.stderr)
        report = player.play(stop, progress=not args.quiet)
    except ValueError as err:
        print(f"luna bag play: {err}", file=sys.stderr)
        return 2
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        reader.close()
    for line in report.lines():
        print(line, file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", help="bag directory, or a single .mcap / .db3 file")
    parser.add_argument("-r", "--rate", type=float, default=1.0, help="playback speed factor")
    parser.add_argument("--start", type=float, default=0.0, help="start this many seconds into the bag")
    parser.add_argument("--topics", nargs="+", help="play only these topics")
    parser.add_argument("-l", "--loop", action="store_true", help="play again from the start when done")
    parser.add_argument("--clock", choices=["auto", "generate", "bag", "off"], default="auto",
                        help="/clock source: the bag's own /clock if it has one (auto), generated, or none")
    parser.add_argument("--clock-rate", type=float, default=100.0, help="generated /clock ticks per s")
    parser.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="TIMEOUT",
                        help="before playing, wait up to TIMEOUT s for a subscriber on every topic")
    parser.add_argument("--no-check", action="store_true",
                        help="publish without decoding each message first (faster for large messages; damaged "
                        "messages then reach the subscribers)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
