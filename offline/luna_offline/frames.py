"""``luna-offline frames``: 2 Hz frames with scene descriptors from scenario sources (DESIGN Sec. 7).

Each scenario's logged ego (the expert) is sampled every 1/rate s; at each sample the scene descriptor
xi_t is built from the expert state, the logged objects and lights, the route and the lane graph. The
"recent decisions" of a frame are the expert's own decisions over the preceding frame intervals,
labelled from its motion (``expert_decision``), as the paper's descriptor carries the last two.

Output: JSON lines, one frame per line: id, scenario identity (so a simulation-grounded scorer can
reload the scenario and time), the expert's decision over the next interval, and the descriptor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from luna_core.lanes import lane_map
from luna_core.scene import SceneConfig, build_scene, scene_from_dict, scene_to_dict
from luna_core.types import EgoState, SceneDescriptor

FRAME_FORMAT = 1
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


def read_frames(path: str | Path) -> list[Frame]:
    """All frames of a JSON-lines file; raises ``FrameError`` naming the line of any bad record."""
    frames, seen = [], set()
    with open(path, encoding="utf-8") as f:
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


def write_frames(frames: Iterable[Frame], path: str | Path) -> int:
    """Write frames atomically (a partial file never replaces a good one); returns the count."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for frame in frames:
                f.write(json.dumps(frame.to_json(), separators=(",", ":")) + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def _sources(args: argparse.Namespace) -> list[tuple[str, Callable[[], Any], dict[str, Any]]]:
    """(label, loader, origin) of every requested scenario; loading happens one at a time later."""
    sources: list[tuple[str, Callable[[], Any], dict[str, Any]]] = []
    if args.suite:
        from luna_bridge.scenarios.registry import load_entry, suite_refs

        for suite in args.suite:
            for _name, source, loader in suite_refs(suite):
                sources.append((source, partial(load_entry, source, loader), {"suite": suite, "file": source}))
    if args.scenario:
        from luna_bridge.scenarios.format import load_scenario

        for path in args.scenario:
            sources.append((str(path), partial(load_scenario, path), {"file": str(path)}))
    return sources


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if not (args.suite or args.scenario):
        raise SystemExit("luna-offline frames: give --suite NAME and/or --scenario FILE")
    failures: list[str] = []

    def generate() -> Iterator[Frame]:
        taken: dict[str, str] = {}  # scenario name -> where it came from (frame ids must be unique)
        for label, load, origin in tqdm(_sources(args), desc="scenarios", unit="scn"):
            try:
                scenario = load()
                if scenario.name in taken:
                    raise FrameError(f"scenario name {scenario.name!r} already taken from {taken[scenario.name]}")
                frames = list(scenario_frames(scenario, args.rate, origin))
            except Exception as exc:  # noqa: BLE001 - a bad scenario is reported and skipped, never silently
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            taken[scenario.name] = label
            yield from frames

    n = write_frames(generate(), args.out)
    for failure in failures:
        print(f"[frames] skipped {failure}", file=sys.stderr)
    print(f"[frames] wrote {n} frames to {args.out}" + (f"; {len(failures)} scenario(s) skipped" if failures else ""))
    return 0 if n and not failures else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("frames", help="2 Hz frames with scene descriptors from scenario sources",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="append",
                   help="scenario suite (synthetic-train, synthetic-hard, synthetic-random, commonroad) or a "
                        "directory of scenario files; repeatable")
    p.add_argument("--scenario", action="append", type=Path, help="scenario file; repeatable")
    p.add_argument("--rate", type=float, default=2.0, help="frames per second (default 2)")
    p.add_argument("--out", type=Path, required=True, help="output JSON-lines file")
    p.set_defaults(func=run)
