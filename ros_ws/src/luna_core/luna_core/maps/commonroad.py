"""CommonRoad XML lanelet networks -> ``LaneGraph`` (commonroad-io 2022.1, imported only when used).

The one implementation of the conversion: the ``map_server`` node (a vehicle's CommonRoad map) and
the bridge's scenario reader (``luna_bridge.scenarios.commonroad``) both call it.

* lanelets -> ``Lane`` (centre/left/right vertices, speed limit from the lanelet's MAX_SPEED traffic
  sign when there is one); successors/predecessors kept; same-direction adjacency -> left/right
  neighbours; a road (``road_id``) is a connected group of same-direction adjacent lanelets.
* ``in_junction``: the lanelet is an incoming's successor of a CommonRoad intersection, has the
  ``intersection`` type, or (files without intersection data, like the NGSIM ones) its polygon
  crosses another lanelet that is neither a neighbour, a predecessor nor a successor.

A file that is not CommonRoad XML raises ``CommonRoadError`` naming the file.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from luna_core.maps import connected_roads
from luna_core.types import Lane, LaneGraph


class CommonRoadError(ValueError):
    """A file is not a readable CommonRoad scenario or map."""


def _check_root(path: Path) -> None:
    try:
        for _, elem in ET.iterparse(path, events=("start",)):
            if elem.tag != "commonRoad":
                raise CommonRoadError(f"{path}: not a CommonRoad scenario (root element <{elem.tag}>, "
                                      f"expected <commonRoad>)")
            return
    except ET.ParseError as exc:
        raise CommonRoadError(f"{path}: not valid XML ({exc})") from None
    raise CommonRoadError(f"{path}: empty XML file")


def open_commonroad(path: str | Path) -> tuple[Any, Any]:
    """(scenario, planning problem set) of a CommonRoad XML file, as commonroad-io reads them."""
    path = Path(path)
    if not path.is_file():
        raise CommonRoadError(f"{path}: no such file")
    _check_root(path)
    try:
        from commonroad.common.file_reader import CommonRoadFileReader
    except ImportError as exc:
        raise CommonRoadError(f"{path}: CommonRoad files need the commonroad-io package ({exc})") from None
    try:
        return CommonRoadFileReader(str(path)).open()
    except Exception as exc:  # noqa: BLE001 - commonroad-io raises many kinds; all mean "unreadable"
        raise CommonRoadError(f"{path}: commonroad-io could not read it ({type(exc).__name__}: {exc})") from None


def load_commonroad_map(path: str | Path) -> LaneGraph:
    """The lane graph of a CommonRoad XML file's lanelet network."""
    scenario, _ = open_commonroad(path)
    graph = lane_graph_from_network(scenario.lanelet_network)
    if not graph.lanes:
        raise CommonRoadError(f"{path}: the lanelet network is empty")
    return graph


def _speed_limits(network: Any) -> dict[int, float]:
    signs = {s.traffic_sign_id: s for s in network.traffic_signs}
    out: dict[int, float] = {}
    for ll in network.lanelets:
        for sid in ll.traffic_signs:
            sign = signs.get(sid)
            if sign is None:
                continue
            for el in sign.traffic_sign_elements:
                name = getattr(el.traffic_sign_element_id, "name", str(el.traffic_sign_element_id))
                if "MAX_SPEED" in name and el.additional_values:
                    try:
                        out[ll.lanelet_id] = float(el.additional_values[0])
                    except (TypeError, ValueError):
                        pass
    return out


def _junction_lanelets(network: Any) -> set[int]:
    import shapely

    out: set[int] = set()
    for inter in getattr(network, "intersections", []):
        for inc in inter.incomings:
            out |= set(inc.successors_right) | set(inc.successors_straight) | set(inc.successors_left)
    for ll in network.lanelets:
        if any("intersection" in getattr(t, "value", str(t)).lower() for t in (ll.lanelet_type or ())):
            out.add(ll.lanelet_id)
    if out:
        return out
    # No intersection data: lanelets whose area crosses an unrelated lanelet's area.
    lanelets = list(network.lanelets)
    polys = [shapely.make_valid(shapely.Polygon(np.vstack([ll.left_vertices, ll.right_vertices[::-1]])))
             for ll in lanelets]
    tree = shapely.STRtree(polys)
    for i, ll in enumerate(lanelets):
        related = {ll.lanelet_id, ll.adj_left, ll.adj_right, *ll.successor, *ll.predecessor}
        for j in tree.query(polys[i], predicate="intersects"):
            other = lanelets[int(j)]
            if other.lanelet_id in related or ll.lanelet_id in other.successor or ll.lanelet_id in other.predecessor:
                continue
            if polys[i].intersection(polys[int(j)]).area > 1.0:
                out.add(ll.lanelet_id)
                break
    return out


def lane_graph_from_network(network: Any) -> LaneGraph:
    """Convert a CommonRoad ``LaneletNetwork`` to a ``LaneGraph`` (see the module docstring)."""
    limits = _speed_limits(network)
    junction = _junction_lanelets(network)
    by_id = {ll.lanelet_id: ll for ll in network.lanelets}

    def same_direction(lid: int) -> list[int]:
        ll = by_id[lid]
        sides = ((ll.adj_left, ll.adj_left_same_direction), (ll.adj_right, ll.adj_right_same_direction))
        return [n for n, same in sides if n is not None and same]

    road = connected_roads(by_id, same_direction)
    graph = LaneGraph()
    for ll in network.lanelets:
        left = str(ll.adj_left) if ll.adj_left is not None and ll.adj_left_same_direction else ""
        right = str(ll.adj_right) if ll.adj_right is not None and ll.adj_right_same_direction else ""
        graph.add(Lane(id=str(ll.lanelet_id), centerline=np.asarray(ll.center_vertices, dtype=np.float64),
                       left_boundary=np.asarray(ll.left_vertices, dtype=np.float64),
                       right_boundary=np.asarray(ll.right_vertices, dtype=np.float64),
                       speed_limit=limits.get(ll.lanelet_id, 0.0), road_id=f"road_{road[ll.lanelet_id]}",
                       successors=[str(s) for s in ll.successor if s in by_id],
                       predecessors=[str(p) for p in ll.predecessor if p in by_id],
                       left_neighbor=left if left and int(left) in by_id else "",
                       right_neighbor=right if right and int(right) in by_id else "",
                       in_junction=ll.lanelet_id in junction))
    return graph
