"""The stop API (luna_core.planning.fallback): every stop of the stack is ``stop_along`` (or
``comfortable_stop``, which finds the path for it); it brakes along the lane and never pulls the ego
sideways."""

import math

import numpy as np
import pytest

from luna_core.lanes import Polyline, make_lane
from luna_core.planning.fallback import COMFORTABLE_DECELERATION, LATERAL_BLEND_DISTANCE, comfortable_stop, stop_along
from luna_core.planning.reference_paths import reference_paths
from luna_core.types import EgoState, LaneGraph, Route

LANE = Polyline(np.array([[0.0, 0.0], [200.0, 0.0]]))


def test_a_standing_ego_beside_the_centreline_is_told_to_stay_where_it_is() -> None:
    ego = EgoState(0.0, 50.0, -1.5, 0.2, 0.0)
    stop = stop_along(ego, LANE)
    assert np.allclose(stop.x, 50.0) and np.allclose(stop.y, -1.5), "a stop at standstill must not move the ego"
    assert np.all(stop.velocity == 0.0)


def test_a_moving_ego_joins_the_centreline_over_the_blend_distance() -> None:
    v0 = 12.0
    ego = EgoState(0.0, 20.0, 1.0, 0.0, v0)
    stop = stop_along(ego, LANE)
    steps = np.hypot(np.diff(stop.x), np.diff(stop.y))
    assert steps.max() <= v0 * 0.1 + 1e-6 + 0.1 * 1.0, "no sideways jump between consecutive poses"
    travelled = stop.x - 20.0
    assert np.allclose(stop.y, 1.0 * np.clip(1.0 - travelled / LATERAL_BLEND_DISTANCE, 0.0, 1.0), atol=1e-9)
    assert abs(travelled[-1] - v0 ** 2 / (2 * COMFORTABLE_DECELERATION)) < 1e-9
    assert stop.velocity[-1] == 0.0 and np.all(np.diff(stop.velocity) <= 1e-12)


def test_a_stop_follows_a_path_round_a_corner() -> None:
    """The simulator's stop after a planner failure runs along the last valid plan."""
    ego = EgoState(1.0, 0.0, 0.0, 0.0, 8.0)
    traj = stop_along(ego, Polyline([[0, 0], [10, 0], [10, 50]]))
    assert traj.stamp == 1.0 and traj.velocity[0] == 8.0 and traj.velocity[-1] == 0.0
    # 8 m/s at 3 m/s^2 stops after 10.67 m: 0.67 m past the corner, along the path.
    assert traj.x[-1] == pytest.approx(10.0, abs=0.01) and traj.y[-1] == pytest.approx(64 / 6 - 10.0, abs=0.01)
    assert np.all(np.diff(traj.velocity) <= 0)


def _reference_stop(ego: EgoState, path: Polyline | None, deceleration: float, horizon: float,
                    dt: float) -> np.ndarray:
    """The stop the call sites' former builders produced, pose by pose (t, x, y, heading, v, a): braking
    kinematics written out per step, the path's pose at the travelled arc length, the ego's offset from
    its foot point fading linearly over LATERAL_BLEND_DISTANCE of travel, the first pose the ego's."""
    v0 = max(ego.velocity, 0.0)
    t_stop = v0 / deceleration
    foot = None if path is None or path.length <= 0.5 else float(path.project(np.array([ego.x, ego.y])).s)
    rows = []
    for k in range(int(round(horizon / dt)) + 1):
        t = k * dt
        tc = min(t, t_stop)
        s = v0 * tc - 0.5 * deceleration * tc * tc
        v, a = max(v0 - deceleration * t, 0.0), (-deceleration if t < t_stop else 0.0)
        if foot is None:
            pose = (ego.x + s * math.cos(ego.heading), ego.y + s * math.sin(ego.heading), ego.heading)
        elif k == 0:
            pose = (ego.x, ego.y, ego.heading)
        else:
            x, y, h = path.interpolate(np.array([foot + s]))[0]
            fx, fy = path.interpolate(np.array([foot]))[0, :2]
            fade = min(max(1.0 - s / LATERAL_BLEND_DISTANCE, 0.0), 1.0)
            pose = (x + fade * (ego.x - fx), y + fade * (ego.y - fy), h)
        rows.append((t, *pose, v, a))
    return np.array(rows)


def _rows(traj) -> np.ndarray:
    return np.column_stack([traj.t, traj.x, traj.y, traj.heading, traj.velocity, traj.acceleration])


BEND = Polyline(np.array([[0.0, 0.0], [30.0, 0.0], [60.0, 15.0], [90.0, 45.0]]))


@pytest.mark.parametrize("ego, path, deceleration, horizon, dt", [
    # the simulator after a planner failure: along the last plan, 3 m/s^2 over 8 s
    (EgoState(4.0, 5.0, 0.3, 0.05, 11.0), BEND, COMFORTABLE_DECELERATION, 8.0, 0.1),
    # the decision-guided planner's Stop warm starts: 1 .. 4 m/s^2 along the lane, 80 steps of 0.1 s
    *[(EgoState(10.0, 20.0, -0.8, 0.0, 10.0), BEND, d, 80 * 0.1, 0.1) for d in np.linspace(1.0, 4.0, 5)],
    # its off-map stop: straight ahead at its 2 m/s^2
    (EgoState(10.0, 50.0, 60.0, 0.7, 10.0), None, 2.0, 8.0, 0.1),
    # a standing or reversing ego, and a path too short to follow
    (EgoState(0.0, 40.0, 1.0, 0.1, -0.5), BEND, COMFORTABLE_DECELERATION, 8.0, 0.1),
    (EgoState(0.0, 0.0, 0.0, 0.0, 6.0), Polyline(np.array([[0.0, 0.0], [0.3, 0.0]])), 3.0, 4.0, 0.05),
])
def test_stop_along_is_the_stop_each_call_site_built(ego, path, deceleration, horizon, dt) -> None:
    got = _rows(stop_along(ego, path, float(deceleration), horizon=horizon, dt=dt))
    assert got.shape == _reference_stop(ego, path, float(deceleration), horizon, dt).shape
    assert np.allclose(got, _reference_stop(ego, path, float(deceleration), horizon, dt), rtol=0.0, atol=1e-9)


def test_comfortable_stop_runs_along_the_route_centreline_and_straight_ahead_off_the_map() -> None:
    graph = LaneGraph()
    graph.add(make_lane("A0", [[0, 0], [30, 0], [60, 15], [90, 45]], 3.5, 15.0, "A"))
    route = Route(0.0, ["A"])
    ego = EgoState(2.0, 25.0, 0.6, 0.0, 9.0)  # stops 13.5 m on, past the bend at x = 30
    ahead = ego.velocity ** 2 / COMFORTABLE_DECELERATION + 20.0  # what the route lookup asks for
    path = reference_paths(graph, route, ego, ahead=ahead)["K"].centerline
    on_route = _rows(comfortable_stop(ego, graph, route))
    assert np.allclose(on_route, _reference_stop(ego, path, COMFORTABLE_DECELERATION, 8.0, 0.1), atol=1e-9)
    assert on_route[-1, 2] > 2.0, "the stop follows the bend of the route, not the ego's heading"
    straight = _reference_stop(ego, None, COMFORTABLE_DECELERATION, 8.0, 0.1)
    for g, r in ((None, route), (graph, None), (LaneGraph(), route)):  # no map, no route, an empty map
        assert np.allclose(_rows(comfortable_stop(ego, g, r)), straight, atol=1e-9)
    off = EgoState(2.0, 10.0, 80.0, 0.4, 9.0)  # no lane within reach
    assert np.allclose(_rows(comfortable_stop(off, graph, route)),
                       _reference_stop(off, None, COMFORTABLE_DECELERATION, 8.0, 0.1), atol=1e-9)
