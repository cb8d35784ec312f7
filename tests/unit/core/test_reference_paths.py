"""Reference paths per lateral decision on a hand-built three-lane road followed by a one-lane road."""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.lanes import make_lane
from luna_core.planning.reference_paths import DEFAULT_SPEED_LIMIT, OffMapError, reference_paths
from luna_core.types import EgoState, LaneGraph, Route


def three_lane_graph() -> LaneGraph:
    g = LaneGraph()
    # Road A (x 0..100): A0 left (y 3.5), A1 middle (y 0), A2 right (y -3.5); A1 continues as B1.
    g.add(make_lane("A0", [[0, 3.5], [100, 3.5]], 3.5, 20.0, "A", right_neighbor="A1", successors=["B0"]))
    g.add(make_lane("A1", [[0, 0], [100, 0]], 3.5, 15.0, "A", left_neighbor="A0", right_neighbor="A2",
                    successors=["B1"]))
    g.add(make_lane("A2", [[0, -3.5], [100, -3.5]], 3.5, 0.0, "A", left_neighbor="A1"))
    g.add(make_lane("B0", [[100, 3.5], [200, 3.5]], 3.5, 20.0, "B", right_neighbor="B1"))
    g.add(make_lane("B1", [[100, 0], [200, 0]], 3.5, 15.0, "B", left_neighbor="B0"))
    return g


ROUTE = Route(0.0, road_ids=["A", "B"])


def ego_at(x: float, y: float, heading: float = 0.0, velocity: float = 10.0) -> EgoState:
    return EgoState(0.0, x, y, heading, velocity)


def test_keep_left_right_follow_their_lanes_along_the_route() -> None:
    # At 5 m/s the right lane's end (80 m ahead) is beyond the 40 m a lane change needs to stay on route.
    paths = reference_paths(three_lane_graph(), ROUTE, ego_at(20.0, 0.4, velocity=5.0))
    assert set(paths) == {"K", "L", "R"}
    assert paths["K"].lane_ids == ("A1", "B1")
    assert paths["L"].lane_ids == ("A0", "B0")
    assert paths["R"].lane_ids == ("A2",)
    pts = np.array([[30.0, 0.0], [150.0, 1.0]])
    np.testing.assert_allclose(paths["K"].lateral_offset(pts), [0.0, 1.0], atol=1e-9)
    np.testing.assert_allclose(paths["L"].lateral_offset(pts), [-3.5, -2.5], atol=1e-9)
    np.testing.assert_allclose(paths["R"].lateral_offset(pts[:1]), [3.5], atol=1e-9)
    # Cropped to 10 m behind the ego, ego foot point recorded, speed limits from the first lane.
    assert paths["K"].centerline.points[0, 0] == pytest.approx(10.0)
    assert paths["K"].ego_s == pytest.approx(10.0)
    assert paths["L"].speed_limit == 20.0
    assert paths["R"].speed_limit == DEFAULT_SPEED_LIMIT  # 0 = unknown in the map


@pytest.mark.parametrize("x, velocity, offered", [
    (10.0, 5.0, True),  # A2 ends 90 m ahead: room to change back (40 m at 5 m/s)
    (50.0, 5.0, True),  # 50 m ahead
    (70.0, 5.0, False),  # 30 m ahead
    (50.0, 10.0, False),  # 50 m ahead, but 8 s at 10 m/s is 80 m
    (10.0, 10.0, True),  # 90 m ahead
])
def test_a_lane_change_onto_a_lane_that_soon_leaves_the_route_is_not_offered(x, velocity, offered) -> None:
    # A2 (right) ends at x = 100 m while the ego's lane A1 continues on the route as B1; the left lane A0
    # continues as B0 and is always offered.
    paths = reference_paths(three_lane_graph(), ROUTE, ego_at(x, 0.0, velocity=velocity))
    assert ("R" in paths) == offered
    assert "L" in paths and paths["L"].lane_ids == ("A0", "B0")


def test_a_lane_leaving_the_route_is_offered_when_the_ego_lane_leaves_it_too() -> None:
    # The ego on A2 (which ends at x = 100 m): its own lane is no better, so the left lane stays offered
    # (the change back onto the route), and A2 is kept as K whatever.
    paths = reference_paths(three_lane_graph(), ROUTE, ego_at(80.0, -3.5))
    assert paths["K"].lane_ids == ("A2",)
    assert paths["L"].lane_ids == ("A1", "B1")


def test_no_lane_on_a_side_means_no_path_for_it() -> None:
    paths = reference_paths(three_lane_graph(), ROUTE, ego_at(20.0, 3.4))
    assert set(paths) == {"K", "R"}
    assert paths["R"].lane_ids == ("A1", "B1")


def test_empty_graph_and_off_map_raise_named_errors() -> None:
    with pytest.raises(OffMapError, match="empty"):
        reference_paths(LaneGraph(), ROUTE, ego_at(0, 0))
    with pytest.raises(OffMapError, match="no lane"):
        reference_paths(three_lane_graph(), ROUTE, ego_at(50.0, 80.0))
    with pytest.raises(OffMapError, match="not finite"):
        reference_paths(three_lane_graph(), ROUTE, ego_at(float("nan"), 0.0))


def test_fast_lateral_offset_matches_polyline_projection_on_a_curve() -> None:
    g = LaneGraph()
    a = np.linspace(-np.pi / 2, np.pi / 2, 60)
    arc = np.column_stack([30.0 * np.cos(a), 30.0 + 30.0 * np.sin(a)])  # radius 30 m left turn
    g.add(make_lane("C", arc, 3.5, 10.0, "C"))
    path = reference_paths(g, Route(0.0, ["C"]), EgoState(0.0, 0.0, 0.0, 0.0, 5.0))["K"]
    rng = np.random.default_rng(0)
    s = rng.uniform(0.0, path.centerline.length, 500)
    base = path.centerline.interpolate(s)
    d = rng.uniform(-6.0, 6.0, 500)
    pts = base[:, :2] + d[:, None] * np.column_stack([-np.sin(base[:, 2]), np.cos(base[:, 2])])
    np.testing.assert_allclose(path.lateral_offset(pts), path.centerline.project(pts).lateral, atol=1e-6)
    np.testing.assert_allclose(path.lateral_offset(pts), d, atol=0.05)  # chords of a 30 m circle
    beyond = np.array([[path.centerline.points[-1, 0] - 10.0, path.centerline.points[-1, 1] + 1.0]])
    np.testing.assert_allclose(path.lateral_offset(beyond), path.centerline.project(beyond).lateral, atol=1e-9)
