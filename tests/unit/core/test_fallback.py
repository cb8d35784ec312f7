"""The comfortable stop (luna_core.planning.fallback): it brakes along the lane and never pulls the ego sideways."""

import numpy as np

from luna_core.lanes import Polyline
from luna_core.planning.fallback import COMFORTABLE_DECELERATION, LATERAL_BLEND_DISTANCE, stop_along
from luna_core.types import EgoState

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
