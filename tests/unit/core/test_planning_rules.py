"""Issue 12's planning rules against hand-computed values: the decision's speed interval is latched at
its stamp and capped at the speed limit, warm starts never exceed the limit, progress is normalised by
the best feasible progress of the proposals (PDM-Closed), a* does not flip on near-ties under one decision,
a likely lane change whose best trajectory breaks the TTC bound loses to a safe candidate (safety first),
and the published tail stops behind a car the scored horizon never reached."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from luna_core.assets import default_path
from luna_core.decision import InvalidDecision, latch, speed_at
from luna_core.lanes import lane_map, make_lane
from luna_core.planning.decision_guided import (MODE_DECISION, DecisionGuidedConfig, DecisionGuidedPlanner,
                                                PlannerObjective)
from luna_core.planning.diffusion import TrajectoryDiffusionPrior
from luna_core.planning.diffusion_es import DiffusionESConfig
from luna_core.planning.objectives import ObjectiveConfig, select, speed_interval
from luna_core.planning.reference_paths import reference_paths
from luna_core.planning.scorer import CLS_WEIGHTS, ObjectBoxes, ProposalScores, ScoringContext
from luna_core.types import (ACTION_INDEX, DecisionDistribution, EgoState, LaneGraph, ObjectClass, PlannerInput,
                             Route, TrackedObject, TrackedObjects, TrafficLights, VehicleParameters)

SEARCH = DiffusionESConfig(population=32, warm_starts=16, iterations=1, renoise_steps=(3,))
CFG = ObjectiveConfig()


@pytest.fixture(scope="module")
def prior() -> TrajectoryDiffusionPrior:
    torch.set_num_threads(1)
    return TrajectoryDiffusionPrior.from_pretrained(default_path("diffusion_prior"))


def road(limit: float = 15.0) -> LaneGraph:
    g = LaneGraph()
    g.add(make_lane("A0", [[0, 3.5], [600, 3.5]], 3.5, limit, "A", right_neighbor="A1"))
    g.add(make_lane("A1", [[0, 0], [600, 0]], 3.5, limit, "A", left_neighbor="A0"))
    return g


def accelerating_history(v_then: float, v_now: float, then: float = 9.0, now: float = 10.0) -> list[EgoState]:
    """Ego states every 0.1 s from now - 2 s, speed rising linearly from v_then at ``then`` to v_now."""
    out, x = [], 50.0
    times = np.round(np.arange(now - 2.0, now + 1e-9, 0.1), 10)
    rate = (v_now - v_then) / (now - then)
    for t in times:
        out.append(EgoState(float(t), x, 0.0, 0.0, max(v_then + rate * (t - then), 0.0), rate))
        x += out[-1].velocity * 0.1
    return out


def decision(probs: dict[str, float], stamp: float, candidates: list[str] | None = None) -> DecisionDistribution:
    p = np.zeros(10)
    for code, v in probs.items():
        p[ACTION_INDEX[code]] = v
    return DecisionDistribution(stamp, p, list(probs) if candidates is None else candidates)


# ---- the speed interval ------------------------------------------------------------------------


def test_speed_interval_is_capped_at_the_limit_hand_computed() -> None:
    # v_t = 12 m/s, limit 13 m/s: A [15, inf) -> [13, 13]; C [9, 15) -> [9, 13]; D [0, 9) unchanged.
    for action, lo, hi in (("AK", 13.0, 13.0), ("CK", 9.0, 13.0), ("DK", 0.0, 9.0)):
        low, high = speed_interval(action, 12.0, CFG, speed_limit=13.0)
        np.testing.assert_allclose(low, lo)
        np.testing.assert_allclose(high, hi)
    # Unknown limit (0): Eq. 5 as written.
    assert math.isinf(speed_interval("AK", 12.0, CFG, speed_limit=0.0)[1][0])


def test_stop_ramp_continues_from_the_decision_stamp() -> None:
    # Decided at 6 m/s 1 s ago: the ramp 6 - 2 (1 + tau) is at 3.8 m/s for the first step of this plan.
    low, high = speed_interval("SK", 6.0, CFG, elapsed=1.0)
    assert high[0] == pytest.approx(6.0 - 2.0 * 1.1) and high[19] == pytest.approx(0.0, abs=1e-12)


def test_reference_speed_is_the_speed_at_the_decision_stamp() -> None:
    hist = accelerating_history(8.0, 12.0)  # 8 m/s at t = 9.0, 12 m/s at t = 10.0
    d = latch(decision({"CK": 1.0}, stamp=9.0), hist)
    assert d.reference_speed == pytest.approx(8.0) and d.reference_note == ""
    assert d.candidate_set == ("CK",) and d.age(10.0) == pytest.approx(1.0)
    v, note = speed_at(hist[::5], 9.25)  # between two states 0.5 s apart: interpolated
    assert v == pytest.approx(9.0) and "interpolated" in note
    v, note = speed_at(hist, 5.0)  # before the history: the nearest state, said so
    assert v == pytest.approx(hist[0].velocity) and "no ego state" in note
    with pytest.raises(InvalidDecision, match="sums to"):
        latch(decision({"CK": 0.5}, stamp=9.0), hist)
    with pytest.raises(InvalidDecision, match="unknown action code"):
        latch(decision({"CK": 1.0}, stamp=9.0, candidates=["ZZ"]), hist)


def test_planner_holds_the_interval_of_the_decision_stamp(prior) -> None:
    # CK decided at 8 m/s: V^C = [6, 10) for the decision's life, though the ego now drives 12 m/s
    # (recomputed it would be [9, 15), and a faster plan would follow the decision better).
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0), prior=prior)
    hist = accelerating_history(8.0, 12.0)
    pin = PlannerInput(10.0, hist, TrackedObjects(10.0, []), TrafficLights(10.0), road(), Route(0.0, ["A"]),
                       decision({"CK": 1.0}, stamp=9.0))
    res = pl.plan_detailed(pin)
    assert res.mode == MODE_DECISION and res.action == "CK" and res.decision_stamp == 9.0
    v = res.trajectory.velocity[1:41]
    assert float(np.mean(v)) < 11.0  # pulled down towards the latched [6, 10), not held at 12
    # The same decision one cycle later keeps the latched speed (nothing re-derived from the new state).
    later = PlannerInput(10.5, accelerating_history(8.0, 12.5, now=10.5), TrackedObjects(10.5, []),
                         TrafficLights(10.5), pin.lane_graph, pin.route, pin.decision)
    pl.plan_detailed(later)
    assert pl.decisions.current.reference_speed == pytest.approx(8.0)


# ---- the speed limit -----------------------------------------------------------------------------


def test_warm_starts_never_exceed_the_speed_limit(prior) -> None:
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0), prior=prior)
    hist = accelerating_history(12.0, 12.0)
    g = road(limit=13.0)
    ego = hist[-1]
    paths = reference_paths(g, Route(0.0, ["A"]), ego, ahead=200.0)
    pin = PlannerInput(10.0, hist, TrackedObjects(10.0, []), TrafficLights(10.0), g, Route(0.0, ["A"]),
                       decision({"AK": 0.6, "AL": 0.4}, stamp=10.0))
    dec = latch(pin.decision, hist)
    forecast = ObjectBoxes.empty(81)
    ctx = ScoringContext(lane_map(g), paths["K"].centerline, ObjectBoxes.empty(41), 13.0)
    group_paths = [paths["K"], paths["L"]]
    obj = PlannerObjective(ego, np.zeros((2, 3)), 0.5, ctx, CLS_WEIGHTS, ["AK", "AL"], group_paths, CFG, dec)
    warm = pl._warm_starts(["AK", "AL"], group_paths, ego, forecast, 80, pin.vehicle, obj)
    for w in warm:
        speed = np.hypot(*np.diff(w[..., :2], axis=1).transpose(2, 0, 1)) / 0.5  # between waypoints
        assert speed.max() <= 13.0 + 0.05


# ---- progress normalisation ----------------------------------------------------------------------


def _scores(raw_progress: list[float], multiplicative: list[float]) -> ProposalScores:
    m = len(raw_progress)
    ones = np.ones(m)
    return ProposalScores(ones, ones, ones, ones, ones, np.array(raw_progress), ones, ones, ones,
                          np.array(multiplicative), ones, ones, np.full(m, np.inf))


def test_progress_is_normalised_by_the_best_feasible_proposal_as_pdm_closed_does() -> None:
    ego = EgoState(0.0, 0.0, 0.0, 0.0, 10.0)
    g = road()
    paths = reference_paths(g, Route(0.0, ["A"]), ego, ahead=200.0)
    ctx = ScoringContext(lane_map(g), paths["K"].centerline, ObjectBoxes.empty(41), 15.0)

    def objective() -> PlannerObjective:
        return PlannerObjective(ego, np.zeros((2, 3)), 0.5, ctx, CLS_WEIGHTS, [""], [paths["K"]], CFG)

    # The proposals (the first batch) made 20, 40 and (infeasible) 60 m: the reference is 40 m, fixed.
    obj = objective()
    obj._set_reference(_scores([20.0, 40.0, 60.0], [1.0, 1.0, 0.0]))
    assert obj.reference == 40.0 and obj.min_progress == -math.inf
    # A member making 30 m scores (5 * 0.75 + 5 + 2 + 4) / 16; one making 55 m gains nothing over 40 m.
    np.testing.assert_allclose(obj.j_gen(_scores([30.0, 55.0], [1.0, 1.0])), [(5 * 0.75 + 11) / 16, 1.0])
    # No proposal feasible, none colliding (all leave the drivable area): the best of them (50 m) is the
    # reference and a member must make 20 % of it: one crawling 5 m is no way through; 12 m is.
    obj = objective()
    obj._set_reference(_scores([30.0, 50.0], [0.0, 0.0]))
    assert obj.reference == 50.0 and obj.min_progress == pytest.approx(10.0)
    j = obj.j_gen(_scores([5.0, 12.0], [1.0, 1.0]))
    assert j[0] == 0.0 and j[1] == pytest.approx((5 * 12 / 50 + 11) / 16)
    # Every proposal collides (a lead braking hard): no threshold, a member stopping short is welcome.
    obj = objective()
    colliding = _scores([30.0, 50.0], [0.0, 0.0])
    colliding.no_at_fault_collision[:] = 0.0
    obj._set_reference(colliding)
    assert obj.min_progress == -math.inf and obj.reference == pytest.approx(obj.progress_floor)
    # Nothing moves: the floor (half of a gentle 1 m/s^2 start to the limit over 4 s), no threshold.
    obj = objective()
    obj._set_reference(_scores([0.0], [1.0]))
    assert obj.reference == pytest.approx(0.5 * (10 * 4 + 0.5 * 16)) and obj.min_progress == -math.inf


# ---- consistency and the published tail -----------------------------------------------------------


def test_near_tie_does_not_flip_the_chosen_action_under_one_decision(prior) -> None:
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0, switch_margin=10.0),
                               prior=prior)
    hist = accelerating_history(10.0, 10.0)
    d = decision({"CK": 0.5, "CL": 0.5}, stamp=10.0)
    first = pl.plan_detailed(PlannerInput(10.0, hist, TrackedObjects(10.0, []), TrafficLights(10.0), road(),
                                          Route(0.0, ["A"]), d))
    # With a margin of 1000 %, the incumbent a* is kept by every later cycle under the same decision.
    for k in range(1, 3):
        now = 10.0 + 0.5 * k
        h = [EgoState(s.stamp + 0.5 * k, s.x + 5.0 * k, 0.0, 0.0, 10.0) for s in hist]
        res = pl.plan_detailed(PlannerInput(now, h, TrackedObjects(now, []), TrafficLights(now), road(),
                                            Route(0.0, ["A"]), d))
        assert res.action == first.action and not res.flipped


def test_select_takes_the_best_admissible_candidate_and_all_when_none_is() -> None:
    args = (["CL", "CK", "DK"], [0.7, 0.2, 0.1], [1.0, 1.0, 1.0], [0.7, 1.0, 1.0])
    idx, scores = select(*args, CFG)
    assert idx == 0
    idx_safe, scores_safe = select(*args, CFG, admissible=[False, True, True])
    assert idx_safe == 1 and np.array_equal(scores, scores_safe)  # every candidate keeps its Eq. 22 score
    assert select(*args, CFG, admissible=[False, False, False])[0] == 0  # none admissible: Eq. 22 over all
    with pytest.raises(ValueError, match="admissibility"):
        select(*args, CFG, admissible=[True, False])


@pytest.mark.parametrize("safety_first", [True, False])
def test_a_likely_lane_change_into_a_closing_car_loses_to_keeping_the_lane(prior, safety_first) -> None:
    # A car 8 m behind in the left lane closing at 3 m/s: every searched CL trajectory breaks the TTC bound
    # (J_gen 0.69 > 0), keeping the lane keeps it. The paper's Eq. 22 takes CL on its probability
    # (0.8 x 0.69^0.3 > 0.2); safety first keeps the lane and says so.
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, deterministic=True, safety_first=safety_first),
                               prior=prior)
    hist = accelerating_history(10.0, 10.0)
    car = TrackedObject("closing", ObjectClass.VEHICLE, hist[-1].x - 8.0, 3.5, 0.0, 13.0, 0.0, 4.5, 1.9)
    res = pl.plan_detailed(PlannerInput(10.0, hist, TrackedObjects(10.0, [car]), TrafficLights(10.0), road(),
                                        Route(0.0, ["A"]), decision({"CL": 0.8, "CK": 0.2}, stamp=10.0)))
    by_action = {c.action: c for c in res.candidates}
    assert res.mode == MODE_DECISION
    assert by_action["CL"].ttc == 0.0 and by_action["CL"].j_gen > 0.0 and by_action["CK"].ttc == 1.0
    assert by_action["CL"].selection_score > by_action["CK"].selection_score
    assert (res.action, res.safety_gated) == (("CK", True) if safety_first else ("CL", False))
    assert pl.cycle_info()["safety_gated"] is safety_first
    # The hysteresis keeps a previous a* within the margin only while it is admissible.
    pl.last = replace(res, action="CL")
    in_force = SimpleNamespace(stamp=res.decision_stamp)
    near_tie = np.array([0.30, 0.32])
    assert pl._hysteresis(1, near_tie, ["CL", "CK"], in_force, [True, True]) == 0
    assert pl._hysteresis(1, near_tie, ["CL", "CK"], in_force, [False, True]) == 1


def test_published_tail_stops_behind_a_car_beyond_the_scored_horizon(prior) -> None:
    # A stopped car 75 m ahead in the only lane at 12 m/s: the scored 4 s end ~48 m ahead; the 8 s tail
    # must stop behind it, not run through it.
    g = LaneGraph()
    g.add(make_lane("A1", [[0, 0], [600, 0]], 3.5, 15.0, "A"))
    hist = accelerating_history(12.0, 12.0)
    car = TrackedObject("parked", ObjectClass.VEHICLE, hist[-1].x + 75.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0, use_decisions=False),
                               prior=prior)
    res = pl.plan_detailed(PlannerInput(10.0, hist, TrackedObjects(10.0, [car]), TrafficLights(10.0), g,
                                        Route(0.0, ["A"])))
    traj = res.trajectory
    assert (traj.x + VehicleParameters().front_length).max() < car.x - car.length / 2
    assert traj.x[40] < car.x - 15.0  # the scored part never came close: the tail did the stopping


def test_a_jump_of_the_ego_drops_the_last_plan_as_a_warm_start(prior) -> None:
    # The planner-node tests found it: after the ego jumped back 15 m, the last plan's waypoints (now far
    # ahead) densified into a 120 m/s reference. Far from the last plan, it is not a warm start.
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0, use_decisions=False),
                               prior=prior)
    hist = accelerating_history(10.0, 10.0)
    pl.plan_detailed(PlannerInput(10.0, hist, TrackedObjects(10.0, []), TrafficLights(10.0), road(),
                                  Route(0.0, ["A"])))
    on_track = EgoState(10.5, hist[-1].x + 5.0, 0.0, 0.0, 10.0)
    assert pl._previous_plan(on_track, 5, 80) is not None  # where the plan said: kept
    back = [EgoState(s.stamp + 0.5, s.x - 15.0, 0.0, 0.0, 10.0) for s in hist]
    assert pl._previous_plan(back[-1], 5, 80) is None
    res = pl.plan_detailed(PlannerInput(10.5, back, TrackedObjects(10.5, []), TrafficLights(10.5), road(),
                                        Route(0.0, ["A"])))
    assert res.trajectory.velocity.max() < 16.0


def test_a_lane_change_keeps_its_target_lane_after_the_ego_crossed_into_it(prior) -> None:
    # CL decided in the right lane A1; 1.5 s later the ego is in the left lane A0. The decision still
    # means "into A0": the planner follows A0 (there is no lane left of it any more), not a fallback.
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0), prior=prior)
    d = decision({"CL": 1.0}, stamp=10.0)
    hist = accelerating_history(10.0, 10.0)
    first = pl.plan_detailed(PlannerInput(10.0, hist, TrackedObjects(10.0, []), TrafficLights(10.0), road(),
                                          Route(0.0, ["A"]), d))
    assert first.mode == MODE_DECISION and first.action == "CL"
    crossed = [EgoState(s.stamp + 1.5, s.x + 15.0, 3.3, 0.0, 10.0) for s in hist]
    later = pl.plan_detailed(PlannerInput(11.5, crossed, TrackedObjects(11.5, []), TrafficLights(11.5), road(),
                                          Route(0.0, ["A"]), d))
    assert later.mode == MODE_DECISION and later.action == "CL", later.reasons
    assert abs(later.trajectory.y[-1] - 3.5) < 0.5  # stays in A0
    assert pl.decisions.current.target_lane("L", {"K": ("A0",), "R": ("A1",)}) == "K"
    assert pl.decisions.current.target_lane("K", {"K": ("A0",), "R": ("A1",)}) == "R"
