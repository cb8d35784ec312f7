"""``luna-offline frames``: 2 Hz frames with scene descriptors from scenario sources or bags (DESIGN Sec. 7).

Each scenario's logged ego (the expert) is sampled every 1/rate s; at each sample the scene descriptor
xi_t is built from the expert state, the logged objects and lights, the route and the lane graph. The
"recent decisions" of a frame are the expert's own decisions over the preceding frame intervals,
labelled from its motion (``expert_decision``), as the paper's descriptor carries the last two.

A rosbag2 bag (MCAP or sqlite3, ``luna_bags.reader``; damaged parts are skipped and reported)
is read the same way: the recorded odometry plays the expert, and each frame takes the latest
objects, lights, route and lane graph recorded at or before it (by header stamp), as the
``scene_descriptor`` node would have held them (``bag_frames``).

Output: JSON lines, one frame per line: id, scenario identity (so a simulation-grounded scorer can
reload the scenario and time), the expert's decision over the next interval, and the descriptor.
"""

from __future__ import annotations

import argparse
import bisect
import json
import lzma
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from luna_core.lanes import lane_map
from luna_core.scene import SceneConfig, SceneInputError, build_scene, scene_from_dict, scene_to_dict
from luna_core.types import EgoState, SceneDescriptor

FRAME_FORMAT = 1
TAG_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")  # an on-policy collection's own id suffix (``--tag``)
# Expert decision labels from motion over one frame interval.
ACCEL_THRESHOLD = 0.5  # m/s^2 mean acceleration that counts as accelerating / decelerating
STOP_SPEED = 0.5  # m/s below which a non-accelerating ego is stopping / stopped


class FrameError(ValueError):
    """A frame file or a frame source is invalid (the message says which line / scenario)."""


@dataclass
class Frame:
    id: str
    scenario: str
    time: float
    scene: SceneDescriptor
    origin: dict[str, Any]  # scenario identity: name, type, split, source, suite / file
    expert_decision: str = ""  # the expert's decision over [time, time + 1/rate] ("" at the end)

    def to_json(self) -> dict[str, Any]:
        return {"format": FRAME_FORMAT, "id": self.id, "scenario": self.scenario, "time": self.time,
                "origin": self.origin, "expert_decision": self.expert_decision,
                "scene": scene_to_dict(self.scene)}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "frame") -> "Frame":
        try:
            if data.get("format") != FRAME_FORMAT:
                raise FrameError(f"{where}: unsupported frame format {data.get('format')!r}")
            return cls(str(data["id"]), str(data["scenario"]), float(data["time"]),
                       scene_from_dict(data["scene"]), dict(data.get("origin", {})),
                       str(data.get("expert_decision", "")))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, FrameError):
                raise
            raise FrameError(f"{where}: {exc}") from exc


def _ego_at(track: Any, time: float, dt: float) -> EgoState | None:
    """The expert's rear-axle state at ``time`` (speed along the heading, acceleration by differences)."""
    now = track.state_at(time)
    if now is None:
        return None
    before = track.state_at(time - dt)
    v = now.vx * math.cos(now.heading) + now.vy * math.sin(now.heading)
    a = 0.0
    if before is not None:
        v0 = before.vx * math.cos(before.heading) + before.vy * math.sin(before.heading)
        a = (v - v0) / dt
    return EgoState(time, now.x, now.y, now.heading, v, a)


def expert_decision(graph: Any, start: EgoState, end: EgoState, interval: float) -> str:
    """The expert's decision over one interval, labelled from its motion: longitudinal from the mean
    acceleration (and a stop below STOP_SPEED), lateral from a move to the left / right neighbour lane."""
    accel = (end.velocity - start.velocity) / interval
    if end.velocity < STOP_SPEED and accel <= ACCEL_THRESHOLD:
        lon = "S"
    elif accel > ACCEL_THRESHOLD:
        lon = "A"
    elif accel < -ACCEL_THRESHOLD:
        lon = "D"
    else:
        lon = "C"
    lat = "K"
    if graph.lanes:
        lm = lane_map(graph)
        a = lm.nearest_lane(start.x, start.y, start.heading)
        b = lm.nearest_lane(end.x, end.y, end.heading)
        if a is not None and b is not None and a.lane_id != b.lane_id:
            left, right = lm.neighbours(a.lane_id)
            lat = "L" if b.lane_id == left else "R" if b.lane_id == right else "K"
    return lon + ("K" if lon == "S" else lat)


def scenario_frames(scenario: Any, rate: float = 2.0, origin: dict[str, Any] | None = None,
                    config: SceneConfig | None = None) -> Iterator[Frame]:
    """Frames of one ``luna_bridge.scenario.Scenario`` every 1/rate s along its expert track."""
    if not rate > 0.0:
        raise FrameError(f"frame rate must be positive, got {rate}")
    interval = 1.0 / rate
    dt = 0.1
    # Frames cover the scenario from t = 0; the expert's log may start earlier (history), and two
    # earlier samples give the first frames their recent decisions.
    times = np.round(np.arange(-2 * interval, scenario.duration + 1e-9, interval), 6)
    egos = [_ego_at(scenario.expert, float(t), dt) for t in times]
    origin = {"scenario": scenario.name, "type": scenario.scenario_type, "split": scenario.split,
              "source": scenario.source, **(origin or {})}
    decisions = [expert_decision(scenario.lane_graph, a, b, interval) if a is not None and b is not None else ""
                 for a, b in zip(egos[:-1], egos[1:])] + [""]
    for k, (t, ego) in enumerate(zip(times, egos)):
        if t < 0.0 or ego is None:
            continue
        recent = [d for d in decisions[max(k - 2, 0):k] if d]
        scene = build_scene(ego, scenario.objects_at(float(t)), scenario.lights_at(float(t)), scenario.route,
                            scenario.lane_graph, recent, scenario.vehicle, config)
        yield Frame(f"{scenario.name}@{t:07.2f}", scenario.name, round(float(t), 3), scene, origin,
                    decisions[k])


def on_policy_frames(scenario: Any, planner: str, rate: float = 2.0, origin: dict[str, Any] | None = None,
                     config: SceneConfig | None = None, replan_every: int = 5,
                     reactive: bool = False, tag: str = "") -> Iterator[Frame]:
    """Frames of the states a planner itself visits in closed loop on ``scenario`` (DAgger).

    The planner (any ``luna-bridge`` planner name, e.g. ``luna``: the stack with the current student)
    drives the scenario, non-reactively or with ``reactive`` agents (IDM along their logged paths, as in
    the R evaluation), replanning every ``replan_every`` simulator steps; every 1/rate s its ego state
    becomes a frame whose descriptor is built from that state and the objects of the run, as the stack saw
    them (in a reactive run: where the reactive agents were). ``origin['ego']`` carries the closed-loop
    state, so the simulation-grounded teacher (``luna_bridge.action_scorer``) labels the frame from where
    the student actually was, against the logged agents, as the oracle decision source does in closed loop
    (in both modes: the teacher's hindsight is the log). Ids are ``<scenario>@<t>~<planner>``, with
    ``~reactive`` appended for a reactive run and ``~<tag>`` for a tagged collection: the same scenario
    group as its expert frames (held out together), never the same item. The tag tells apart collections
    of the same scenarios by other students (DAgger iterations): without it their ids coincide, and a bank
    that holds one skips the other as already done.
    """
    from dataclasses import asdict

    from luna_bridge.evaluate import closed_loop_run
    from luna_bridge.scenario import SIM_DT
    from luna_bridge.stack_planner import current_settings

    if not rate > 0.0:
        raise FrameError(f"frame rate must be positive, got {rate}")
    # As evaluated: a stack planner's student decides every T_d (without its decision source the planner
    # would search without decisions, and the frames would not be the stack's states).
    log, _ = closed_loop_run(scenario, planner, reactive, replan_every, current_settings())
    if log.error:
        raise FrameError(f"{scenario.name}: the {planner} run failed: {log.error}")
    interval = 1.0 / rate
    stride = max(int(round(interval / SIM_DT)), 1)
    picks = list(range(0, len(log.t), stride))
    egos = [log.ego[k] for k in picks]
    decisions = [expert_decision(scenario.lane_graph, a, b, interval) for a, b in zip(egos[:-1], egos[1:])] + [""]
    origin = {"scenario": scenario.name, "type": scenario.scenario_type, "split": scenario.split,
              "source": scenario.source, **(origin or {}), "policy": planner,
              **({"reactive": True} if reactive else {}), **({"tag": tag} if tag else {})}
    suffix = f"~{planner}" + ("~reactive" if reactive else "") + (f"~{tag}" if tag else "")
    for n, k in enumerate(picks):
        t = round(float(log.t[k]), 3)
        ego = egos[n]
        try:
            scene = build_scene(ego, log.objects[k], log.lights[k], scenario.route, scenario.lane_graph,
                                [d for d in decisions[max(n - 2, 0):n] if d], scenario.vehicle, config)
        except SceneInputError as exc:  # e.g. the run left the map: no descriptor, no frame
            print(f"[frames] {scenario.name} t={t:.2f} s ({planner}{', reactive' if reactive else ''}): {exc}; "
                  "frame skipped", file=sys.stderr)
            continue
        yield Frame(f"{scenario.name}@{t:07.2f}{suffix}", scenario.name, t, scene,
                    {**origin, "ego": asdict(ego)}, decisions[n])


# --------------------------------------------------------------------------------------------------
# Bags
# --------------------------------------------------------------------------------------------------

#: How old a recorded input may be at a frame's instant and still describe it (s).
MAX_EGO_AGE = 0.3
MAX_OBJECTS_AGE = 0.5
MAX_LIGHTS_AGE = 1.0


@dataclass
class BagInputs:
    """The stack's inputs recorded in a bag, as luna_core types sorted by header stamp."""

    egos: list[EgoState]
    objects: list[Any]  # TrackedObjects
    lights: list[Any]  # TrafficLights
    routes: list[Any]  # Route
    graphs: list[Any]  # LaneGraph
    issues: list[str]  # what the reader worked around and what could not be decoded
    _stamps: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def latest(self, kind: str, stamp: float, max_age: float = math.inf) -> Any | None:
        """The latest ``kind`` sample stamped at or before ``stamp`` and at most ``max_age`` old."""
        samples = getattr(self, kind)
        if kind not in self._stamps:
            self._stamps[kind] = [x.stamp for x in samples]
        i = bisect.bisect_right(self._stamps[kind], stamp + 1e-9)
        if i == 0 or stamp - samples[i - 1].stamp > max_age:
            return None
        return samples[i - 1]


def read_bag_inputs(path: str | Path) -> BagInputs:
    """Decode odometry, objects, lights, route and lane graph from a bag (topics of DESIGN Sec. 5)."""
    from rclpy.serialization import deserialize_message

    from luna_bags.msgtypes import import_message_class
    from luna_bags.reader import BagError, BagReader
    from luna_bags.topics import LANE_GRAPH, OBJECTS, ODOMETRY, ROUTE, TRAFFIC_LIGHTS
    from luna_msgs_py import convert as C

    wanted = {ODOMETRY: ("nav_msgs/msg/Odometry", C.odometry_to_ego, "egos"),
              OBJECTS: ("luna_msgs/msg/TrackedObjects", C.msg_to_objects, "objects"),
              TRAFFIC_LIGHTS: ("luna_msgs/msg/TrafficLightStateArray", C.msg_to_lights, "lights"),
              ROUTE: ("luna_msgs/msg/Route", C.msg_to_route, "routes"),
              LANE_GRAPH: ("luna_msgs/msg/LaneGraph", C.msg_to_lane_graph, "graphs")}
    out: dict[str, list[Any]] = {kind: [] for _, _, kind in wanted.values()}
    issues: list[str] = []
    undecodable: dict[str, int] = {}
    try:
        reader = BagReader(path)
    except BagError as exc:
        raise FrameError(str(exc)) from None
    with reader:
        classes = {}
        for topic, (msgtype, _, _) in wanted.items():
            info = reader.topics.get(topic)
            if info is None:
                continue
            if info.msgtype != msgtype:
                raise FrameError(f"{path}: {topic} holds {info.msgtype}, expected {msgtype}")
            classes[topic] = import_message_class(msgtype)
            if classes[topic] is None:
                raise FrameError(f"{path}: the message class of {msgtype} is not importable (luna_msgs installed?)")
        for msg in reader.messages(list(classes)):
            _, convert, kind = wanted[msg.topic]
            try:
                out[kind].append(convert(deserialize_message(msg.data, classes[msg.topic])))
            except Exception:  # noqa: BLE001 - malformed CDR or values from a damaged bag: counted, reported
                undecodable[msg.topic] = undecodable.get(msg.topic, 0) + 1
        issues += [str(i) for i in reader.issues]
    issues += [f"{n} undecodable message(s) on {t} skipped" for t, n in sorted(undecodable.items())]
    for samples in out.values():
        samples.sort(key=lambda x: x.stamp)
    egos = out["egos"]
    # Odometry carries no acceleration: the speed's difference over one odometry interval.
    for before, now in zip(egos[:-1], egos[1:]):
        dt = now.stamp - before.stamp
        now.acceleration = (now.velocity - before.velocity) / dt if dt > 1e-3 else before.acceleration
    return BagInputs(issues=issues, **out)


def bag_frames(path: str | Path, rate: float = 2.0, config: SceneConfig | None = None,
               name: str | None = None) -> tuple[list[Frame], list[str]]:
    """Frames every 1/rate s from the first odometry sample of the bag at ``path`` to its last one,
    and the issues met (bag damage, frames skipped for want of fresh odometry or objects)."""
    if not rate > 0.0:
        raise FrameError(f"frame rate must be positive, got {rate}")
    from luna_bags.topics import LANE_GRAPH, OBJECTS, ODOMETRY, ROUTE
    from luna_core.types import Route

    inputs = read_bag_inputs(path)
    issues = list(inputs.issues)
    name = name or Path(path).resolve().name
    if not inputs.egos:
        raise FrameError(f"{path}: no odometry on {ODOMETRY}: nothing to describe")
    if not inputs.graphs:
        raise FrameError(f"{path}: no lane graph on {LANE_GRAPH} (record the map_server's output with the bag)")
    if not inputs.objects:
        raise FrameError(f"{path}: no tracked objects on {OBJECTS}")
    if not inputs.routes:
        issues.append(f"no route on {ROUTE}: frames carry navigation None and no target road")
    interval = 1.0 / rate
    start = inputs.egos[0].stamp
    times = start + interval * np.arange(int(math.floor((inputs.egos[-1].stamp - start) / interval + 1e-9)) + 1)
    egos = [inputs.latest("egos", float(t), MAX_EGO_AGE) for t in times]
    decisions = [expert_decision(inputs.latest("graphs", float(t)) or inputs.graphs[0], a, b, interval)
                 if a is not None and b is not None else "" for t, a, b in zip(times, egos[:-1], egos[1:])] + [""]
    origin = {"scenario": name, "source": "bag", "bag": str(path)}
    frames = []
    for k, (t, ego) in enumerate(zip(times, egos)):
        rel = round(float(t - start), 3)
        objects = inputs.latest("objects", float(t), MAX_OBJECTS_AGE)
        if ego is None or objects is None:
            missing = "odometry" if ego is None else "tracked objects"
            issues.append(f"t={rel:.2f} s: no {missing} within {MAX_EGO_AGE if ego is None else MAX_OBJECTS_AGE} s;"
                          " frame skipped")
            continue
        graph = inputs.latest("graphs", float(t)) or inputs.graphs[0]  # latched: may be stamped later
        route = inputs.latest("routes", float(t)) or (inputs.routes[0] if inputs.routes else Route(float(t)))
        recent = [d for d in decisions[max(k - 2, 0):k] if d]
        try:
            scene = build_scene(ego, objects, inputs.latest("lights", float(t), MAX_LIGHTS_AGE), route, graph,
                                recent, config=config)
        except SceneInputError as exc:
            issues.append(f"t={rel:.2f} s: {exc}; frame skipped")
            continue
        frames.append(Frame(f"{name}@{rel:07.2f}", name, rel, scene, {**origin, "stamp": float(t)}, decisions[k]))
    return frames, issues


def read_frames(path: str | Path) -> list[Frame]:
    """All frames of a JSON-lines file (``.xz``-compressed too, as the committed ones are); raises
    ``FrameError`` naming the line of any bad record."""
    frames, seen = [], set()
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise FrameError(f"{where}: not JSON ({exc})") from exc
            frame = Frame.from_json(data, where)
            if frame.id in seen:
                raise FrameError(f"{where}: duplicate frame id {frame.id!r}")
            seen.add(frame.id)
            frames.append(frame)
    return frames


def _frame_line(frame: Frame) -> str:
    return json.dumps(frame.to_json(), separators=(",", ":")) + "\n"


def write_frames(frames: Iterable[Frame], path: str | Path) -> int:
    """Write frames atomically (a partial file never replaces a good one); returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for frame in frames:
                f.write(_frame_line(frame))
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


Source = tuple[str, Callable[[], tuple[str, list[Frame]]]]  # (label, load -> (name, frames))


def _scenario_source(load: Callable[[], Any], origin: dict[str, Any], rate: float, on_policy: str = "",
                     **policy: Any) -> tuple[str, list[Frame]]:
    """One scenario's frames: the expert's, or with ``on_policy`` those of that planner's closed loop
    (``policy``: ``on_policy_frames``' replan_every, reactive and tag)."""
    scenario = load()
    if on_policy:
        return scenario.name, list(on_policy_frames(scenario, on_policy, rate, origin, **policy))
    return scenario.name, list(scenario_frames(scenario, rate, origin))


def _bag_source(path: Path, rate: float) -> tuple[str, list[Frame]]:
    frames, issues = bag_frames(path, rate)
    for issue in issues:  # reported, not fatal: the frames that could be built are kept
        print(f"[frames] {path}: {issue}", file=sys.stderr)
    return Path(path).resolve().name, frames


def _sources(args: argparse.Namespace) -> list[Source]:
    """(label, loader) of every requested scenario and bag; loading happens one at a time later."""
    sources: list[Source] = []
    policy = ({"on_policy": args.on_policy, "replan_every": args.replan_every, "reactive": args.reactive,
               "tag": args.tag} if args.on_policy else {})
    if args.suite:
        from luna_bridge.scenarios.registry import load_entry, suite_refs

        for suite in args.suite:
            for _name, source, loader in suite_refs(suite)[::args.every]:
                sources.append((source, partial(_scenario_source, partial(load_entry, source, loader),
                                                {"suite": suite, "file": source}, args.rate, **policy)))
    if args.scenario:
        from luna_bridge.scenarios.format import load_scenario

        for path in args.scenario:
            sources.append((str(path), partial(_scenario_source, partial(load_scenario, path), {"file": str(path)},
                                               args.rate, **policy)))
    for bag in args.bag or []:
        sources.append((str(bag), partial(_bag_source, bag, args.rate)))
    return sources


class FrameJournal:
    """The frames of a long run written source by source, so that an interrupted run resumes.

    Frames go to ``<out>.partial``, each finished source adds a line to ``<out>.progress`` (its label,
    name and the partial file's size after it, fsync'ed after the frames); ``finish`` renames the
    partial file to ``<out>`` and removes the progress file. On a rerun with the progress file present,
    the partial file is cut back to the last finished source (a source interrupted halfway is done
    again) and the finished sources are skipped. On-policy frames cost a closed-loop run per scenario:
    hours for a training suite.
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.progress = self.out.with_name(self.out.name + ".progress")
        self.done: dict[str, str] = {}  # source label -> scenario / bag name
        self.frames = 0
        size = 0
        if self.progress.exists() and self.partial.exists():
            for line in self.progress.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # a torn last line: that source was not finished
                    break
                self.done[record["source"]] = record["name"]
                size, self.frames = record["bytes"], record["frames"]
        else:
            self.progress.write_text("", encoding="utf-8")
        with self.partial.open("a+b") as f:
            f.truncate(size)

    def add(self, label: str, name: str, frames: Iterable[Frame]) -> int:
        """Append one source's frames, durably, then record the source as finished; returns the count."""
        n = 0
        with self.partial.open("a", encoding="utf-8") as f:
            for frame in frames:
                f.write(_frame_line(frame))
                n += 1
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        self.frames += n
        self.done[label] = name
        with self.progress.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"source": label, "name": name, "frames": self.frames, "bytes": size}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return n

    def finish(self) -> int:
        """Put the frames at ``out`` (atomically) and drop the progress file; returns the frame count."""
        os.replace(self.partial, self.out)
        self.progress.unlink(missing_ok=True)
        return self.frames


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if not (args.suite or args.scenario or args.bag):
        raise SystemExit("luna-offline frames: give --suite NAME, --scenario FILE and/or --bag DIR")
    if args.threads < 1:
        raise SystemExit(f"luna-offline frames: --threads must be at least 1, got {args.threads}")
    if args.reactive and not args.on_policy:
        raise SystemExit("luna-offline frames: --reactive applies to --on-policy runs (expert frames have no "
                         "closed loop)")
    if args.tag and not args.on_policy:
        raise SystemExit("luna-offline frames: --tag applies to --on-policy runs (expert frames of a scenario are "
                         "one set)")
    if args.tag and not TAG_PATTERN.fullmatch(args.tag):
        raise SystemExit(f"luna-offline frames: --tag {args.tag!r}: use letters, digits, '_', '.' and '-' only "
                         "(it becomes part of every frame id)")
    if args.on_policy:
        import torch

        # torch's default of one thread per core, in two commands side by side on 2 cores, made each
        # closed-loop run ~20x slower: its threads spin against each other.
        torch.set_num_threads(args.threads)
    if args.on_policy and (args.student or args.k is not None):
        from luna_bridge.stack_planner import StackSettings, use_settings

        defaults = StackSettings()
        use_settings(StackSettings(student=args.student or defaults.student,
                                   k=defaults.k if args.k is None else args.k))
    journal = FrameJournal(args.out)
    sources = _sources(args)
    if journal.done:
        print(f"[frames] resuming {args.out}: {len(journal.done)} of {len(sources)} sources already written "
              f"({journal.frames} frames)", file=sys.stderr)
    failures: list[str] = []
    taken = {name: label for label, name in journal.done.items()}  # frame ids must be unique
    resumed = set(journal.done)
    for label, load in tqdm(sources, desc="sources", unit="src"):
        if label in resumed:
            continue
        try:
            name, frames = load()
            if name in taken:
                raise FrameError(f"name {name!r} already taken by {taken[name]}")
        except Exception as exc:  # noqa: BLE001 - a bad source is reported and skipped, never silently
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        taken[name] = label
        journal.add(label, name, frames)
    n = journal.finish()
    for failure in failures:
        print(f"[frames] skipped {failure}", file=sys.stderr)
    print(f"[frames] wrote {n} frames to {args.out}" + (f"; {len(failures)} source(s) skipped" if failures else ""))
    return 0 if n and not failures else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("frames", help="2 Hz frames with scene descriptors from scenario sources",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append",
                   help="scenario suite (synthetic-train, synthetic-hard, synthetic-random, commonroad) or a "
                        "directory of scenario files; repeatable")
    p.add_argument("--scenario", action="append", type=Path, help="scenario file; repeatable")
    p.add_argument("--bag", action="append", type=Path,
                   help="rosbag2 bag (directory or .mcap/.db3 file) with the stack's input topics; repeatable")
    p.add_argument("--rate", type=float, default=2.0, help="frames per second (default 2)")
    p.add_argument("--on-policy", default="", metavar="PLANNER",
                   help="DAgger: frames of the states PLANNER (a luna-bridge planner, e.g. luna) visits in closed "
                        "loop (non-reactive unless --reactive) instead of the expert's; the teacher labels them "
                        "from those states")
    p.add_argument("--reactive", action="store_true",
                   help="--on-policy: drive with reactive agents (the R evaluation's), frames ~reactive")
    p.add_argument("--tag", default="", help="--on-policy: appended to every frame id (~TAG) and kept in its origin, "
                   "so collections of the same scenarios by other students (DAgger iterations) stay distinct items")
    p.add_argument("--replan-every", type=int, default=5, help="--on-policy: simulator steps between plans")
    p.add_argument("--student", default="", help="--on-policy with a stack planner: the student folder (default: "
                   "models/student)")
    p.add_argument("--k", type=int, default=None, help="--on-policy with a stack planner: retrieved items per decision")
    p.add_argument("--threads", type=int, default=1, help="--on-policy: torch CPU threads of the closed-loop runs "
                   "(1: two commands side by side, e.g. on two folders of a suite, share 2 cores)")
    p.add_argument("--every", type=int, default=1, help="every N-th scenario of each --suite (sorted; an even subset "
                   "over scenario types)")
    p.add_argument("--out", type=Path, required=True,
                   help="output JSON-lines file; written source by source to <out>.partial with <out>.progress, "
                        "so a rerun of an interrupted command resumes")
    p.set_defaults(func=run)
