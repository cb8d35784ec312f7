"""The oracle decision source: the simulation-grounded teacher deciding from the closed-loop ego state
(``luna-oracle``, ``luna-onehot-oracle``), an upper bound for any student."""

from __future__ import annotations

import numpy as np

from luna_core.types import ACTION_INDEX, EgoState, PlannerInput, TrackedObjects, validate_distribution
from luna_bridge.action_scorer import SimulationActionScorer
from luna_bridge.baselines import make_eval_planner
from luna_bridge.oracle import OracleDecisionSource
from tests.unit.bridge.test_action_scorer import STEPS, _track, two_lane_road


def _input(scenario, ego: EgoState) -> PlannerInput:
    return PlannerInput(ego.stamp, [ego], scenario.objects_at(ego.stamp), scenario.lights_at(ego.stamp),
                        scenario.lane_graph, scenario.route, vehicle=scenario.vehicle)


def test_scoring_starts_from_the_given_closed_loop_state_not_the_expert():
    # The expert is 80 m behind a stalled car at t = 0 and has room to brake; a closed-loop ego 14 m
    # behind it at 10 m/s (more than it needs to stop) runs into it whatever it keeps to in its lane.
    road = two_lane_road([_track("v3", np.full(STEPS, 80.0), 0.0, 0.0)])
    scorer = SimulationActionScorer()
    expert = scorer.score_scenario(road, 0.0, ["CK", "SK"])
    close = scorer.score_scenario(road, 0.0, ["CK", "SK"], ego=EgoState(0.0, 66.0, 0.0, 0.0, 10.0))
    assert not expert["CK"].collision and not expert["SK"].collision
    assert close["CK"].collision and close["SK"].collision and "v3" in close["CK"].reason


def test_oracle_distribution_is_the_teachers_and_avoids_the_stalled_car():
    road = two_lane_road([_track("v3", np.full(STEPS, 80.0), 0.0, 0.0)])
    ego = EgoState(0.0, 60.0, 0.0, 0.0, 10.0)
    source = OracleDecisionSource(road)
    d = source.decide(_input(road, ego))
    p = validate_distribution(d.probabilities)
    assert d.stamp == 0.0 and d.candidate_set and d.candidate_set[0] == d.top_action
    assert d.top_action not in ("CK", "AK")  # both drive into v3 within the horizon
    assert all(p[ACTION_INDEX[c]] >= 0.1 for c in d.candidate_set)
    # The same state gives the same decision (seeded voters): evaluation stays deterministic.
    again = OracleDecisionSource(road).decide(_input(road, ego))
    assert np.array_equal(again.probabilities, d.probabilities)
    assert source.decisions == [d]


def test_onehot_oracle_issues_its_argmax_with_probability_one():
    road = two_lane_road([_track("v3", np.full(STEPS, 80.0), 0.0, 0.0)])
    ego = EgoState(0.0, 60.0, 0.0, 0.0, 10.0)
    soft = OracleDecisionSource(road).decide(_input(road, ego))
    hard = OracleDecisionSource(road, one_hot=True).decide(_input(road, ego))
    assert hard.candidate_set == [soft.top_action]
    assert hard.probabilities[ACTION_INDEX[soft.top_action]] == 1.0 and hard.probabilities.sum() == 1.0


def test_oracle_planners_are_registered_and_read_the_scenario():
    road = two_lane_road([])
    planner = make_eval_planner("luna-onehot-oracle", road)
    assert isinstance(planner.decision_source, OracleDecisionSource)
    assert planner.decision_source.scenario is road and planner.decision_source.one_hot
