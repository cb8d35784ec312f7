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


def parse_origin(text: str) -> tuple[float, float] | None:
    """A Lanelet2 projection origin "lat, lon" (degrees); "" = none (the map's first node)."""
    if not text.strip():
        return None
    try:
        lat, lon = (float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise MapLoadError(f"Lanelet2 origin {text!r}: expected 'lat, lon' in degrees") from None
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0):
        raise MapLoadError(f"Lanelet2 origin {text!r}: latitude/longitude out of range")
    return lat, lon


def load_map(path: str | Path, fmt: str = "auto", lanelet2_origin: tuple[float, float] | None = None) -> LaneGraph:
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
        from luna_core.maps.commonroad import CommonRoadError, load_commonroad_map
        try:
            return load_commonroad_map(path)
        except CommonRoadError as exc:
            raise MapLoadError(f"not a readable CommonRoad map: {exc}") from None
    if fmt == "lanelet2":
        from luna_core.maps.lanelet2 import Lanelet2MapError, load_lanelet2_map
        try:
            return load_lanelet2_map(path, lanelet2_origin)
        except Lanelet2MapError as exc:
            raise MapLoadError(f"not a readable Lanelet2 map: {exc}") from None
    raise MapLoadError(f"{path}: unknown map format '{fmt}' (one of {', '.join(MAP_FORMATS)})")
