"""Lane-graph queries on a small hand-built map: a two-lane road A (eastbound), a junction J with a
straight connector to road B and a right-turn connector to road C (southbound)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luna_core.lanes import Polyline, lane_map, make_lane, route_lanes_from_pose
from luna_core.types import LaneGraph, Route


def _arc(cx: float, cy: float, r: float, a0: float, a1: float, n: int = 20) -> np.ndarray:
    a = np.linspace(a0, a1, n)
    return np.column_stack([cx + r * np.cos(a), cy + r * np.sin(a)])


def build_graph() -> LaneGraph:
    g = LaneGraph()
    w = 3.5
    # Road A, x 0..50: A0 is the left lane (y = 3.5), A1 the right lane (y = 0).
    g.add(make_lane("A0", [[0, 3.5], [50, 3.5]], w, 15.0, "A", right_neighbor="A1"))
    g.add(make_lane("A1", [[0, 0], [25, 0], [50, 0]], w, 15.0, "A", left_neighbor="A0",
                    successors=["J0", "J1"]))
    # Junction: straight connector J0 to B1, right turn J1 (radius 20 around (50, -20)) to C1.
    g.add(make_lane("J0", [[50, 0], [70, 0]], w, 10.0, "J", successors=["B1"], predecessors=["A1"],
                    in_junction=True))
    g.add(make_lane("J1", _arc(50, -20, 20, math.pi / 2, 0.0), w, 10.0, "J2", successors=["C1"],
                    predecessors=["A1"], in_junction=True))
    g.add(make_lane("B1", [[70, 0], [150, 0]], w, 15.0, "B", predecessors=["J0"]))
    g.add(make_lane("C1", [[70, -20], [70, -100]], w, 15.0, "C", predecessors=["J1"]))
    return g


def test_polyline_projection_on_a_straight_line_signs_and_extrapolation() -> None:
    line = Polyline([[0, 0], [10, 0], [20, 0]])
    p = line.project(np.array([[5, 2], [15, -1], [-3, 1], [25, 0.5]]))
    np.testing.assert_allclose(p.s, [5, 15, -3, 25])
    np.testing.assert_allclose(p.lateral, [2, -1, 1, 0.5])  # left positive
    np.testing.assert_allclose(p.heading, 0.0)
    np.testing.assert_allclose(p.distance, [2, 1, math.hypot(3, 1), math.hypot(5, 0.5)])
    assert line.length == 20.0


def test_polyline_keeps_leading_shape_and_drops_duplicates() -> None:
    line = Polyline([[0, 0], [0, 0], [0, 10]])
    assert len(line) == 2
    p = line.project(np.zeros((4, 5, 2)))
    assert p.s.shape == (4, 5)
    np.testing.assert_allclose(p.heading, math.pi / 2)


def test_polyline_rejects_nan() -> None:
    with pytest.raises(ValueError, match="finite"):
        Polyline([[0, 0], [np.nan, 1]])


def test_interpolate_on_arc_follows_the_tangent() -> None:
    arc = Polyline(_arc(0, 0, 10, 0, math.pi / 2, n=200))
    pose = arc.interpolate(arc.length / 2)
    np.testing.assert_allclose(pose[:2], [10 * math.cos(math.pi / 4), 10 * math.sin(math.pi / 4)], atol=1e-3)
    assert abs(pose[2] - 3 * math.pi / 4) < 1e-2  # tangent of a CCW arc at 45 deg
    assert arc.interpolate(np.zeros((3, 2))).shape == (3, 2, 3)


def test_resample_spacing_and_end_point() -> None:
    line = Polyline([[0, 0], [10, 0], [10, 7]]).resample(1.0)
    assert len(line) == 18
    np.testing.assert_allclose(np.diff(line.s), 1.0, atol=1e-9)
    np.testing.assert_allclose(line.points[-1], [10, 7])


def test_offset_is_parallel_on_the_left() -> None:
    off = Polyline([[0, 0], [10, 0]]).offset(1.5)
    np.testing.assert_allclose(off.points, [[0, 1.5], [10, 1.5]])


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(-1.0, 1.0))
def test_project_inverts_interpolate_on_a_smooth_curve(frac: float, lat: float) -> None:
    curve = Polyline(_arc(0, 0, 30, -0.5, 1.0, n=300))
    s = frac * curve.length
    x, y, h = curve.interpolate(s)
    q = np.array([x - lat * math.sin(h), y + lat * math.cos(h)])
    p = curve.project(q)
    assert abs(float(p.s) - s) < 0.05
    assert abs(float(p.lateral) - lat) < 0.01


def test_nearest_lane_parallel_lanes_by_distance() -> None:
    lm = lane_map(build_graph())
    m = lm.nearest_lane(20.0, 3.0, heading=0.1)
    assert m is not None and m.lane_id == "A0"
    assert abs(m.s - 20.0) < 1e-9 and abs(m.lateral + 0.5) < 1e-9
    assert lm.nearest_lane(20.0, 0.4, heading=0.0).lane_id == "A1"
    assert lm.nearest_lane(500.0, 500.0) is None


def test_nearest_lane_overlapping_connectors_by_heading() -> None:
    lm = lane_map(build_graph())
    # Just inside the junction both connectors pass close by; the heading tells them apart.
    x, y = 56.0, -0.45  # 0.45 m from J0, about 0.47 m from J1
    assert lm.nearest_lane(x, y, heading=0.0).lane_id == "J0"
    assert lm.nearest_lane(x, y, heading=-0.3).lane_id == "J1"  # J1 heads -0.3 rad here


def test_neighbours_and_road_order_left_to_right() -> None:
    lm = lane_map(build_graph())
    assert lm.neighbours("A1") == ("A0", None)
    assert lm.neighbours("A0") == (None, "A1")
    assert lm.road_lanes("A") == ["A0", "A1"]
    assert lm.road_lanes("B") == ["B1"]
    assert lm.road_lanes("nothing") == []


def test_route_lanes_follow_the_route_roads() -> None:
    lm = lane_map(build_graph())
    assert lm.route_lanes("A1", ["A", "J", "B"]) == ["A1", "J0", "B1"]
    assert lm.route_lanes("A1", ["A", "J2", "C"]) == ["A1", "J1", "C1"]
    assert lm.route_lanes("A0", ["A", "J", "B"]) == ["A0"]  # no successor: a lane change is needed
    assert lm.route_lanes("J0", ["A", "J", "B"]) == ["J0", "B1"]
    with pytest.raises(KeyError, match="nope"):
        lm.route_lanes("nope", ["A"])


def test_route_roads_is_the_inverse_of_route_lanes() -> None:
    lm = lane_map(build_graph())
    for roads in (["A", "J", "B"], ["A", "J2", "C"]):
        assert lm.route_roads(lm.route_lanes("A1", roads)) == roads
    assert lm.route_roads(["A0", "A1", "J0"]) == ["A", "J"]  # a lane change within one road counts once
    assert lm.route_roads([]) == []
    with pytest.raises(KeyError, match="nope"):
        lm.route_roads(["nope"])


def test_route_centerline_and_distance_to_junction() -> None:
    lm = lane_map(build_graph())
    lanes = lm.route_lanes("A1", ["A", "J2", "C"])
    c = lm.route_centerline(lanes)
    expected = 50.0 + lm.centerlines["J1"].length + 80.0
    assert abs(c.length - expected) < 1e-6
    assert abs(lm.distance_to_junction(lanes, 12.0) - 38.0) < 1e-9
    assert lm.distance_to_junction(lanes[1:], 3.0) == 0.0
    assert lm.distance_to_junction(["B1"], 0.0) == math.inf


def test_route_lanes_from_pose_prefers_on_route_lane() -> None:
    g = build_graph()
    lanes, match = route_lanes_from_pose(g, Route(0.0, ["A", "J", "B"]), 10.0, 0.3, 0.0)
    assert lanes == ["A1", "J0", "B1"] and match.lane_id == "A1"


def test_drivable_area_points_and_distance() -> None:
    lm = lane_map(build_graph())
    pts = np.array([[10, 0], [10, 5.0], [10, 5.5], [100, 1.7], [100, 3.0], [69.0, -50.0]])
    np.testing.assert_array_equal(lm.in_drivable_area(pts), [True, True, False, True, False, True])
    d = lm.distance_to_drivable_area(pts)
    np.testing.assert_allclose(d[[0, 2, 4]], [0.0, 0.25, 1.25], atol=1e-9)


def test_lanes_containing_on_the_shared_boundary_region() -> None:
    lm = lane_map(build_graph())
    hits = lm.lanes_containing(np.array([[10.0, 1.0], [10.0, 2.5], [10.0, 9.0]]))
    assert hits == [["A1"], ["A0"], []]


def test_lane_map_is_cached_per_graph_and_rebuilt_on_change() -> None:
    g = build_graph()
    assert lane_map(g) is lane_map(g)
    first = lane_map(g)
    g.add(make_lane("Z", [[0, 50], [10, 50]], 3.0, 5.0, "Z"))
    assert lane_map(g) is not first and "Z" in lane_map(g).centerlines
