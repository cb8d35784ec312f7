"""nuPlan closed-loop metrics on hand-built logs: every expected value is computed by hand here.

The map: one straight road "r0" along +x with two 4 m lanes (right lane centre y = 0, left lane
centre y = 4), so the drivable area is y in [-2, 6]; speed limit 10 m/s. Ego geometry: nuPlan's
Pacifica (front 4.049 m, rear 1.127 m from the rear axle, width 2.297 m).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from luna_core.lanes import make_lane
from luna_core.types import (EgoState, LaneGraph, ObjectClass, Route, TrackedObject, TrackedObjects,
                             TrafficLights, VehicleParameters)

from luna_bridge.metrics import aggregate, closed_loop_score, score_log
from luna_bridge.metrics.collisions import CollisionType, find_collisions, no_ego_at_fault_collisions
from luna_bridge.metrics.comfort import ego_is_comfortable
from luna_bridge.metrics.frames import extract_frames, in_common_or_connected_lanes
from luna_bridge.metrics.map_compliance import (drivable_area_compliance, driving_direction_compliance,
                                                speed_limit_compliance)
from luna_bridge.metrics.progress import ego_is_making_progress, ego_progress_along_expert_route
from luna_bridge.metrics.ttc import time_to_collision
from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario, SimulationLog

VP = VehicleParameters()
N = 151  # 15 s at 0.1 s


def road() -> LaneGraph:
    g = LaneGraph()
    xs = np.linspace(-50.0, 400.0, 46)
    g.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 4.0, 10.0, road_id="r0",
                    left_neighbor="left"))
    g.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 4.0)]), 4.0, 10.0, road_id="r0",
                    right_neighbor="right"))
    return g


def expert(speed: float = 10.0, n: int = N) -> AgentTrack:
    t = np.arange(n) * SIM_DT
    return AgentTrack("ego", ObjectClass.VEHICLE, VP.length, VP.width, t, speed * t, np.zeros(n),
                      np.zeros(n), np.full(n, speed), np.zeros(n))


def make_log(x: np.ndarray, y: np.ndarray | float = 0.0, heading: np.ndarray | float = 0.0,
             v: np.ndarray | float | None = None, objects: list[list[TrackedObject]] | None = None,
             expert_speed: float = 10.0) -> SimulationLog:
    x = np.asarray(x, dtype=float)
    n = len(x)
    y = np.broadcast_to(np.asarray(y, dtype=float), (n,))
    h = np.broadcast_to(np.asarray(heading, dtype=float), (n,))
    if v is None:
        v = np.gradient(x, SIM_DT) if n > 1 else np.zeros(1)
    v = np.broadcast_to(np.asarray(v, dtype=float), (n,))
    t = np.arange(n) * SIM_DT
    ego = [EgoState(float(t[k]), float(x[k]), float(y[k]), float(h[k]), float(v[k])) for k in range(n)]
    objs = objects if objects is not None else [[] for _ in range(n)]
    g = road()
    scenario = Scenario("hand", "following_lane_with_lead", g, Route(0.0, ["r0"]), ego[0],
                        expert(expert_speed, n), duration=float(t[-1]))
    return SimulationLog(scenario, "test", False, t, ego, [TrackedObjects(float(t[k]), objs[k]) for k in range(n)],
                         [TrafficLights(float(t[k])) for k in range(n)])


def car(i: str, x: float, y: float = 0.0, vx: float = 0.0, heading: float = 0.0, length: float = 4.0,
        width: float = 2.0, cls: ObjectClass = ObjectClass.VEHICLE) -> TrackedObject:
    return TrackedObject(i, cls, x, y, heading, vx, 0.0, length, width)


def cruise(speed: float = 10.0, n: int = N) -> np.ndarray:
    return speed * np.arange(n) * SIM_DT


# ---- a clean run ---------------------------------------------------------------------------------


def test_following_the_expert_scores_one_on_every_metric() -> None:
    result = score_log(make_log(cruise()))
    assert result.error == ""
    assert {k: m.score for k, m in result.metrics.items()} == {k: 1.0 for k in result.metrics}
    assert result.score == 1.0
    assert len(result.metrics["time_to_collision_within_bound"].time_series) == N


# ---- no_ego_at_fault_collisions ------------------------------------------------------------------


def test_stopped_vehicle_ahead_is_an_at_fault_stopped_track_collision_at_the_hand_computed_step() -> None:
    # Track rear at x = 48; ego front = 10 t + 4.049 reaches it first at t = 4.4 s (step 44).
    objs = [[car("parked", 50.0)] for _ in range(N)]
    frames = extract_frames(make_log(cruise(), objects=objs))
    collisions = find_collisions(frames)
    assert [(c.step, c.kind, c.at_fault) for c in collisions] == [(44, CollisionType.STOPPED_TRACK, True)]
    m = no_ego_at_fault_collisions(frames, collisions)
    assert m.score == 0.0
    assert m.time_series[44] == 1 and sum(m.time_series) == 1  # counted once though it overlaps for long


def test_slower_moving_lead_is_an_at_fault_front_collision() -> None:
    objs = [[car("lead", 30.0 + 2.0 * k * SIM_DT, vx=2.0)] for k in range(N)]
    collisions = find_collisions(extract_frames(make_log(cruise(), objects=objs)))
    assert len(collisions) == 1 and collisions[0].kind is CollisionType.ACTIVE_FRONT and collisions[0].at_fault


def test_vehicle_hitting_the_ego_from_behind_is_not_at_fault() -> None:
    # Ego at 5 m/s; a car at 12 m/s starts 20 m behind the rear axle in the same lane.
    objs = [[car("chaser", -20.0 + 12.0 * k * SIM_DT, vx=12.0)] for k in range(N)]
    frames = extract_frames(make_log(cruise(5.0), objects=objs))
    collisions = find_collisions(frames)
    assert [(c.kind, c.at_fault) for c in collisions] == [(CollisionType.ACTIVE_REAR, False)]
    assert no_ego_at_fault_collisions(frames, collisions).score == 1.0


def test_collision_while_the_ego_is_stopped_is_not_at_fault() -> None:
    objs = [[car("chaser", -20.0 + 12.0 * k * SIM_DT, vx=12.0)] for k in range(N)]
    collisions = find_collisions(extract_frames(make_log(np.zeros(N), v=0.0, objects=objs)))
    assert [(c.kind, c.at_fault) for c in collisions] == [(CollisionType.STOPPED_EGO, False)]


def _side_swipe(ego_y: float) -> list[CollisionType | bool]:
    # Ego at 10 m/s; a car alongside (same x as the ego centre) in the left lane drifts right at 1 m/s.
    d = VP.rear_axle_to_center
    objs = [[TrackedObject("side", ObjectClass.VEHICLE, 10.0 * k * SIM_DT + d, 4.5 - 1.0 * k * SIM_DT,
                           0.0, 10.0, -1.0, 4.0, 2.0)] for k in range(N)]
    c = find_collisions(extract_frames(make_log(cruise(), y=ego_y, objects=objs)))
    assert len(c) == 1
    return [c[0].kind, c[0].at_fault]


def test_lateral_collision_is_at_fault_only_when_the_ego_straddles_lanes() -> None:
    assert _side_swipe(0.0) == [CollisionType.ACTIVE_LATERAL, False]  # ego inside its lane
    assert _side_swipe(1.0) == [CollisionType.ACTIVE_LATERAL, True]  # left corners in the left lane


def test_lane_occupancy_follows_the_footprint_corners() -> None:
    frames = extract_frames(make_log(cruise(n=3), y=np.array([0.0, 1.0, 2.0])))
    # y = 0: all corners in "right"; y = 1: left corners at y = 2.15, in the other lane; y = 2: straddling.
    assert in_common_or_connected_lanes(frames).tolist() == [True, False, False]


def test_one_static_object_collision_scores_half_and_two_score_zero() -> None:
    cone = dict(length=0.5, width=0.5, cls=ObjectClass.STATIC)
    one = [[car("cone1", 60.0, **cone)] for _ in range(N)]
    two = [[car("cone1", 60.0, **cone), car("cone2", 90.0, **cone)] for _ in range(N)]
    for objs, expected in ((one, 0.5), (two, 0.0)):
        frames = extract_frames(make_log(cruise(), objects=objs))
        assert no_ego_at_fault_collisions(frames, find_collisions(frames)).score == expected


def test_pedestrian_collision_scores_zero() -> None:
    ped = [[car("ped", 60.0, length=0.5, width=0.5, cls=ObjectClass.PEDESTRIAN)] for _ in range(N)]
    frames = extract_frames(make_log(cruise(), objects=ped))
    m = no_ego_at_fault_collisions(frames, find_collisions(frames))
    assert m.score == 0.0 and m.statistics["at_fault_collisions_with_vru"] == 1


# ---- drivable_area_compliance ----------------------------------------------------------------------


@pytest.mark.parametrize("outside, expected", [(0.0, 1.0), (0.2, 1.0), (0.5, 0.0)])
def test_drivable_area_tolerates_corners_up_to_0_3_m_outside(outside: float, expected: float) -> None:
    y = -2.0 - outside + VP.width / 2  # right corners `outside` metres beyond the road edge y = -2
    m = drivable_area_compliance(extract_frames(make_log(cruise(n=20), y=y)))
    assert m.score == expected
    assert m.statistics["max_distance_outside"] == pytest.approx(outside, abs=1e-6)


# ---- driving_direction_compliance ------------------------------------------------------------------


@pytest.mark.parametrize("speed, expected", [(-1.5, 1.0), (-3.0, 0.5), (-7.0, 0.0), (10.0, 1.0)])
def test_driving_direction_thresholds_on_reversing(speed: float, expected: float) -> None:
    # nuPlan's 1 s window sums the samples ind-10 .. ind, i.e. 11 steps of 0.1 |v| once the run is
    # longer than that: 1.1 |v| metres of oncoming progress: 1.65 < 2, 2 <= 3.3 < 6, 7.7 >= 6.
    x = 100.0 + cruise(speed, 40)
    m = driving_direction_compliance(extract_frames(make_log(x, v=speed)), SIM_DT)
    assert m.score == expected
    assert m.statistics["min_progress_in_horizon"] == pytest.approx(min(0.0, 1.1 * speed), abs=1e-6)


# ---- speed_limit_compliance ------------------------------------------------------------------------


def test_speed_limit_compliance_matches_the_hand_computed_loss() -> None:
    m = speed_limit_compliance(extract_frames(make_log(cruise(12.0), v=12.0)), SIM_DT)
    # 151 steps x 2 m/s over x 0.1 s = 30.2 m/s.s; loss = 30.2 / (2.23 x 15) = 0.902840...
    assert m.score == pytest.approx(1.0 - 30.2 / (2.23 * 15.0), abs=1e-9)
    assert m.statistics["max_overspeed"] == pytest.approx(2.0)
    below = speed_limit_compliance(extract_frames(make_log(cruise(9.9), v=9.9)), SIM_DT)
    assert below.score == 1.0


def test_speed_limit_unknown_lane_never_violates() -> None:
    log = make_log(cruise(30.0, 20), v=30.0)
    for lane in log.scenario.lane_graph.lanes.values():
        lane.speed_limit = 0.0
    assert speed_limit_compliance(extract_frames(log), SIM_DT).score == 1.0


# ---- progress ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ego_speed, ratio", [(10.0, 1.0), (5.0, 0.5), (0.0, 2.0 / 150.0)])
def test_progress_ratio_is_ego_over_expert_progress(ego_speed: float, ratio: float) -> None:
    log = make_log(cruise(ego_speed), v=ego_speed)
    m = ego_progress_along_expert_route(log, extract_frames(log))
    assert m.statistics["expert_progress"] == pytest.approx(150.0)
    assert m.score == pytest.approx(ratio)
    assert ego_is_making_progress(m).score == (1.0 if ratio >= 0.2 else 0.0)


def test_progress_zero_when_driving_backwards_and_one_when_the_expert_stands_still() -> None:
    back = make_log(-0.3 * np.arange(N) * SIM_DT + 100.0, v=-0.3)  # 4.5 m backwards
    assert ego_progress_along_expert_route(back, extract_frames(back)).score == 0.0
    still = make_log(np.zeros(N), v=0.0, expert_speed=0.0)
    assert ego_progress_along_expert_route(still, extract_frames(still)).score == 1.0


# ---- time_to_collision_within_bound ---------------------------------------------------------------


def test_ttc_is_the_first_projected_contact_step() -> None:
    # Stopped car ahead, gap between the ego front and its rear = 8.05 m at 10 m/s: the projected ego
    # first touches it at 0.9 s (9 m), not at 0.8 s (8 m).
    rear = 4.049 + 8.05
    objs = [[car("lead", rear + 2.0)], [car("lead", rear + 2.0)]]
    frames = extract_frames(make_log(np.array([0.0, 0.0]), v=10.0, objects=objs))
    ttc = time_to_collision(frames, [])
    assert ttc[0] == pytest.approx(0.9)


def test_ttc_ignores_stopped_ego_and_tracks_behind() -> None:
    ahead = [[car("lead", 10.0)]] * 2
    stopped = extract_frames(make_log(np.zeros(2), v=0.0, objects=ahead))
    assert np.isinf(time_to_collision(stopped, [])).all()
    behind = [[car("chaser", -10.0, vx=20.0)]] * 2
    moving = extract_frames(make_log(np.zeros(2), v=1.0, objects=behind))
    assert np.isinf(time_to_collision(moving, [])).all()


def test_ttc_metric_fails_below_0_95_s_and_is_zero_at_an_at_fault_collision() -> None:
    objs = [[car("parked", 50.0)] for _ in range(N)]
    result = score_log(make_log(cruise(), objects=objs))
    ttc = result.metrics["time_to_collision_within_bound"]
    assert ttc.score == 0.0 and ttc.statistics["min_time_to_collision"] == 0.0
    assert ttc.time_series[44] == 0.0
    # Step 34: gap 48 - (3.4 x 10 + 4.049) = 9.951 m -> contact at 1.0 s.
    assert ttc.time_series[34] == pytest.approx(1.0)


# ---- ego_is_comfortable ----------------------------------------------------------------------------


def test_comfort_fails_on_hard_braking_and_fast_yaw() -> None:
    smooth = make_log(cruise(), v=10.0)
    assert ego_is_comfortable(extract_frames(smooth), np.full(N, 10.0), SIM_DT).score == 1.0
    t = np.arange(N) * SIM_DT
    v = np.maximum(10.0 - 6.0 * t, 0.0)  # -6 m/s^2 < -4.05
    braking = make_log(np.cumsum(v) * SIM_DT, v=v)
    m = ego_is_comfortable(extract_frames(braking), v, SIM_DT)
    assert m.score == 0.0 and m.statistics["lon_acceleration_within_bound"] is False
    assert m.statistics["max_abs_lon_acceleration"] == pytest.approx(6.0, abs=0.05)
    yaw = make_log(np.zeros(N), heading=1.2 * t, v=0.0)  # 1.2 rad/s > 0.95
    my = ego_is_comfortable(extract_frames(yaw), np.zeros(N), SIM_DT)
    assert my.score == 0.0 and my.statistics["yaw_rate_within_bound"] is False


# ---- the score ---------------------------------------------------------------------------------


def test_cls_combines_multipliers_and_weighted_terms() -> None:
    result = score_log(make_log(cruise(12.0), v=12.0, expert_speed=12.0))
    speed = 1.0 - 30.2 / (2.23 * 15.0)
    assert result.metrics["speed_limit_compliance"].score == pytest.approx(speed)
    assert result.score == pytest.approx((5 + 5 + 4 * speed + 2) / 16)
    collided = score_log(make_log(cruise(), objects=[[car("cone", 60.0, length=0.5, width=0.5,
                                                               cls=ObjectClass.STATIC)]] * N))
    # 0.5 (one object) x (progress 1 x 5 + TTC 0 x 5 + speed 1 x 4 + comfort 1 x 2) / 16
    assert collided.score == pytest.approx(0.5 * 11 / 16)
    assert closed_loop_score({**result.metrics, "drivable_area_compliance": collided.metrics[
        "no_ego_at_fault_collisions"]}) == pytest.approx(0.5 * result.score)


def test_crashed_or_unscorable_runs_score_zero_with_the_reason() -> None:
    log = make_log(cruise(n=5))
    log.error = "planner raised ZeroDivisionError"
    assert score_log(log).score == 0.0 and "ZeroDivisionError" in score_log(log).error
    bad = make_log(cruise(n=5))
    bad.ego[3].x = math.nan
    r = score_log(bad)
    assert r.score == 0.0 and "step 3" in r.error


def test_aggregate_gives_mean_score_and_success_rate() -> None:
    good = score_log(make_log(cruise(n=30), expert_speed=10.0))
    crashed = make_log(cruise(n=5))
    crashed.error = "boom"
    half = score_log(make_log(cruise(n=30), objects=[[car("cone", 30.0, length=0.5, width=0.5,
                                                                 cls=ObjectClass.STATIC)]] * 30))
    agg = aggregate([good.score, score_log(crashed).score, half.score])
    assert agg.count == 3
    assert agg.cls == pytest.approx(100.0 * (good.score + half.score) / 3)
    assert agg.success_rate == pytest.approx(200.0 / 3)
