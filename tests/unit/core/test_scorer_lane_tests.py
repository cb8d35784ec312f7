"""The scorer's lane tests (the lane-id raster of ``luna_core.raster`` with GEOS near the polygon
edges, lane families built only from the lanes holding some corner) give exactly what the plain
definitions give: every point tested against every lane polygon with ``shapely.intersects_xy``, and
every lane's family checked in turn. The raster alone is checked against shapely on awkward
geometries (a hole, ``make_valid``'s bow tie, lines and points, UTM-sized coordinates) with points on
and beside edges, vertices and cell corners.

Maps: the real NGSIM intersection USA_Lanker-1_10_T-1 (CommonRoad, ../shared/scenarios/commonroad or
$LUNA_COMMONROAD_DIR) and the synthetic suite's left-turn junction (hard_starting_left_turn_00).
Points: random around the ego, every polygon vertex, points on polygon edges, points on and just
outside each lane's bounding box, and non-finite points.
"""

from __future__ import annotations

import numpy as np
import pytest
import shapely

from luna_bridge.scenarios import commonroad_dir, suite_refs
from luna_bridge.scenarios.registry import load_entry
from luna_core.lanes import LaneMap, lane_map
from luna_core.planning.scorer import in_common_or_connected_lanes, in_junction, lane_membership, oncoming_mask
from luna_core.raster import EDGE, MAX_CELLS, PolygonRaster
from luna_core.types import box_corners, wrap_angle

CR_DIR = commonroad_dir()
SCENARIOS = [
    pytest.param(("commonroad", "USA_Lanker-1_10_T-1"),
                 marks=pytest.mark.skipif(not (CR_DIR / "USA_Lanker-1_10_T-1.xml").is_file(),
                                          reason=f"CommonRoad scenarios not found at {CR_DIR} "
                                                 "(set LUNA_COMMONROAD_DIR)"), id="commonroad-lanker"),
    pytest.param(("synthetic-hard", "hard_starting_left_turn_00"), id="synthetic-left-turn"),
]


@pytest.fixture(scope="module", params=SCENARIOS)
def case(request) -> tuple[LaneMap, np.ndarray]:
    """(lane map, ego rear-axle x, y) of the scenario at t = 0."""
    suite, name = request.param
    ref = next(r for r in suite_refs(suite) if r[0] == name)
    sc = load_entry(ref[1], ref[2])
    return lane_map(sc.lane_graph), np.array([sc.ego_initial.x, sc.ego_initial.y])


def reference_membership(lanes: LaneMap, points: np.ndarray) -> np.ndarray:
    """(..., L): every point against every lane polygon, no prefilter."""
    flat = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    out = np.column_stack([shapely.intersects_xy(lanes.lane_polygons[i], flat[:, 0], flat[:, 1])
                           for i in lanes.ids])
    return out.reshape(np.shape(points)[:-1] + (len(lanes.ids),))


def reference_family(lanes: LaneMap) -> list[set[int]]:
    """Per lane, the lane itself and the lanes connected to it end to end (either direction)."""
    index = {lane_id: j for j, lane_id in enumerate(lanes.ids)}
    family = [{j} for j in range(len(lanes.ids))]
    for j, lane_id in enumerate(lanes.ids):
        lane = lanes.graph.lanes[lane_id]
        for other in (*lane.successors, *lane.predecessors):
            if other in index:
                family[j].add(index[other])
                family[index[other]].add(j)
    return family


def reference_common(lanes: LaneMap, corners: np.ndarray) -> np.ndarray:
    """(...,): some lane whose family holds every one of the 4 corners."""
    member = reference_membership(lanes, corners)  # (..., 4, L)
    out = np.zeros(member.shape[:-2], dtype=bool)
    for fam in reference_family(lanes):
        out |= np.all(member[..., sorted(fam)].any(axis=-1), axis=-1)
    return out


def reference_junction(lanes: LaneMap, points: np.ndarray) -> np.ndarray:
    junction = [j for j, i in enumerate(lanes.ids) if lanes.graph.lanes[i].in_junction]
    return reference_membership(lanes, points)[..., junction].any(axis=-1)


def probe_points(lanes: LaneMap, centre: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, 2): random points within 60 m of ``centre`` and the hard cases of every lane: polygon
    vertices, points on its edges, its bounding-box corners and edge midpoints, and the next
    floats just outside the box."""
    pts = [centre + rng.uniform(-60.0, 60.0, (3000, 2))]
    for j, lane_id in enumerate(lanes.ids):
        ring = shapely.get_coordinates(lanes.lane_polygons[lane_id])
        pts.append(ring)
        t = rng.uniform(0.0, 1.0, (len(ring) - 1, 1))
        pts.append(ring[:-1] + t * np.diff(ring, axis=0))  # on the edges, up to rounding
        pts.append(0.5 * (ring[:-1] + ring[1:]))
        x0, y0, x1, y1 = lanes.lane_bounds[j]
        xm, ym = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
        pts.append(np.array([[x0, y0], [x1, y1], [x0, y1], [x1, y0], [x0, ym], [x1, ym], [xm, y0], [xm, y1],
                             [np.nextafter(x0, -np.inf), ym], [np.nextafter(x1, np.inf), ym],
                             [xm, np.nextafter(y0, -np.inf)], [xm, np.nextafter(y1, np.inf)]]))
    return np.vstack(pts)


def test_lane_membership_and_junction_equal_the_plain_shapely_test(case) -> None:
    lanes, centre = case
    pts = probe_points(lanes, centre, np.random.default_rng(0))
    member = lane_membership(lanes, pts)
    expected = reference_membership(lanes, pts)
    assert member.dtype == bool and member.shape == expected.shape
    np.testing.assert_array_equal(member, expected)
    assert expected.any() and not expected.all()  # the probes hit and miss lanes
    np.testing.assert_array_equal(in_junction(lanes, pts), reference_junction(lanes, pts))
    assert reference_junction(lanes, pts).any()  # both maps have junction lanes under the probes
    # leading shape kept; non-finite points are in no lane, as shapely says
    grid = pts[:600].reshape(20, 30, 2)
    np.testing.assert_array_equal(lane_membership(lanes, grid), expected[:600].reshape(20, 30, -1))
    odd = np.array([[np.nan, centre[1]], [centre[0], np.inf], [-np.inf, np.nan]])
    np.testing.assert_array_equal(lane_membership(lanes, odd), reference_membership(lanes, odd))
    assert not lane_membership(lanes, odd).any()


def test_oncoming_mask_equals_every_lane_checked(case) -> None:
    """Points in some lane but agreeing with none (heading within 90 deg of the lane's at the foot
    point): the plain form projects every point on every lane holding it."""
    lanes, centre = case
    rng = np.random.default_rng(5)
    pts = probe_points(lanes, centre, rng)
    heading = rng.uniform(-np.pi, np.pi, len(pts))
    member = reference_membership(lanes, pts)
    agree = np.zeros(len(pts), dtype=bool)
    for j, lane_id in enumerate(lanes.ids):
        hit = member[:, j]
        if hit.any():
            proj = lanes.centerlines[lane_id].project(pts[hit])
            agree[hit] |= np.abs(wrap_angle(heading[hit] - proj.heading)) < np.pi / 2
    expected = member.any(axis=1) & ~agree
    np.testing.assert_array_equal(oncoming_mask(lanes, pts, heading), expected)
    assert expected.any() and (member.any(axis=1) & ~expected).any()
    grid = pts[:600].reshape(20, 30, 2)
    np.testing.assert_array_equal(oncoming_mask(lanes, grid, heading[:600].reshape(20, 30)),
                                  expected[:600].reshape(20, 30))


def test_lanes_within_is_the_set_match_lanes_finds(case) -> None:
    lanes, centre = case
    for reach in (5.0, 40.0, 200.0):
        assert lanes.lanes_within(centre[0], centre[1], reach) == sorted(
            (m.lane_id for m in lanes.match_lanes(centre[0], centre[1], None, reach)), key=lanes.ids.index)
    assert lanes.lanes_within(centre[0] + 1e4, centre[1], 40.0) == []


def test_in_drivable_area_equals_the_plain_shapely_test(case) -> None:
    lanes, centre = case
    pts = probe_points(lanes, centre, np.random.default_rng(1))
    plain = shapely.intersects_xy(lanes.drivable_area, pts[:, 0], pts[:, 1])
    np.testing.assert_array_equal(lanes.in_drivable_area(pts), plain)
    x0, y0, x1, y1 = shapely.bounds(lanes.drivable_area)
    far = np.array([[x0 - 1.0, y0], [x1, y1 + 1.0]])
    assert not lanes.in_drivable_area(far).any()


def test_in_common_or_connected_lanes_equals_the_lane_family_definition(case) -> None:
    lanes, centre = case
    rng = np.random.default_rng(2)
    # Ego footprints: around the ego with any heading, and on lane centrelines along the lane (the
    # realistic case: mostly inside one lane or a connected pair, some straddling).
    n = 4000
    xy = centre + rng.uniform(-50.0, 50.0, (n, 2))
    corners = [box_corners(xy[:, 0], xy[:, 1], rng.uniform(-np.pi, np.pi, n), 5.2, 2.0)]
    for lane_id in lanes.ids:
        c = lanes.centerlines[lane_id]
        pose = c.interpolate(rng.uniform(0.0, c.length, 20))
        lateral = rng.normal(0.0, 1.0, 20)
        x = pose[:, 0] - lateral * np.sin(pose[:, 2])
        y = pose[:, 1] + lateral * np.cos(pose[:, 2])
        corners.append(box_corners(x, y, pose[:, 2] + rng.normal(0.0, 0.1, 20), 5.2, 2.0))
    # Quadruples of the hard points (polygon vertices, edges, box borders) as "footprints".
    hard = probe_points(lanes, centre, rng)[3000:]
    corners.append(hard[rng.integers(0, len(hard), (2000, 4))])
    corners.append(np.repeat(hard[:, None], 4, axis=1))  # one hard point, four times
    corners = np.concatenate(corners)
    got = in_common_or_connected_lanes(lanes, corners)
    expected = reference_common(lanes, corners)
    np.testing.assert_array_equal(got, expected)
    assert 0.05 < expected.mean() < 0.95  # both outcomes are exercised
    # proposals x steps layout, as the scorer calls it
    grid = corners[:1200].reshape(30, 40, 4, 2)
    np.testing.assert_array_equal(in_common_or_connected_lanes(lanes, grid), expected[:1200].reshape(30, 40))


def raster_probes(geometry: shapely.Geometry, rng: np.random.Generator, cell: float) -> np.ndarray:
    """(N, 2): random points over the geometry's box, its vertices, points on (and within 1e-9 m of)
    its edges, the lattice cell corners around it, and the next floats beside each of those."""
    x0, y0, x1, y1 = shapely.bounds(geometry)
    pts = [np.column_stack([rng.uniform(x0 - 1, x1 + 1, 4000), rng.uniform(y0 - 1, y1 + 1, 4000)])]
    for ring in [shapely.get_coordinates(g) for g in shapely.get_parts(shapely.get_rings(geometry))] or \
            [shapely.get_coordinates(geometry)]:
        pts.append(ring)
        if len(ring) > 1:
            t = rng.uniform(0.0, 1.0, (len(ring) - 1, 50, 1))
            on = ring[:-1, None] + t * np.diff(ring, axis=0)[:, None]
            pts += [on.reshape(-1, 2), on.reshape(-1, 2) + rng.normal(0.0, 1e-9, (on.size // 2, 2))]
    gx, gy = np.meshgrid(np.arange(np.floor(x0 / cell) - 1, np.floor(x1 / cell) + 2) * cell,
                         np.arange(np.floor(y0 / cell) - 1, np.floor(y1 / cell) + 2) * cell)
    pts.append(np.column_stack([gx.ravel(), gy.ravel()]))
    pts = np.vstack(pts)
    return np.vstack([pts, np.nextafter(pts, np.inf), np.nextafter(pts, -np.inf)])


def _bow_tie(ox: float, oy: float) -> shapely.Geometry:
    # make_valid of a self-intersecting ring: two triangles meeting at a point
    return shapely.make_valid(shapely.Polygon([(ox, oy), (ox + 4, oy + 3), (ox + 4, oy), (ox, oy + 3)]))


@pytest.mark.parametrize("name", ["square", "rotated strip", "bow tie", "hole", "with line", "far away"])
def test_polygon_raster_equals_shapely_everywhere(name: str) -> None:
    geometry = {
        "square": shapely.box(0.0, 0.0, 1.0, 1.0),
        "rotated strip": shapely.Polygon([(0.1, 0.0), (30.0, 17.3), (28.3, 20.2), (-1.6, 2.9)]),
        "bow tie": _bow_tie(0.3, -0.7),
        "hole": shapely.box(-3.0, -3.0, 3.0, 3.0).difference(shapely.box(-1.0, -1.1, 1.3, 1.0)),
        "with line": shapely.GeometryCollection([shapely.box(0.0, 0.0, 2.0, 1.0),
                                                 shapely.LineString([(2.0, 0.5), (5.3, 2.7)]),
                                                 shapely.Point(6.1, -0.2)]),
        "far away": shapely.Polygon([(512345.6, 5402111.1), (512401.2, 5402131.9), (512399.9, 5402135.4),
                                     (512344.3, 5402114.6)]),  # UTM-sized coordinates
    }[name]
    raster = PolygonRaster([geometry, shapely.Polygon()])
    pts = raster_probes(geometry, np.random.default_rng(3), raster.cell)
    got = raster.membership(pts[:, 0], pts[:, 1])
    expected = shapely.intersects_xy(geometry, pts[:, 0], pts[:, 1])
    np.testing.assert_array_equal(got[:, 0], expected)
    assert expected.any() and not expected.all()
    assert not got[:, 1].any()  # the empty polygon holds nothing
    if name in ("rotated strip", "hole", "far away"):  # lane-sized: most cells answer without GEOS
        assert (raster.kind == EDGE).mean() < 0.4
    odd = np.array([np.nan, np.inf, -np.inf, 0.5])
    assert not raster.membership(odd, odd[::-1]).any()


def test_polygon_raster_coarsens_its_cells_on_a_large_map() -> None:
    big = [shapely.box(0.0, 0.0, 4000.0, 3.5), shapely.box(0.0, 0.0, 3.5, 4000.0)]
    raster = PolygonRaster(big)
    assert raster.cell > 0.25 and np.prod(raster.shape) <= MAX_CELLS
    pts = raster_probes(big[0], np.random.default_rng(4), raster.cell)
    np.testing.assert_array_equal(raster.membership(pts[:, 0], pts[:, 1]),
                                  np.column_stack([shapely.intersects_xy(g, pts[:, 0], pts[:, 1]) for g in big]))
    empty = PolygonRaster([])
    assert empty.membership(np.zeros(3), np.zeros(3)).shape == (3, 0)
