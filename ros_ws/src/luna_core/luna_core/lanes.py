"""Lane-graph queries shared by the scene descriptor, the planners, the metrics and the simulator.

Two pieces:

* ``Polyline``: an immutable (N, 2) path with its arc length; projection of points to
  (s, lateral offset, path heading), interpolation at s, resampling, lateral offset.
* ``LaneMap``: a read-only index over one ``LaneGraph``: heading-aware nearest lane, neighbours,
  the road (lanes sharing ``road_id``) left to right, the route lane sequence (Dijkstra over
  successors restricted to the route's roads, as PDM-Closed builds its centreline), the route
  centreline, the distance to the next junction and the drivable area (union of lane polygons).
  Get one with ``lane_map(graph)``, which caches it per graph object, so callers that receive the
  same graph every cycle (planner, metrics) build the index once.

Conventions: lateral offsets are positive to the left of the direction of travel; headings in
radians; all arrays float64. Point inputs are (..., 2) arrays; results keep the leading shape.
"""

from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import shapely
from shapely.geometry import Polygon

from luna_core.raster import PolygonRaster
from luna_core.types import Lane, LaneGraph, Route, wrap_angle

# Weight (m per unit of 1 - cos(heading error)) that makes the nearest-lane search heading aware:
# a lane pointing the opposite way costs 2 * 3 = 6 m extra, a 10 deg lane change angle costs 5 cm,
# so overlapping junction connectors are told apart by heading and parallel lanes by distance.
HEADING_COST = 3.0
MIN_SEGMENT = 1e-3  # m


# --------------------------------------------------------------------------------------------------
# Polylines
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """Points projected onto a polyline; every field has the leading shape of the query points."""

    s: np.ndarray  # arc length of the foot point (m); extrapolated (< 0, > length) beyond the ends
    lateral: np.ndarray  # signed offset (m), positive to the left
    heading: np.ndarray  # path heading at the foot point (rad)
    distance: np.ndarray  # Euclidean distance to the (finite) polyline (m)


class Polyline:
    """An immutable 2-D path. Consecutive points closer than 1 mm are merged on construction."""

    def __init__(self, points: np.ndarray) -> None:
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if len(pts) == 0 or not np.all(np.isfinite(pts)):
            raise ValueError(f"a polyline needs at least one finite point, got {len(pts)} points "
                             f"({'non-finite values' if len(pts) else 'empty'})")
        # Points closer than 1 mm are merged: a near-zero segment (two lanes meeting up to
        # rounding) would otherwise carry an arbitrary heading into interpolation.
        keep = np.concatenate([[True], np.hypot(*np.diff(pts, axis=0).T) > MIN_SEGMENT])
        pts = pts[keep]
        if len(pts) == 1:  # a degenerate path still needs one segment to have a heading
            pts = np.vstack([pts, pts + [MIN_SEGMENT, 0.0]])
        pts.setflags(write=False)
        self.points: np.ndarray = pts
        seg = np.diff(pts, axis=0)
        self._seg = seg
        self._seg_len = np.hypot(seg[:, 0], seg[:, 1])
        self._seg_heading = np.arctan2(seg[:, 1], seg[:, 0])
        self.s: np.ndarray = np.concatenate([[0.0], np.cumsum(self._seg_len)])  # (N,) arc length
        self.s.setflags(write=False)

    def __len__(self) -> int:
        return len(self.points)

    @property
    def length(self) -> float:
        return float(self.s[-1])

    @cached_property
    def vertex_headings(self) -> np.ndarray:
        """(N,) heading at each vertex: mean direction of the adjacent segments, unwrapped."""
        h = np.unwrap(self._seg_heading)
        inner = (h[:-1] + h[1:]) / 2.0
        return np.concatenate([h[:1], inner, h[-1:]])

    def project(self, points: np.ndarray) -> Projection:
        """Foot points of ``points`` (..., 2) on the path (vectorised over points x segments)."""
        q = np.asarray(points, dtype=np.float64)
        lead = q.shape[:-1]
        q = q.reshape(-1, 2)
        a = self.points[:-1]  # (M, 2)
        v = self._seg
        rel = q[:, None, :] - a[None, :, :]  # (P, M, 2)
        t_raw = np.einsum("pmk,mk->pm", rel, v) / np.maximum(self._seg_len ** 2, 1e-18)
        t = np.clip(t_raw, 0.0, 1.0)
        foot = a[None] + t[..., None] * v[None]
        dist = np.hypot(q[:, None, 0] - foot[..., 0], q[:, None, 1] - foot[..., 1])
        best = np.argmin(dist, axis=1)  # (P,)
        rows = np.arange(len(q))
        # Beyond the ends the foot point runs on along the first / last segment, so s keeps
        # growing (progress past the end of a path stays measurable) and lateral stays a normal.
        tb = t[rows, best]
        last = len(v) - 1
        tb = np.where((best == 0) & (t_raw[rows, best] < 0.0), t_raw[rows, best], tb)
        tb = np.where((best == last) & (t_raw[rows, best] > 1.0), t_raw[rows, best], tb)
        s = self.s[best] + tb * self._seg_len[best]
        vb = v[best] / np.maximum(self._seg_len[best], 1e-18)[:, None]
        rb = rel[rows, best]
        lateral = vb[:, 0] * rb[:, 1] - vb[:, 1] * rb[:, 0]
        heading = self._seg_heading[best]
        return Projection(s.reshape(lead), lateral.reshape(lead), heading.reshape(lead),
                          dist[rows, best].reshape(lead))

    def interpolate(self, s: np.ndarray | float) -> np.ndarray:
        """Poses (..., 3) = (x, y, heading) at arc lengths ``s``; linear extrapolation beyond the ends."""
        s_arr = np.asarray(s, dtype=np.float64)
        flat = s_arr.reshape(-1)
        idx = np.clip(np.searchsorted(self.s, flat, side="right") - 1, 0, len(self._seg) - 1)
        frac = (flat - self.s[idx]) / np.maximum(self._seg_len[idx], 1e-18)
        xy = self.points[idx] + frac[:, None] * self._seg[idx]
        h = np.interp(flat, self.s, self.vertex_headings)
        out = np.column_stack([xy, wrap_angle(h) if len(flat) else h])
        return out.reshape(s_arr.shape + (3,))

    def resample(self, spacing: float) -> "Polyline":
        """The same path with vertices every ``spacing`` metres (the end point kept exactly)."""
        if spacing <= 0.0:
            raise ValueError(f"resample spacing must be positive, got {spacing}")
        n = max(int(math.ceil(self.length / spacing)), 1) + 1
        return Polyline(self.interpolate(np.linspace(0.0, self.length, n))[:, :2])

    def offset(self, lateral: float) -> "Polyline":
        """A parallel path ``lateral`` metres to the left (negative: right), vertex by vertex."""
        h = self.vertex_headings
        normal = np.column_stack([-np.sin(h), np.cos(h)])
        return Polyline(self.points + lateral * normal)

    def concatenate(self, other: "Polyline") -> "Polyline":
        return Polyline(np.vstack([self.points, other.points]))


def heading_error(heading: np.ndarray | float, reference: np.ndarray | float) -> np.ndarray | float:
    """heading - reference wrapped to [-pi, pi]."""
    return wrap_angle(np.asarray(heading, dtype=np.float64) - reference)


def make_lane(lane_id: str, centerline: np.ndarray, width: float, speed_limit: float,
              road_id: str = "", **fields: object) -> Lane:
    """A ``Lane`` whose boundaries are the centreline offset by +-width/2 (synthetic maps, tests)."""
    c = Polyline(centerline)
    return Lane(id=lane_id, centerline=c.points.copy(), left_boundary=c.offset(width / 2).points.copy(),
                right_boundary=c.offset(-width / 2).points.copy(), speed_limit=speed_limit,
                road_id=road_id, **fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Lane map
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneMatch:
    """A pose located on a lane."""

    lane_id: str
    s: float  # arc length along the lane centreline (m)
    lateral: float  # offset from the centreline (m), positive left
    heading_error: float  # pose heading - lane heading (rad)
    distance: float  # distance to the centreline (m)


class LaneMap:
    """Read-only query index over a ``LaneGraph`` (build once per map; see ``lane_map``)."""

    def __init__(self, graph: LaneGraph) -> None:
        self.graph = graph
        self.ids: list[str] = list(graph.lanes)
        self.centerlines: dict[str, Polyline] = {i: Polyline(graph.lanes[i].centerline) for i in self.ids}
        # All centreline segments of the map stacked, for one vectorised nearest-lane pass.
        a, v, lane_idx, s0 = [], [], [], []
        for k, lane_id in enumerate(self.ids):
            c = self.centerlines[lane_id]
            a.append(c.points[:-1])
            v.append(np.diff(c.points, axis=0))
            lane_idx.append(np.full(len(c.points) - 1, k))
            s0.append(c.s[:-1])
        self._seg_a = np.vstack(a) if a else np.zeros((0, 2))
        self._seg_v = np.vstack(v) if v else np.zeros((0, 2))
        self._seg_lane = np.concatenate(lane_idx) if lane_idx else np.zeros(0, dtype=int)
        self._seg_s0 = np.concatenate(s0) if s0 else np.zeros(0)
        self._seg_len = np.hypot(self._seg_v[:, 0], self._seg_v[:, 1])
        self._seg_heading = np.arctan2(self._seg_v[:, 1], self._seg_v[:, 0])

    def lane(self, lane_id: str) -> Lane:
        try:
            return self.graph.lanes[lane_id]
        except KeyError:
            raise KeyError(f"lane {lane_id!r} is not in the lane graph") from None

    # ---- locating poses --------------------------------------------------------------------------

    def match_lanes(self, x: float, y: float, heading: float | None = None,
                    max_distance: float = 10.0) -> list[LaneMatch]:
        """Every lane within ``max_distance`` of (x, y), best first (distance + heading cost)."""
        if len(self._seg_a) == 0:
            return []
        dist = self._segment_distances(x, y)
        herr = np.zeros_like(dist) if heading is None else wrap_angle(heading - self._seg_heading)
        cost = dist + HEADING_COST * (1.0 - np.cos(herr))
        # Best segment per lane: sort by cost and keep the first occurrence of each lane.
        order = np.lexsort((cost, self._seg_lane))
        first = order[np.r_[True, np.diff(self._seg_lane[order]) != 0]]
        first = first[dist[first] <= max_distance]
        first = first[np.argsort(cost[first], kind="stable")]
        out = []
        for m in first:
            lane_id = self.ids[self._seg_lane[m]]
            c = self.centerlines[lane_id]
            p = c.project(np.array([x, y]))
            out.append(LaneMatch(lane_id, float(p.s), float(p.lateral),
                                 float(herr[m]) if heading is not None else 0.0, float(dist[m])))
        return out

    def lanes_within(self, x: float, y: float, max_distance: float) -> list[str]:
        """Ids of the lanes whose centreline passes within ``max_distance`` of (x, y), in ``ids`` order:
        the lanes ``match_lanes`` returns, without locating the point on each."""
        near = np.zeros(len(self.ids), dtype=bool)
        if len(self._seg_a):
            near[self._seg_lane[self._segment_distances(x, y) <= max_distance]] = True
        return [self.ids[k] for k in np.flatnonzero(near)]

    def _segment_distances(self, x: float, y: float) -> np.ndarray:
        """(M,) distance (m) from (x, y) to every centreline segment of the map."""
        rel = np.array([x, y]) - self._seg_a
        t = np.clip(np.einsum("mk,mk->m", rel, self._seg_v) / np.maximum(self._seg_len ** 2, 1e-18), 0, 1)
        foot = self._seg_a + t[:, None] * self._seg_v
        return np.hypot(x - foot[:, 0], y - foot[:, 1])

    def nearest_lane(self, x: float, y: float, heading: float | None = None,
                     max_distance: float = 10.0) -> LaneMatch | None:
        """The lane a pose is on: nearest centreline, with heading disagreement penalised."""
        matches = self.match_lanes(x, y, heading, max_distance)
        return matches[0] if matches else None

    def lanes_containing(self, points: np.ndarray) -> list[list[str]]:
        """For each point (P, 2), the ids of the lanes whose polygon contains it."""
        pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        hits = [[] for _ in range(len(pts))]  # type: list[list[str]]
        for lane_id, poly in self.lane_polygons.items():
            inside = shapely.contains_xy(poly, pts[:, 0], pts[:, 1])
            for i in np.flatnonzero(inside):
                hits[i].append(lane_id)
        return hits

    # ---- topology --------------------------------------------------------------------------------

    def neighbours(self, lane_id: str) -> tuple[str | None, str | None]:
        """(left, right) same-direction neighbour lane ids, None where there is none."""
        lane = self.lane(lane_id)
        left = lane.left_neighbor if lane.left_neighbor in self.graph.lanes else None
        right = lane.right_neighbor if lane.right_neighbor in self.graph.lanes else None
        return left, right

    def road_lanes(self, road_id: str) -> list[str]:
        """The lanes of one road section ordered left to right (across the direction of travel)."""
        members = [i for i in self.ids if self.graph.lanes[i].road_id == road_id]
        if len(members) <= 1:
            return members
        # Order by the lateral offset of each lane's midpoint from a reference lane: robust to
        # missing or inconsistent neighbour links (CommonRoad maps have both).
        ref = self.centerlines[members[0]]
        mids = np.array([self.centerlines[i].interpolate(self.centerlines[i].length / 2)[:2]
                         for i in members])
        lateral = ref.project(mids).lateral
        return [members[k] for k in np.argsort(-lateral, kind="stable")]

    def route_lanes(self, start_lane: str, road_ids: list[str], max_lanes: int = 30) -> list[str]:
        """Lane sequence from ``start_lane`` along the route (successor edges only).

        Dijkstra (cost = lane length) over successors whose road is on the route at or after the
        current route position; returns the path that reaches the furthest route road, the shortest
        among those (PDM-Closed's centreline search). A start lane off the route still starts the
        path; the result always begins with ``start_lane``.
        """
        self.lane(start_lane)
        route_index: dict[str, int] = {}
        for k, r in enumerate(road_ids):
            route_index.setdefault(r, k)
        start_rank = route_index.get(self.graph.lanes[start_lane].road_id, -1)
        best_path = [start_lane]
        best_key = (start_rank, 0.0)
        heap: list[tuple[float, int, list[str], int]] = [(0.0, 0, [start_lane], start_rank)]
        done: set[str] = set()
        tie = 0
        while heap:
            cost, _, path, rank = heapq.heappop(heap)
            lane_id = path[-1]
            if lane_id in done:
                continue
            done.add(lane_id)
            if rank > best_key[0] or (rank == best_key[0] and len(path) > len(best_path) and rank >= 0):
                best_key, best_path = (rank, cost), path
            if len(path) >= max_lanes:
                continue
            for nxt in self.graph.lanes[lane_id].successors:
                if nxt not in self.graph.lanes or nxt in done:
                    continue
                r = route_index.get(self.graph.lanes[nxt].road_id)
                if r is None or r < max(rank, 0):
                    continue
                tie += 1
                heapq.heappush(heap, (cost + self.centerlines[nxt].length, tie, path + [nxt], r))
        return best_path

    def route_roads(self, lane_ids: list[str]) -> list[str]:
        """The road sections (``Route.road_ids``) a lane sequence passes, in order (the inverse of
        ``route_lanes``): consecutive lanes of one road count once."""
        roads: list[str] = []
        for lane_id in lane_ids:
            road = self.lane(lane_id).road_id
            if not roads or roads[-1] != road:
                roads.append(road)
        return roads

    def route_centerline(self, lane_ids: list[str]) -> Polyline:
        """The centrelines of a lane sequence joined into one polyline."""
        if not lane_ids:
            raise ValueError("route_centerline needs at least one lane")
        return Polyline(np.vstack([self.centerlines[i].points for i in lane_ids]))

    def distance_to_junction(self, lane_ids: list[str], s: float) -> float:
        """Distance (m) from arc length ``s`` on ``lane_ids[0]`` to the first junction lane of the
        sequence; 0 inside a junction, inf if the sequence has none."""
        dist = -s
        for lane_id in lane_ids:
            if self.graph.lanes[lane_id].in_junction:
                return max(dist, 0.0)
            dist += self.centerlines[lane_id].length
        return math.inf

    # ---- drivable area ---------------------------------------------------------------------------

    @cached_property
    def lane_polygons(self) -> dict[str, Polygon]:
        """Each lane's polygon: left boundary forward, right boundary backward (made valid)."""
        polys = {}
        for lane_id in self.ids:
            lane = self.graph.lanes[lane_id]
            ring = np.vstack([lane.left_boundary, lane.right_boundary[::-1]])
            poly = shapely.make_valid(Polygon(ring)) if len(ring) >= 3 else Polygon()
            shapely.prepare(poly)
            polys[lane_id] = poly
        return polys

    @cached_property
    def lane_raster(self) -> PolygonRaster:
        """Exact point-in-lane tests for all lane polygons at once (``luna_core.raster``), in ``ids`` order."""
        polys = self.lane_polygons
        return PolygonRaster([polys[i] for i in self.ids])

    @cached_property
    def lane_bounds(self) -> np.ndarray:
        """(L, 4) bounding box (min x, min y, max x, max y) of each lane polygon, in ``ids`` order
        (NaN for an empty polygon: no point is inside its box)."""
        polys = self.lane_polygons
        return shapely.bounds(np.array([polys[i] for i in self.ids], dtype=object)).reshape(-1, 4)

    @cached_property
    def drivable_area(self) -> shapely.Geometry:
        """Union of all lane polygons (prepared for fast point queries)."""
        area = shapely.union_all(list(self.lane_polygons.values()))
        shapely.prepare(area)
        return area

    def in_drivable_area(self, points: np.ndarray) -> np.ndarray:
        """Boolean (...,) for points (..., 2): inside (or on the border of) the drivable area."""
        pts = np.asarray(points, dtype=np.float64)
        flat = pts.reshape(-1, 2)
        return self._drivable_raster.membership(flat[:, 0], flat[:, 1])[:, 0].reshape(pts.shape[:-1])

    @cached_property
    def _drivable_raster(self) -> PolygonRaster:
        return PolygonRaster([self.drivable_area])

    def distance_to_drivable_area(self, points: np.ndarray) -> np.ndarray:
        """(...,) distance (m) of points (..., 2) outside the drivable area; 0 inside."""
        pts = np.asarray(points, dtype=np.float64)
        geoms = shapely.points(pts.reshape(-1, 2))
        return shapely.distance(self.drivable_area, geoms).reshape(pts.shape[:-1])


_CACHE: dict[int, tuple[weakref.ref, int, LaneMap]] = {}


def lane_map(graph: LaneGraph) -> LaneMap:
    """The ``LaneMap`` of ``graph``, built on first use and cached while the graph object lives
    (rebuilt if lanes were added or removed)."""
    key = id(graph)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is graph and hit[1] == len(graph.lanes):
        return hit[2]
    for k in [k for k, entry in _CACHE.items() if entry[0]() is None]:  # ids of dead graphs are reused
        del _CACHE[k]
    lm = LaneMap(graph)
    _CACHE[key] = (weakref.ref(graph), len(graph.lanes), lm)
    return lm


def route_lanes_from_pose(graph: LaneGraph, route: Route, x: float, y: float,
                          heading: float) -> tuple[list[str], LaneMatch] | None:
    """The route lane sequence starting at the lane the pose is on (preferring on-route lanes),
    with that match; None if no lane is near the pose."""
    lm = lane_map(graph)
    matches = lm.match_lanes(x, y, heading)
    if not matches:
        return None
    on_route = set(route.road_ids)
    good = [m for m in matches if abs(m.heading_error) < math.pi / 2]
    # Prefer an on-route lane that contains the pose laterally over the nearest lane off-route.
    pick = next((m for m in good if graph.lanes[m.lane_id].road_id in on_route
                 and abs(m.lateral) <= graph.lanes[m.lane_id].width / 2 + 0.5), None)
    match = pick or (good[0] if good else matches[0])
    return lm.route_lanes(match.lane_id, list(route.road_ids)), match
