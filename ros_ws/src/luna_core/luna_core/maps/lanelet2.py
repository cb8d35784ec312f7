"""Lanelet2 OSM maps -> ``LaneGraph`` (the ``lanelet2`` package, imported only when used).

* Projection: the OSM's WGS84 nodes go to a local metric frame by Lanelet2's ``UtmProjector`` around
  an origin (lat, lon). The origin is configuration (``map_server``'s ``lanelet2_origin``); without it
  the first node of the file is the origin. Localization must publish poses in the same frame.
* Lanes: every lanelet a vehicle may drive (Lanelet2's traffic rules for ``Participants.Vehicle`` in
  the configured location, ``Germany`` being the one Lanelet2 ships), in each passable direction (a
  two-way lanelet gives two lanes; the reverse one's id ends in ``:inv``). Centre line, left and
  right bounds as (N, 2) arrays; the speed limit from the traffic rules (the lanelet's
  ``speed_limit`` tag, else the location's default for its type).
* Topology from Lanelet2's routing graph: successors (``following``), predecessors (``previous``),
  left/right neighbours (adjacent same-direction lanelets, with or without a lane change allowed);
  roads (``road_id``) are connected groups of neighbours, as for CommonRoad maps.
* ``in_junction``: the lanelet carries a ``turn_direction`` tag (Autoware intersections) or
  conflicts with another lanelet (their areas overlap without a routing relation).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from luna_core.maps import connected_roads
from luna_core.types import Lane, LaneGraph


class Lanelet2MapError(ValueError):
    """A file is not a readable Lanelet2 map (or the ``lanelet2`` package is missing)."""


def first_node_origin(path: Path) -> tuple[float, float]:
    """(lat, lon) of the first ``<node>`` of an OSM file."""
    try:
        for _, elem in ET.iterparse(path, events=("start",)):
            if elem.tag == "node":
                return float(elem.attrib["lat"]), float(elem.attrib["lon"])
    except (ET.ParseError, KeyError, ValueError) as exc:
        raise Lanelet2MapError(f"{path}: not a readable OSM file ({exc})") from None
    raise Lanelet2MapError(f"{path}: no <node> in the file: not a Lanelet2 OSM map")


def _points(line: Any) -> np.ndarray:
    return np.array([(p.x, p.y) for p in line], dtype=np.float64).reshape(-1, 2)


def load_lanelet2_map(path: str | Path, origin: tuple[float, float] | None = None,
                      location: str = "Germany") -> LaneGraph:
    """The lane graph of a Lanelet2 OSM map (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise Lanelet2MapError(f"{path}: no such file")
    try:
        import lanelet2
        import lanelet2.routing as routing
        import lanelet2.traffic_rules as rules_mod
        from lanelet2.io import Origin
        from lanelet2.projection import UtmProjector
    except ImportError as exc:
        raise Lanelet2MapError(f"{path}: Lanelet2 maps need the 'lanelet2' package ({exc})") from None
    lat, lon = origin if origin is not None else first_node_origin(path)
    try:
        lanelet_map, errors = lanelet2.io.loadRobust(str(path), UtmProjector(Origin(lat, lon)))
    except Exception as exc:  # noqa: BLE001 - the C++ loader raises various kinds; all mean "unreadable"
        raise Lanelet2MapError(f"{path}: lanelet2 could not read it ({type(exc).__name__}: {exc})") from None
    if not hasattr(rules_mod.Locations, location):
        raise Lanelet2MapError(f"{path}: unknown traffic-rule location {location!r}")
    rules = rules_mod.create(getattr(rules_mod.Locations, location), rules_mod.Participants.Vehicle)
    graph = routing.RoutingGraph(lanelet_map, rules)

    def key(ll: Any) -> str:
        return f"{ll.id}:inv" if ll.inverted() else str(ll.id)

    lanes = {}
    for stored in lanelet_map.laneletLayer:
        for ll in (stored, stored.invert()):
            if rules.canPass(ll):
                lanes[key(ll)] = ll
    if not lanes:
        raise Lanelet2MapError(f"{path}: no lanelet a vehicle may drive"
                               + (f" (loader reported: {'; '.join(errors[:3])})" if errors else ""))

    def neighbours(ll: Any) -> tuple[str, str]:
        left = graph.left(ll) or graph.adjacentLeft(ll)
        right = graph.right(ll) or graph.adjacentRight(ll)
        return (key(left) if left is not None and key(left) in lanes else "",
                key(right) if right is not None and key(right) in lanes else "")

    sides = {k: neighbours(ll) for k, ll in lanes.items()}
    road = connected_roads(lanes, lambda k: [n for n in sides[k] if n])
    out = LaneGraph()
    for k, ll in lanes.items():
        centre = _points(ll.centerline)
        if len(centre) < 2:
            raise Lanelet2MapError(f"{path}: lanelet {k} has a degenerate centre line")
        out.add(Lane(id=k, centerline=centre, left_boundary=_points(ll.leftBound),
                     right_boundary=_points(ll.rightBound), speed_limit=float(rules.speedLimit(ll).speedLimitMPS),
                     road_id=f"road_{road[k]}", successors=[key(s) for s in graph.following(ll) if key(s) in lanes],
                     predecessors=[key(p) for p in graph.previous(ll) if key(p) in lanes],
                     left_neighbor=sides[k][0], right_neighbor=sides[k][1],
                     in_junction="turn_direction" in ll.attributes or len(graph.conflicting(ll)) > 0))
    return out
