"""Building blocks of the synthetic suite: road layouts, lane-change paths, scripted traffic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from luna_core.lanes import Polyline, lane_map
from luna_bridge.scenarios.roads import LANE_WIDTH, SHOULDER, four_way_junction, multilane_road, reference_line
from luna_bridge.scenarios.synthetic import _trapezoid
from luna_bridge.scenarios.traffic import (T_START, Pedestrian, TrafficScript, Vehicle, lane_change_path,
                                           smoothstep)


def test_reference_line_has_continuous_curvature() -> None:
    line = reference_line([(50.0, 0.0), (60.0, 1 / 40), (50.0, 0.0)])
    h = np.unwrap(line.interpolate(np.arange(0.0, line.length, 1.0))[:, 2])
    kappa = np.diff(h)  # per metre
    assert abs(kappa.max() - 1 / 40) < 2e-3
    assert np.max(np.abs(np.diff(kappa))) < 1 / 40 / 10  # ramps, no step
    assert line.length == pytest.approx(161.0, abs=1.5)


def test_multilane_road_topology_and_right_hand_order() -> None:
    road = multilane_road(3, 300.0, 15.0, oncoming_lanes=1, pickup=(100.0, 150.0))
    lm = lane_map(road.graph)
    assert road.road_ids() == ["r0", "r1", "r2"]
    assert lm.road_lanes("r1") == ["r1_l0", "r1_l1", "r1_l2"]  # left to right
    assert road.graph.lanes["r0_l1"].successors == ["r1_l1"]
    assert lm.route_lanes("r0_l2", road.road_ids()) == ["r0_l2", "r1_l2", "r2_l2"]
    # the oncoming lane runs the other way, left of the leftmost lane
    onc = road.graph.lanes["r1_o0"]
    assert onc.centerline[0, 0] > onc.centerline[-1, 0] and onc.centerline[0, 1] > 0
    # the rightmost lane's polygon reaches the shoulder; the pickup strip is drivable
    y_kerb = -(3 * LANE_WIDTH) - SHOULDER + 0.1
    assert lm.in_drivable_area(np.array([[50.0, y_kerb], [120.0, -3.5 * LANE_WIDTH]])).all()
    assert not lm.in_drivable_area(np.array([[50.0, y_kerb - 0.3]]))[0]


def test_junction_movements_connect_in_right_hand_traffic() -> None:
    j = four_way_junction()
    assert j.movement("S", "left") == "W" and j.movement("S", "right") == "E" and j.movement("S", "straight") == "N"
    lm = lane_map(j.graph)
    for (src, dst), conns in j.connectors.items():
        for c in conns:
            lane = j.graph.lanes[c]
            assert lane.in_junction and lane.predecessors[0].startswith(f"{src}_in")
            assert lane.successors[0].startswith(f"{dst}_out")
            # connectors join their lanes without a gap or a kink
            inc = lm.centerlines[lane.predecessors[0]]
            out = lm.centerlines[lane.successors[0]]
            cl = lm.centerlines[c]
            assert np.hypot(*(cl.points[0] - inc.points[-1])) < 1e-6
            assert np.hypot(*(cl.points[-1] - out.points[0])) < 1e-6
            assert abs(math.remainder(cl.interpolate(0.0)[2] - inc.interpolate(inc.length)[2], 2 * math.pi)) < 0.05
    # northbound traffic on the south arm keeps right (x > 0)
    assert np.all(j.graph.lanes["S_in0"].centerline[:, 0] > 0)
    assert lm.route_lanes("S_in0", j.route("S", "W")) == ["S_in0", "J_SW0", "W_out0"]


def test_lane_change_path_blends_smoothly() -> None:
    a = Polyline([[0, 0], [200, 0]])
    b = Polyline([[0, 3.5], [200, 3.5]])
    p = lane_change_path(a, b, 50.0, 40.0)
    y = p.interpolate(np.array([0.0, 49.0, 70.0, 95.0, 150.0]))[:, 1]
    np.testing.assert_allclose(y, [0.0, 0.0, 1.75, 3.5, 3.5], atol=0.02)
    assert p.length == pytest.approx(200.0, abs=0.5)
    assert smoothstep(np.array([0.0, 0.5, 1.0])).tolist() == [0.0, 0.5, 1.0]


def test_trapezoid_profile_covers_the_distance() -> None:
    v, t_end = _trapezoid(1.0, 6.0)
    t = np.arange(0.0, t_end + 1.0, 0.001)
    dist = np.sum([v(x) for x in t]) * 0.001
    assert dist == pytest.approx(6.0, abs=0.01)
    assert v(0.5) == 0.0 and v(t_end + 0.1) == 0.0 and max(v(x) for x in t) <= 1.5


def _lane(y: float = 0.0) -> Polyline:
    return Polyline([[0, y], [400, y]])


def test_scripted_follower_keeps_a_gap_behind_a_braking_lead() -> None:
    path = _lane()
    lead = Vehicle("lead", path, 40.0, 10.0, speed_profile=lambda t: max(10.0 - 4.0 * max(t - 1.0, 0.0), 0.0))
    follower = Vehicle("f", path, 15.0, 10.0, target_velocity=10.0)
    out = TrafficScript([lead, follower]).run(10.0)
    gap = out["lead"][:, 0] - out["f"][:, 0] - (lead.length + follower.length) / 2
    assert gap.min() > 0.5
    assert out["f"][-1, 3] < 0.1  # stopped
    assert out["lead"].shape == (int(round((10.0 - T_START) / 0.1)) + 1, 5)


def test_yielding_to_a_crossing_pedestrian() -> None:
    path = _lane()
    car = Vehicle("car", path, 0.0, 8.0, target_velocity=8.0)
    ped = Pedestrian("ped", Polyline([[60.0, -6.0], [60.0, 6.0]]), start_time=0.0, speed=0.8)
    out = TrafficScript([car], [ped]).run(15.0)
    front = out["car"][:, 0] + car.length / 2
    ped_y = out["ped"][:, 1]
    on_road = np.abs(ped_y) < 2.5
    assert np.all(front[on_road] < 60.0 - 0.3)  # never reaches the crossing while the pedestrian is on it
    assert front[on_road].max() > 40.0  # it did wait near the crossing
    assert out["car"][-1, 0] > 65.0  # and drives on afterwards


def test_split_seed_ranges_are_disjoint_and_the_index_is_bounded():
    from luna_bridge.scenarios.synthetic import MAX_ATTEMPTS, MAX_INDEX, SCENARIO_TYPES, SPLITS, generate

    spans = sorted((base * 1000, base * 1000 + len(SCENARIO_TYPES) * 100 * MAX_ATTEMPTS)
                   for base in SPLITS.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no two splits share a seed
    assert (MAX_INDEX + 1) * MAX_ATTEMPTS <= 100 * MAX_ATTEMPTS  # an index never reaches the next type's seeds
    with pytest.raises(ValueError, match="index must be in 0..99"):
        generate("changing_lane", "train", MAX_INDEX + 1)
    reflect = generate("changing_lane", "reflect", 1)  # the reflection split mixes hard draws in, like train
    assert reflect.split == "reflect" and reflect.metadata["variant"] == "hard"
    assert 4_000_000 <= reflect.metadata["seed"] < 4_000_000 + 100 * MAX_ATTEMPTS * len(SCENARIO_TYPES)
