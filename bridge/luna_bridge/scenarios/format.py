"""The scenario file format (JSON, optionally gzip-compressed), versioned and validated on load.

One JSON object per file::

    {"format": "luna-scenario", "format_version": 1,
     "name", "scenario_type", "split", "source", "duration",
     "vehicle": {"width", "front_length", "rear_length", "wheelbase", "cog_position_from_rear_axle"},
     "lane_graph": <luna_core.lane_graph_io lane-graph object>,
     "route": {"road_ids": [...], "goal": [x, y, heading] | null},
     "ego_initial": {"x", "y", "heading", "velocity", "acceleration", "yaw_rate", "steering_angle"},
     "expert": <track>, "agents": [<track>, ...],
     "traffic_lights": [{"lane_id", "times": [...], "phases": ["Green" | "Yellow" | "Red" | "None"]}],
     "metadata": {...}}

    <track> = {"id", "class": "vehicle" | "pedestrian" | "bicycle" | "static", "length", "width",
               "t0", "x": [...], "y": [...], "heading": [...], "vx": [...], "vy": [...]}

Tracks are sampled every 0.1 s from ``t0`` (s from the scenario start; the expert starts up to 2 s
before 0 so planners get a history). A ``null`` row (all five values null) means the object is
absent at that step; a row with some values missing, or a NaN/inf anywhere, is an error. Ego poses
are at the rear axle, agent poses at the box centre. Every problem raises ``ScenarioFormatError``
naming the file and the field.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from luna_core.lane_graph_io import LaneGraphError, lane_graph_from_dict, lane_graph_to_dict
from luna_core.types import EgoState, ObjectClass, Route, TrafficLightPhase, VehicleParameters

from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario, TrafficLightTimeline

FORMAT = "luna-scenario"
FORMAT_VERSION = 1
_TRACK_FIELDS = ("x", "y", "heading", "vx", "vy")
_EGO_FIELDS = ("x", "y", "heading", "velocity", "acceleration", "yaw_rate", "steering_angle")
_VEHICLE_FIELDS = ("width", "front_length", "rear_length", "wheelbase", "cog_position_from_rear_axle")


class ScenarioFormatError(ValueError):
    """A scenario file is malformed; the message names the file and the field."""


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _num(v: float, digits: int) -> float | None:
    return None if not math.isfinite(v) else round(float(v), digits)


def _track_to_dict(track: AgentTrack) -> dict[str, Any]:
    present = np.isfinite(track.x)
    out: dict[str, Any] = {"id": track.id, "class": track.object_class.value,
                           "length": round(float(track.length), 3), "width": round(float(track.width), 3),
                           "t0": round(float(track.t[0]), 3) if len(track.t) else 0.0}
    for name, digits in zip(_TRACK_FIELDS, (2, 2, 3, 2, 2)):  # 1 cm, 1 mrad, 1 cm/s
        values = getattr(track, name)
        out[name] = [_num(v, digits) if p else None for v, p in zip(values, present)]
    return out


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    r = scenario.route
    goal = None if not math.isfinite(r.goal_x) else [round(r.goal_x, 3), round(r.goal_y, 3),
                                                      round(r.goal_heading, 4)]
    e = scenario.ego_initial
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": scenario.name,
        "scenario_type": scenario.scenario_type, "split": scenario.split, "source": scenario.source,
        "duration": scenario.duration,
        "vehicle": {f: getattr(scenario.vehicle, f) for f in _VEHICLE_FIELDS},
        "lane_graph": lane_graph_to_dict(scenario.lane_graph),
        "route": {"road_ids": list(r.road_ids), "goal": goal},
        "ego_initial": {f: round(float(getattr(e, f)), 4) for f in _EGO_FIELDS},
        "expert": _track_to_dict(scenario.expert),
        "agents": [_track_to_dict(a) for a in scenario.agents],
        "traffic_lights": [{"lane_id": tl.lane_id, "times": [round(t, 3) for t in tl.times],
                            "phases": [p.value for p in tl.phases]} for tl in scenario.traffic_lights],
        "metadata": scenario.metadata,
    }


def save_scenario(scenario: Scenario, path: str | Path) -> Path:
    """Write ``scenario``; a path ending in ``.gz`` is gzip-compressed (byte-reproducible: mtime 0)."""
    path = Path(path)
    text = json.dumps(scenario_to_dict(scenario), separators=(",", ":"), allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    else:
        path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------
# Reading and validation
# --------------------------------------------------------------------------------------------------


class _Reader:
    """Field access that turns every problem into a ScenarioFormatError naming file and field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> ScenarioFormatError:
        return ScenarioFormatError(f"{self.source}: {where}: {problem}")

    def get(self, obj: Any, key: str, where: str) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(where, "expected a JSON object")
        if key not in obj:
            raise self.fail(f"{where}.{key}" if where else key, "missing field")
        return obj[key]

    def number(self, obj: Any, key: str, where: str, positive: bool = False) -> float:
        v = self.get(obj, key, where)
        name = f"{where}.{key}" if where else key
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(name, f"expected a number, got {v!r}")
        if not math.isfinite(v):
            raise self.fail(name, "NaN or inf")
        if positive and v <= 0:
            raise self.fail(name, f"must be positive, got {v}")
        return float(v)

    def string(self, obj: Any, key: str, where: str) -> str:
        v = self.get(obj, key, where)
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key}" if where else key, f"expected a string, got {v!r}")
        return v

    def track(self, d: Any, where: str) -> AgentTrack:
        track_id = self.string(d, "id", where)
        where = f"{where}[id={track_id}]"
        cls_name = self.string(d, "class", where)
        try:
            cls = ObjectClass(cls_name)
        except ValueError:
            raise self.fail(f"{where}.class", f"unknown object class {cls_name!r} "
                                              f"(expected one of {[c.value for c in ObjectClass]})") from None
        length = self.number(d, "length", where, positive=True)
        width = self.number(d, "width", where, positive=True)
        t0 = self.number(d, "t0", where)
        cols = []
        for name in _TRACK_FIELDS:
            values = self.get(d, name, where)
            if not isinstance(values, list):
                raise self.fail(f"{where}.{name}", "expected a list")
            cols.append(values)
        n = len(cols[0])
        for name, values in zip(_TRACK_FIELDS, cols):
            if len(values) != n:
                raise self.fail(f"{where}.{name}", f"has {len(values)} values, 'x' has {n}")
        data = np.full((5, n), np.nan)
        for k in range(n):
            row = [c[k] for c in cols]
            if all(v is None for v in row):
                continue  # absent at this step
            for name, v in zip(_TRACK_FIELDS, row):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise self.fail(f"{where}.{name}[{k}]",
                                    f"state value {v!r} is not a finite number (a row is all null "
                                    f"when the object is absent)")
            data[:, k] = row
        t = t0 + SIM_DT * np.arange(n)
        return AgentTrack(track_id, cls, length, width, t, *data)


def _parse_json(text: str, source: str) -> Any:
    def reject(token: str) -> None:
        raise ScenarioFormatError(f"{source}: the file contains {token}; states must be finite numbers")
    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as exc:
        raise ScenarioFormatError(f"{source}: not valid JSON ({exc})") from None


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    """Build and validate a ``Scenario`` from its JSON object (see the module docstring)."""
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("top level", "expected a JSON object")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise r.fail("format", f"expected {FORMAT!r}, got {fmt!r} (not a LUNA scenario file)")
    version = r.get(data, "format_version", "")
    if version != FORMAT_VERSION:
        raise r.fail("format_version", f"version {version!r} is not supported (this reader: {FORMAT_VERSION})")
    name = r.string(data, "name", "")
    try:
        graph = lane_graph_from_dict(r.get(data, "lane_graph", ""), f"{source}: lane_graph")
    except LaneGraphError as exc:
        raise ScenarioFormatError(str(exc)) from None
    if not graph.lanes:
        raise r.fail("lane_graph.lanes", "the lane graph has no lanes")
    road_ids = {lane.road_id for lane in graph.lanes.values()}

    route_d = r.get(data, "route", "")
    roads = r.get(route_d, "road_ids", "route")
    if not isinstance(roads, list) or not roads or not all(isinstance(x, str) for x in roads):
        raise r.fail("route.road_ids", "expected a non-empty list of road ids")
    for k, road in enumerate(roads):
        if road not in road_ids:
            raise r.fail(f"route.road_ids[{k}]", f"unknown road id {road!r} (no lane has it)")
    goal = r.get(route_d, "goal", "route")
    if goal is None:
        route = Route(0.0, list(roads))
    else:
        if (not isinstance(goal, list) or len(goal) != 3
                or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in goal)):
            raise r.fail("route.goal", f"expected null or [x, y, heading] finite numbers, got {goal!r}")
        route = Route(0.0, list(roads), float(goal[0]), float(goal[1]), float(goal[2]))

    ego_d = r.get(data, "ego_initial", "")
    ego = EgoState(0.0, *(r.number(ego_d, f, "ego_initial") for f in _EGO_FIELDS))
    vehicle_d = r.get(data, "vehicle", "")
    vehicle = VehicleParameters(*(r.number(vehicle_d, f, "vehicle", positive=f != "cog_position_from_rear_axle")
                                  for f in _VEHICLE_FIELDS))

    expert = r.track(r.get(data, "expert", ""), "expert")
    agents_d = r.get(data, "agents", "")
    if not isinstance(agents_d, list):
        raise r.fail("agents", "expected a list")
    agents = [r.track(a, f"agents[{k}]") for k, a in enumerate(agents_d)]
    ids = [a.id for a in agents]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise r.fail("agents", f"duplicate agent ids {sorted(dup)}")

    lights = []
    lights_d = r.get(data, "traffic_lights", "")
    if not isinstance(lights_d, list):
        raise r.fail("traffic_lights", "expected a list")
    for k, tl in enumerate(lights_d):
        where = f"traffic_lights[{k}]"
        lane_id = r.string(tl, "lane_id", where)
        if lane_id not in graph.lanes:
            raise r.fail(f"{where}.lane_id", f"unknown lane id {lane_id!r}")
        times, phases = r.get(tl, "times", where), r.get(tl, "phases", where)
        if not isinstance(times, list) or not isinstance(phases, list) or len(times) != len(phases) or not times:
            raise r.fail(where, "'times' and 'phases' must be non-empty lists of equal length")
        if not all(isinstance(t, (int, float)) and math.isfinite(t) for t in times) or \
                any(b < a for a, b in zip(times, times[1:])):
            raise r.fail(f"{where}.times", "must be finite and non-decreasing")
        try:
            parsed = [TrafficLightPhase(p) for p in phases]
        except ValueError:
            raise r.fail(f"{where}.phases", f"unknown phase in {phases!r} "
                                            f"(expected {[p.value for p in TrafficLightPhase]})") from None
        lights.append(TrafficLightTimeline(lane_id, [float(t) for t in times], parsed))

    duration = r.number(data, "duration", "", positive=True)
    if expert.index_at(0.0) is None or expert.index_at(duration - 1e-6) is None:
        raise r.fail("expert", f"the expert track must cover 0 .. {duration} s without gaps")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise r.fail("metadata", "expected a JSON object")
    return Scenario(name=name, scenario_type=r.string(data, "scenario_type", ""), lane_graph=graph,
                    route=route, ego_initial=ego, expert=expert, agents=agents, traffic_lights=lights,
                    duration=duration, split=r.string(data, "split", ""), source=r.string(data, "source", ""),
                    vehicle=vehicle, metadata=metadata)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file (``.json`` or ``.json.gz``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ScenarioFormatError(f"{path}: no such file") from None
    try:
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ScenarioFormatError(f"{path}: unreadable ({exc})") from None
    return scenario_from_dict(_parse_json(text, str(path)), str(path))
