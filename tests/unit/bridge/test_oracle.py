"""The oracle decision source: the simulation-grounded teacher deciding from the closed-loop ego state
(``luna-oracle``, ``luna-onehot-oracle``), an upper bound for any student; and ``luna-oracle-cv``, the same
machinery on the present only."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from luna_core.types import ACTION_INDEX, EgoState, PlannerInput, validate_distribution
from luna_bridge.action_scorer import (BUNDLED_BANK_CONFIG, SimulationActionScorer, expert_state,
                                      make_bundled_bank_scorer, make_present_scorer)
from luna_bridge.baselines import make_eval_planner
from luna_bridge.oracle import OracleDecisionSource, _ScenarioScorer
from luna_bridge.scenario import SIM_DT
from luna_bridge.scenarios.format import save_scenario
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


def _braking_lead_road():
    """A lead 25 m ahead at the ego's 10 m/s that brakes at 5 m/s^2 after 1 s, to a stop at x = 45 m."""
    time = SIM_DT * np.arange(STEPS)
    brake = np.clip(time - 1.0, 0.0, 2.0)
    x = 25.0 + 10.0 * np.minimum(time, 1.0) + 10.0 * brake - 2.5 * brake ** 2
    v = np.where(time < 1.0, 10.0, np.maximum(10.0 - 5.0 * (time - 1.0), 0.0))
    return two_lane_road([_track("v1", x, 0.0, v)])


def test_the_cv_oracle_knows_only_the_present_and_misses_the_lead_braking_later():
    road = _braking_lead_road()
    ego = EgoState(0.0, 0.0, 0.0, 0.0, 10.0)
    pin = _input(road, ego)
    scorer = SimulationActionScorer()
    logged = _ScenarioScorer(scorer, road, pin).score(None, {}, ["CK"])["CK"]
    present = _ScenarioScorer(scorer, road, pin, privileged=False).score(None, {}, ["CK"])["CK"]
    # The log says the lead stops: keeping 10 m/s behind it cannot be executed (or collides).
    assert logged.collision or not logged.executable, logged
    # At constant velocity the lead keeps 10 m/s: Cruise is executable and safe.
    assert present.executable and not present.collision and present.score > logged.score, present


def test_the_cv_oracle_is_registered():
    planner = make_eval_planner("luna-oracle-cv", two_lane_road([]))
    assert isinstance(planner.decision_source, OracleDecisionSource)
    assert not planner.decision_source.privileged and not planner.decision_source.one_hot


def test_the_present_only_teacher_labels_a_frame_as_the_cv_oracle_scores_it(tmp_path):
    # The teacher `luna-offline collect --scorer ...:make_present_scorer` gives a frame the outcomes
    # `luna-oracle-cv`'s path computes from the same state with the same settings: one scoring path. It keeps
    # the setting when sent to a worker process (its state is the settings only).
    road = _braking_lead_road()
    teacher = make_present_scorer()
    assert teacher.present_only and copy.deepcopy(teacher).present_only  # through __getstate__
    actions = ["CK", "DK", "AK", "SK"]
    labelled = teacher.score_scenario(road, 0.0, actions)
    expert = expert_state(road, 0.0, road.vehicle.wheelbase)
    cv = _ScenarioScorer(SimulationActionScorer(BUNDLED_BANK_CONFIG), road, _input(road, expert),
                         privileged=False).score(None, {}, actions)
    assert {a: (o.score, o.collision, o.reason) for a, o in labelled.items()} == \
        {a: (o.score, o.collision, o.reason) for a, o in cv.items()}
    # ...and it differs from the hindsight teacher exactly where the log's future matters.
    logged = make_bundled_bank_scorer().score_scenario(road, 0.0, ["CK"])["CK"]
    assert labelled["CK"].executable and not labelled["CK"].collision
    assert labelled["CK"].score > logged.score
    # Through collect's context (a frame names its scenario file and time), the same outcomes.
    path = save_scenario(road, tmp_path / "braking.json.gz")
    via_file = teacher.score(None, {"frame": "f@0", "file": str(path), "time": 0.0}, actions)
    assert {a: o.score for a, o in via_file.items()} == pytest.approx({a: o.score for a, o in labelled.items()})
