"""The shared PDM-style scorer on hand-built proposals (states written directly, not simulated).

Map: a straight road along +x, right lane centre y = 0 and left lane centre y = 4 (both 4 m wide,
driving +x), plus an oncoming lane centre y = -4 driving -x: drivable y in [-6, 6]. Ego: Pacifica.
"""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.control import STATE_SIZE, StateIndex, simulate_proposals
from luna_core.lanes import Polyline, lane_map, make_lane
from luna_core.planning.scorer import (ObjectBoxes, ScorerWeights, ScoringContext, in_common_or_connected_lanes,
                                       ego_corners, score_proposals)
from luna_core.types import LaneGraph, VehicleParameters

VP = VehicleParameters()
DT = 0.1


def graph() -> LaneGraph:
    g = LaneGraph()
    xs = np.linspace(-100.0, 300.0, 41)
    g.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 4.0, 10.0, road_id="r0", left_neighbor="left"))
    g.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 4.0)]), 4.0, 10.0, road_id="r0",
                    right_neighbor="right"))
    g.add(make_lane("oncoming", np.column_stack([xs[::-1], np.full_like(xs, -4.0)]), 4.0, 10.0, road_id="r1"))
    return g


G = graph()


def states(x: np.ndarray, y: np.ndarray | float = 0.0, heading: np.ndarray | float = 0.0,
           v: np.ndarray | float | None = None) -> np.ndarray:
    """(T+1, 8) rear-axle states; velocity defaults to the finite difference of x along heading."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    s = np.zeros((n, STATE_SIZE))
    s[:, StateIndex.X] = x
    s[:, StateIndex.Y] = np.broadcast_to(y, (n,))
    s[:, StateIndex.HEADING] = np.broadcast_to(heading, (n,))
    vel = np.gradient(x, DT) if v is None else np.broadcast_to(v, (n,))
    s[:, StateIndex.VELOCITY] = vel
    return s


def constant(speed: float, steps: int = 40, x0: float = 0.0) -> np.ndarray:
    return x0 + speed * np.arange(steps + 1) * DT


def objects(*boxes: tuple[float, float, float, float, float, float], steps: int = 41, static: bool = False,
            red: bool = False) -> ObjectBoxes:
    """Boxes (x, y, heading, speed, length, width) moving at constant velocity along their heading."""
    t = np.arange(steps) * DT
    pose = np.array([[[x + v * np.cos(h) * tk, y + v * np.sin(h) * tk, h] for tk in t] for x, y, h, v, _, _ in boxes])
    size = np.array([[b[4], b[5]] for b in boxes])
    n = len(boxes)
    return ObjectBoxes([f"o{i}" for i in range(n)], pose, size, np.array([b[3] for b in boxes]),
                       np.full(n, static), np.full(n, red))


def context(objs: ObjectBoxes | None = None, steps: int = 41, speed_limit: float = 0.0) -> ScoringContext:
    xs = np.linspace(-100.0, 300.0, 401)
    return ScoringContext(lane_map(G), Polyline(np.column_stack([xs, np.zeros_like(xs)])),
                          objs if objs is not None else ObjectBoxes.empty(steps), speed_limit, VP, DT)


def test_clean_proposals_score_by_normalised_progress() -> None:
    p = np.stack([states(constant(5.0)), states(constant(10.0))])
    s = score_proposals(p, context())
    assert s.raw_progress == pytest.approx([20.0, 40.0])
    assert s.progress == pytest.approx([0.5, 1.0])
    assert s.multiplicative.tolist() == [1.0, 1.0]
    # total = (5 x progress + 5 x ttc + 2 x comfort) / 12
    assert s.total == pytest.approx([(2.5 + 5 + 2) / 12, 1.0])
    assert s.best == 1


def test_progress_all_one_when_nobody_moves() -> None:
    p = np.stack([states(np.zeros(41), v=0.0), states(constant(0.002))])
    assert score_proposals(p, context()).progress.tolist() == [1.0, 1.0]


def test_progress_normalised_by_best_valid_proposal_only() -> None:
    off_road = states(constant(10.0), y=-8.0)  # progresses 40 m but off the drivable area
    p = np.stack([states(constant(5.0)), off_road])
    s = score_proposals(p, context())
    assert s.drivable_area.tolist() == [1.0, 0.0]
    assert s.progress[0] == 1.0 and s.total[1] == 0.0


def test_stopped_vehicle_ahead_is_an_at_fault_collision_scoring_zero() -> None:
    # Car rear at x = 20; ego front = 10 t + 4.049 reaches it at t = 1.6 s.
    s = score_proposals(states(constant(10.0))[None], context(objects((22.0, 0.0, 0.0, 0.0, 4.0, 2.0))))
    assert s.no_at_fault_collision.tolist() == [0.0]
    assert s.time_to_at_fault_collision[0] == pytest.approx(1.6)
    assert s.total.tolist() == [0.0]


def test_static_object_costs_half_and_red_light_costs_all() -> None:
    cone = (22.0, 0.0, 0.0, 0.0, 0.5, 0.5)
    half = score_proposals(states(constant(10.0))[None], context(objects(cone, static=True)))
    assert half.no_at_fault_collision.tolist() == [0.5]
    red = score_proposals(states(constant(10.0))[None], context(objects(cone, static=True, red=True)))
    assert red.no_at_fault_collision.tolist() == [0.0]


def test_rear_end_by_a_faster_vehicle_is_not_the_egos_fault() -> None:
    chaser = (-10.0, 0.0, 0.0, 15.0, 4.0, 2.0)  # centre 10 m behind the rear axle, 15 m/s vs 5 m/s
    s = score_proposals(states(constant(5.0))[None], context(objects(chaser)))
    assert s.no_at_fault_collision.tolist() == [1.0]


def test_lateral_collision_is_at_fault_only_while_straddling_lanes() -> None:
    # A car in the left lane alongside the ego drifting right at 1 m/s (heading 0, speed along x = ego's).
    d = VP.rear_axle_to_center
    t = np.arange(41) * DT
    pose = np.stack([10.0 * t + d, 4.5 - 1.0 * t, np.zeros_like(t)], -1)[None]
    drift = ObjectBoxes(["side"], pose, np.array([[4.0, 2.0]]), np.array([10.0]), np.array([False]),
                        np.array([False]))
    in_lane = states(constant(10.0), y=0.0)
    straddling = states(constant(10.0), y=1.0)
    s = score_proposals(np.stack([in_lane, straddling]), context(drift))
    assert s.no_at_fault_collision.tolist() == [1.0, 0.0]


def test_lane_occupancy_of_footprints() -> None:
    p = np.stack([states(constant(1.0, 2), y=y) for y in (0.0, 1.0, 2.0, -1.0)])
    occ = in_common_or_connected_lanes(lane_map(G), ego_corners(p, VP))
    # y = 1: left corners at 2.15 (left lane); y = -1: right corners at -2.15 (oncoming lane).
    assert occ[:, 0].tolist() == [True, False, False, False]


def test_driving_against_traffic_thresholds() -> None:
    # In the oncoming lane (y = -4) heading +x: oncoming progress over 1 s = 10 steps x 0.1 v
    # (the window sums 11 samples, the first of the run is 0): v = 1.5 -> 1.5 m, 3 -> 3 m, 7 -> 7 m.
    p = np.stack([states(constant(v), y=-4.0) for v in (1.5, 3.0, 7.0)] + [states(constant(7.0))])
    s = score_proposals(p, context())
    assert s.driving_direction.tolist() == [1.0, 0.5, 0.0, 1.0]


def test_ttc_catches_a_braking_proposal_that_stops_just_short() -> None:
    # v0 10 m/s, -2.5 m/s^2: stops after 20 m at 4 s. A stopped car's rear is 20.5 m ahead of the
    # front bumper: no collision, but the box projected by 0.9 s at the current speed reaches
    # max_t (7.75 t - 1.25 t^2 + 9) = 21.01 m > 20.5 m (at t = 3.1 s).
    t = np.arange(41) * DT
    x = 10.0 * t - 1.25 * t ** 2
    v = 10.0 - 2.5 * t
    front = VP.front_length
    car = (front + 20.5 + 2.0, 0.0, 0.0, 0.0, 4.0, 2.0)
    s = score_proposals(states(x, v=v)[None], context(objects(car)))
    assert s.no_at_fault_collision.tolist() == [1.0]
    assert s.ttc.tolist() == [0.0]
    assert s.total[0] == pytest.approx((5 * 1 + 0 + 2 * s.comfort[0]) / 12)
    far = (front + 22.5 + 2.0, 0.0, 0.0, 0.0, 4.0, 2.0)
    assert score_proposals(states(x, v=v)[None], context(objects(far))).ttc.tolist() == [1.0]


def test_comfort_fails_on_hard_braking() -> None:
    t = np.arange(41) * DT
    v = np.maximum(10.0 - 6.0 * t, 0.0)
    x = np.concatenate([[0.0], np.cumsum(v[:-1] * DT)])
    s = score_proposals(np.stack([states(x, v=v), states(constant(10.0))]), context())
    assert s.comfort.tolist() == [0.0, 1.0]


def test_speed_limit_term_is_optional_and_nuplan_shaped() -> None:
    p = states(constant(12.0), v=12.0)[None]
    off = score_proposals(p, context(speed_limit=10.0))
    assert off.total[0] == pytest.approx(1.0)  # weight 0 by default (PDM-Closed)
    on = score_proposals(p, context(speed_limit=10.0), ScorerWeights(speed_limit=4.0))
    assert on.speed_limit[0] == pytest.approx(1.0 - 2.0 / 2.23)
    assert on.total[0] == pytest.approx((12 + 4 * (1.0 - 2.0 / 2.23)) / 16)


def test_bad_input_is_rejected_with_the_reason() -> None:
    p = states(constant(10.0))[None].copy()
    p[0, 7, StateIndex.Y] = np.nan
    with pytest.raises(ValueError, match="proposal 0, step 7"):
        score_proposals(p, context())
    with pytest.raises(ValueError, match="forecast has 11 steps"):
        score_proposals(states(constant(10.0))[None], context(ObjectBoxes.empty(11)))


def test_best_falls_back_to_the_least_bad_proposal_when_all_totals_are_zero() -> None:
    # Both proposals leave the road; the faster one without a collision is preferred over index 0.
    slow_off = states(constant(2.0), y=-8.0)
    fast_off = states(constant(10.0), y=-8.0)
    s = score_proposals(np.stack([slow_off, fast_off]), context())
    assert s.total.tolist() == [0.0, 0.0]
    assert s.best == 1


def test_ttc_counts_a_car_converging_from_the_side_only_in_a_junction() -> None:
    """PDM-Closed's and nuPlan's TTC rule: an object counts if it is ahead (within 30 deg of the
    heading) or, while the ego straddles lanes / leaves them / is in a junction, if it is not behind.
    A car alongside (bearing > 30 deg) drifting into the ego's lane touches its side: not at fault and,
    with the ego in its own lane, no TTC violation; the same run in a junction lane violates TTC."""
    # Centre 3 m ahead of the rear axle in the left lane (bearing 53 deg), moving 2 m/s mostly sideways:
    # its future boxes stay more than 30 deg off the heading (the rule compares the ego now with the
    # object at the projected time).
    car = (3.0, 4.0, -1.2, 2.0, 3.6, 2.0)
    p = states(constant(5.0))[None]
    s = score_proposals(p, context(objects(car)))
    assert s.no_at_fault_collision.tolist() == [1.0]
    assert s.ttc.tolist() == [1.0]
    junction = graph()
    for lane in junction.lanes.values():
        lane.in_junction = True
    xs = np.linspace(-100.0, 300.0, 401)
    ctx = ScoringContext(lane_map(junction), Polyline(np.column_stack([xs, np.zeros_like(xs)])), objects(car), 0.0,
                         VP, DT)
    assert score_proposals(p, ctx).ttc.tolist() == [0.0]


def test_a_proposal_that_drives_backwards_is_infeasible_and_waiting_is_not() -> None:
    # From standstill: one proposal waits, one creeps back within nuPlan's stopped-speed threshold, one
    # rolls back at 1 m/s (a Diffusion-ES member whose waypoints fall back along the heading).
    wait = states(np.zeros(41), v=0.0)
    creep = states(-0.04 * np.arange(41) * DT, v=np.r_[0.0, np.full(40, -0.04)])
    reverse = states(-1.0 * np.arange(41) * DT, v=np.r_[0.0, np.full(40, -1.0)])
    s = score_proposals(np.stack([wait, creep, reverse]), context())
    assert s.no_reversing.tolist() == [1.0, 1.0, 0.0]
    assert s.total[2] == 0.0 and s.total[0] > 0.0
    # When nothing is feasible, the least-bad ranking still puts a forward proposal first, however much
    # better the reversing one scores otherwise.
    key = s.least_bad_key(np.array([0.0, 0.0, 1.0]))
    assert key[0] > key[2] > 0.0 and key[1] > key[2]
    # An ego already rolling back at 0.5 m/s may brake out of it, not roll back faster.
    brake = states(-0.5 * np.arange(41) * DT, v=np.linspace(-0.5, 0.0, 41))
    faster = states(-0.5 * np.arange(41) * DT, v=np.linspace(-0.5, -1.0, 41))
    assert score_proposals(np.stack([brake, faster]), context()).no_reversing.tolist() == [1.0, 0.0]
    # Rolling back at 0.04 m/s (within the tolerance), a plan may not take it to 0.08 m/s: the tolerance is
    # not granted again on top of a roll-back, or the ego creeps back a little faster every cycle.
    hold = states(-0.04 * np.arange(41) * DT, v=np.full(41, -0.04))
    creep_on = states(-0.06 * np.arange(41) * DT, v=np.linspace(-0.04, -0.08, 41))
    assert score_proposals(np.stack([hold, creep_on]), context()).no_reversing.tolist() == [1.0, 0.0]


def test_the_roll_back_of_a_hard_stop_is_the_ego_s_own_not_the_plan_s() -> None:
    # An ego at 0.4 m/s braking at 3 m/s^2: the actuator lag carries it past zero even under a plan that
    # stops (the tracker following its poses reaches -0.2 m/s). That plan stays feasible; a member whose
    # waypoints run back at 1 m/s does not.
    ego = np.zeros(STATE_SIZE)
    ego[StateIndex.VELOCITY], ego[StateIndex.ACCELERATION] = 0.4, -3.0
    t = np.arange(41) * DT
    stop = np.zeros((41, 3))
    stop[:, 0] = np.maximum.accumulate(np.minimum(0.4 * t - 1.5 * t ** 2, 0.4 ** 2 / 6.0))
    back = np.zeros((41, 3))
    back[:, 0] = -1.0 * t
    tracked = simulate_proposals(ego, np.stack([stop, back]))
    assert tracked[0, :, StateIndex.VELOCITY].min() < -0.1  # rolls back more than the tolerance
    assert score_proposals(tracked, context()).no_reversing.tolist() == [1.0, 0.0]
