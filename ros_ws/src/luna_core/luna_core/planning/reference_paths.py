"""Reference path per lateral decision: the target lane centreline (x^r)^k of CALMM-Drive Eq. 4.

* ``K`` (lane keep, and Stop): the lane the ego is on, continued along the route (the same
  Dijkstra-over-successors sequence PDM-Closed uses for its centreline, from ``luna_core.lanes``).
* ``L`` / ``R``: the same-direction neighbour lane on that side of the ego's lane, continued along
  the route from there.

A lateral decision whose lane does not exist has no reference path (the action is impossible here and
the planner drops it). So has a lane change onto a lane that leaves the route soon while the ego's own
lane does not (a straight-only lane just before the route turns, a lane that ends): within
``route_stay_distance`` of the ego there is no room to change back, and such a change left the ego
stranded off its route in a junction (``random_starting_right_turn_05``, docs/benchmarks.md).

Each path is cropped to a window around the ego and resampled at a fixed spacing, so that projecting a
whole Diffusion-ES population onto it stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.spatial import cKDTree

from luna_core.lanes import LaneMap, Polyline, lane_map, route_lanes_from_pose
from luna_core.types import EgoState, LaneGraph, Route

#: Speed limit assumed where the map gives none (m/s), as PDM-Closed does.
DEFAULT_SPEED_LIMIT = 15.0
#: A lane change is offered onto a lane that stays on the route for the trajectory horizon (8 s at the
#: ego's speed) and at least ROUTE_STAY_MIN m ahead; sooner than that, there is no room to change back.
ROUTE_STAY_TIME = 8.0  # s
ROUTE_STAY_MIN = 40.0  # m


def route_stay_distance(velocity: float) -> float:
    """m ahead of the ego a target lane must stay on the route for a lane change onto it."""
    return max(ROUTE_STAY_MIN, ROUTE_STAY_TIME * max(velocity, 0.0))


class OffMapError(ValueError):
    """The ego pose is not near any lane of the lane graph (or the graph is empty)."""


@dataclass(frozen=True)
class ReferencePath:
    """One lateral decision's target lane centreline around the ego."""

    lateral: str  # "K", "L" or "R"
    lane_ids: tuple[str, ...]  # the lane sequence the path follows, starting at the ego's lane
    centerline: Polyline  # cropped to [ego - behind, ego + ahead] and resampled
    ego_s: float  # arc length of the ego's foot point on ``centerline`` (m)
    speed_limit: float  # m/s of the first lane; DEFAULT_SPEED_LIMIT where the map has none

    @cached_property
    def _tree(self) -> cKDTree:
        return cKDTree(self.centerline.points)

    def lateral_offset(self, xy: np.ndarray) -> np.ndarray:
        """Signed offsets (...,) of points (..., 2) from the centreline, positive to the left.

        Beyond the ends of the path the offset is measured from the extended end segments, so a
        trajectory running past the end of the map window is not penalised for it. The path is
        evenly resampled, so the foot point lies on a segment next to the nearest vertex: a k-d tree
        query plus two segments per point, instead of every point against every segment
        (``Polyline.project``), which dominated the cost of scoring a Diffusion-ES population.
        """
        q = np.asarray(xy, dtype=np.float64)
        lead = q.shape[:-1]
        q = q.reshape(-1, 2)
        pts = self.centerline.points
        last = len(pts) - 2  # index of the last segment
        _, nearest = self._tree.query(q)
        best_d = np.full(len(q), np.inf)
        best_lat = np.zeros(len(q))
        for seg in (np.clip(nearest - 1, 0, last), np.clip(nearest, 0, last)):
            a, b = pts[seg], pts[seg + 1]
            v = b - a
            length2 = np.maximum(np.einsum("ij,ij->i", v, v), 1e-18)
            rel = q - a
            t = np.einsum("ij,ij->i", rel, v) / length2
            tc = np.clip(t, 0.0, 1.0)
            # Beyond the ends, keep the normal of the end segment (as Polyline.project does).
            tc = np.where((seg == 0) & (t < 0.0), t, tc)
            tc = np.where((seg == last) & (t > 1.0), t, tc)
            d = np.hypot(*(rel - tc[:, None] * v).T)
            lat = (v[:, 0] * rel[:, 1] - v[:, 1] * rel[:, 0]) / np.sqrt(length2)
            closer = d < best_d
            best_d = np.where(closer, d, best_d)
            best_lat = np.where(closer, lat, best_lat)
        return best_lat.reshape(lead)


def _crop(lm: LaneMap, lane_ids: list[str], x: float, y: float, behind: float, ahead: float,
          spacing: float) -> tuple[Polyline, float]:
    full = lm.route_centerline(lane_ids)
    s_ego = float(full.project(np.array([x, y])).s)
    start = max(s_ego - behind, 0.0)
    end = min(s_ego + ahead, full.length)
    if end - start < spacing:  # the ego is past the end of its lane sequence: keep the last piece
        start, end = max(full.length - 2.0 * spacing, 0.0), full.length
    n = max(int(math.ceil((end - start) / spacing)), 1) + 1
    path = Polyline(full.interpolate(np.linspace(start, end, n))[:, :2])
    return path, float(path.project(np.array([x, y])).s)


def _speed_limit(graph: LaneGraph, lane_id: str) -> float:
    limit = graph.lanes[lane_id].speed_limit
    return float(limit) if math.isfinite(limit) and limit > 0.0 else DEFAULT_SPEED_LIMIT


def lane_sequences(graph: LaneGraph, route: Route, ego: EgoState) -> dict[str, tuple[str, ...]]:
    """The lane sequence of each lateral decision ("K" always, "L"/"R" where that neighbour exists),
    each continued along the route: the map search behind ``reference_paths``, done once per cycle
    (``planning.context``) however many crops of the paths are then taken.

    Raises ``OffMapError`` when the graph is empty or no lane is near the ego pose.
    """
    if not graph.lanes:
        raise OffMapError("the lane graph is empty")
    if not ego.is_finite():
        raise OffMapError(f"the ego state is not finite: x={ego.x}, y={ego.y}, heading={ego.heading}")
    found = route_lanes_from_pose(graph, route, ego.x, ego.y, ego.heading)
    if found is None:
        raise OffMapError(f"no lane within reach of the ego at ({ego.x:.1f}, {ego.y:.1f})")
    keep_ids, match = found
    lm = lane_map(graph)
    sequences = {"K": tuple(keep_ids)}
    left, right = lm.neighbours(match.lane_id)
    keep_rank = _route_rank(graph, route, keep_ids)
    for code, neighbour in (("L", left), ("R", right)):
        if neighbour is None:
            continue
        ids = lm.route_lanes(neighbour, list(route.road_ids))
        leaves_sooner = _route_rank(graph, route, ids) < keep_rank
        if leaves_sooner and _length_ahead(lm, ids, ego) < route_stay_distance(ego.velocity):
            continue  # too soon to change back
        sequences[code] = tuple(ids)
    return sequences


def _route_rank(graph: LaneGraph, route: Route, lane_ids: list[str]) -> int:
    """How far along the route a lane sequence gets: the route index of its last lane's road (-1: off)."""
    road = graph.lanes[lane_ids[-1]].road_id
    return list(route.road_ids).index(road) if road in route.road_ids else -1


def _length_ahead(lm: LaneMap, lane_ids: list[str], ego: EgoState) -> float:
    """m of a lane sequence ahead of the ego's foot point on it."""
    first = lm.centerlines[lane_ids[0]]
    s_ego = float(first.project(np.array([ego.x, ego.y])).s)
    return sum(lm.centerlines[i].length for i in lane_ids) - s_ego


def crop_reference_path(graph: LaneGraph, lateral: str, lane_ids: tuple[str, ...], ego: EgoState, *,
                        behind: float = 10.0, ahead: float = 200.0, spacing: float = 2.0) -> ReferencePath:
    """The reference path along ``lane_ids`` (one of ``lane_sequences``), cropped to [ego - behind,
    ego + ahead] and resampled every ``spacing`` m."""
    path, s = _crop(lane_map(graph), list(lane_ids), ego.x, ego.y, behind, ahead, spacing)
    return ReferencePath(lateral, tuple(lane_ids), path, s, _speed_limit(graph, lane_ids[0]))


def reference_paths(graph: LaneGraph, route: Route, ego: EgoState, *, behind: float = 10.0,
                    ahead: float = 200.0, spacing: float = 2.0) -> dict[str, ReferencePath]:
    """Reference paths keyed by lateral code ("K" always, "L"/"R" where that neighbour exists).

    Raises ``OffMapError`` when the graph is empty or no lane is near the ego pose.
    """
    return {code: crop_reference_path(graph, code, ids, ego, behind=behind, ahead=ahead, spacing=spacing)
            for code, ids in lane_sequences(graph, route, ego).items()}
