"""The project's lane-graph file format (JSON), and its validation.

One JSON object: ``{"format": "luna-lane-graph", "format_version": 1, "frame_id": "map",
"lanes": [{"id", "road_id", "centerline": [[x, y], ...], "left_boundary", "right_boundary",
"speed_limit", "successors", "predecessors", "left_neighbor", "right_neighbor", "in_junction"}]}``.
Coordinates in metres in the map frame, speed limits in m/s. Scenario files embed the same lane
objects. Loading checks everything a consumer relies on and raises ``LaneGraphError`` naming the file,
the lane and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from luna_core.types import Lane, LaneGraph

FORMAT = "luna-lane-graph"
FORMAT_VERSION = 1


class LaneGraphError(ValueError):
    """A lane graph (file or dict) is malformed."""


def lane_to_dict(lane: Lane) -> dict[str, Any]:
    def pts(a: np.ndarray) -> list[list[float]]:
        return [[round(float(x), 4), round(float(y), 4)] for x, y in np.asarray(a).reshape(-1, 2)]

    return {"id": lane.id, "road_id": lane.road_id, "centerline": pts(lane.centerline),
            "left_boundary": pts(lane.left_boundary), "right_boundary": pts(lane.right_boundary),
            "speed_limit": float(lane.speed_limit), "successors": list(lane.successors),
            "predecessors": list(lane.predecessors), "left_neighbor": lane.left_neighbor,
            "right_neighbor": lane.right_neighbor, "in_junction": bool(lane.in_junction)}


def lane_graph_to_dict(graph: LaneGraph) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "frame_id": graph.frame_id,
            "lanes": [lane_to_dict(lane) for lane in graph.lanes.values()]}


def _polyline(d: dict, key: str, where: str) -> np.ndarray:
    if key not in d:
        raise LaneGraphError(f"{where}: missing field '{key}'")
    try:
        a = np.asarray(d[key], dtype=np.float64)
    except (TypeError, ValueError):
        raise LaneGraphError(f"{where}: field '{key}' is not a list of [x, y] points") from None
    if a.ndim != 2 or a.shape[1] != 2 or len(a) < 2:
        raise LaneGraphError(f"{where}: field '{key}' needs at least 2 [x, y] points, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise LaneGraphError(f"{where}: field '{key}' contains NaN or inf")
    return a


def lane_graph_from_dict(data: dict[str, Any], source: str = "lane graph") -> LaneGraph:
    if not isinstance(data, dict) or not isinstance(data.get("lanes"), list):
        raise LaneGraphError(f"{source}: expected an object with a 'lanes' list")
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise LaneGraphError(f"{source}: format_version {version} is not supported (expected {FORMAT_VERSION})")
    graph = LaneGraph(frame_id=str(data.get("frame_id", "map")))
    for i, d in enumerate(data["lanes"]):
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not d["id"]:
            raise LaneGraphError(f"{source}: lane #{i} has no string 'id'")
        where = f"{source}: lane '{d['id']}'"
        if d["id"] in graph.lanes:
            raise LaneGraphError(f"{where}: duplicate lane id")
        speed = d.get("speed_limit", 0.0)
        if not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed < 0:
            raise LaneGraphError(f"{where}: speed_limit {speed!r} is not a non-negative number (m/s)")
        graph.add(Lane(id=d["id"], centerline=_polyline(d, "centerline", where),
                       left_boundary=_polyline(d, "left_boundary", where),
                       right_boundary=_polyline(d, "right_boundary", where), speed_limit=float(speed),
                       road_id=str(d.get("road_id", "")), successors=[str(s) for s in d.get("successors", [])],
                       predecessors=[str(s) for s in d.get("predecessors", [])],
                       left_neighbor=str(d.get("left_neighbor", "") or ""),
                       right_neighbor=str(d.get("right_neighbor", "") or ""),
                       in_junction=bool(d.get("in_junction", False))))
    check_references(graph, source)
    return graph


def check_references(graph: LaneGraph, source: str = "lane graph") -> None:
    """Every successor, predecessor and neighbour must name a lane of the graph."""
    for lane in graph.lanes.values():
        refs = [("successors", s) for s in lane.successors] + [("predecessors", s) for s in lane.predecessors]
        refs += [("left_neighbor", lane.left_neighbor), ("right_neighbor", lane.right_neighbor)]
        for field_name, ref in refs:
            if ref and ref not in graph.lanes:
                raise LaneGraphError(f"{source}: lane '{lane.id}' field '{field_name}' names unknown lane '{ref}'")


def save_lane_graph(graph: LaneGraph, path: str | Path) -> None:
    Path(path).write_text(json.dumps(lane_graph_to_dict(graph), separators=(",", ":")))


def load_lane_graph(path: str | Path) -> LaneGraph:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LaneGraphError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LaneGraphError(f"{path}: not a JSON lane graph ({exc})") from None
    return lane_graph_from_dict(data, str(path))
