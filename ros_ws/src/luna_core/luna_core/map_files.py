"""Load a map file of any supported format into a LaneGraph.

Formats: ``luna`` (the project's lane-graph JSON, see ``lane_graph_io``), ``commonroad`` (CommonRoad
XML lanelet networks, through the bridge's CommonRoad reader), ``lanelet2`` (Lanelet2 OSM, through
the optional ``lanelet2`` package). Every failure is a ``MapLoadError`` naming the file.
"""

from __future__ import annotations

from pathlib import Path

from luna_core.lane_graph_io import LaneGraphError, load_lane_graph
from luna_core.types import LaneGraph

MAP_FORMATS = ("luna", "commonroad", "lanelet2")


class MapLoadError(ValueError):
    """The map file is missing, of an unknown format, or malformed."""


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "luna"
    if suffix == ".xml":
        return "commonroad"
    if suffix == ".osm":
        return "lanelet2"
    raise MapLoadError(f"{path}: cannot tell the map format from the extension '{suffix}' "
                       f"(use .json, .xml or .osm, or set the format explicitly)")


def load_map(path: str | Path, fmt: str = "auto") -> LaneGraph:
    if not str(path):
        raise MapLoadError("no map file configured")
    path = Path(path)
    if not path.is_file():
        raise MapLoadError(f"{path}: no such map file")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "luna":
        try:
            return load_lane_graph(path)
        except LaneGraphError as exc:
            raise MapLoadError(str(exc)) from None
    if fmt == "commonroad":
        try:
            from luna_bridge.scenarios.commonroad import load_commonroad
        except ImportError as exc:
            raise MapLoadError(f"{path}: CommonRoad maps need the luna_bridge package ({exc})") from None
        try:
            return load_commonroad(path).lane_graph
        except Exception as exc:  # noqa: BLE001 - the reader raises many kinds; report them uniformly
            raise MapLoadError(f"{path}: not a readable CommonRoad map ({exc})") from None
    if fmt == "lanelet2":
        raise MapLoadError(f"{path}: Lanelet2 maps need the 'lanelet2' package, which is not installed here")
    raise MapLoadError(f"{path}: unknown map format '{fmt}' (one of {', '.join(MAP_FORMATS)})")
