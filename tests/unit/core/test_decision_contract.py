"""The decision contract (luna_core.decision): one validation, T_d and what derives from it, and the
decision in force at time t (latched once, candidate set as published, aged against 2 T_d)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from luna_core.decision import (DecisionTiming, DecisionTimingError, DecisionTracker, InvalidDecision,
                                check_decision)
from luna_core.types import ACTION_INDEX, DecisionDistribution, EgoState


def decision(probs: dict[str, float], stamp: float, candidates: list[str] | None = None) -> DecisionDistribution:
    p = np.zeros(10)
    for code, v in probs.items():
        p[ACTION_INDEX[code]] = v
    return DecisionDistribution(stamp, p, list(probs) if candidates is None else candidates)


def history(speed: float, until: float = 10.0) -> list[EgoState]:
    return [EgoState(round(t, 3), 0.0, 0.0, 0.0, speed) for t in np.arange(until - 1.0, until + 1e-9, 0.1)]


@pytest.mark.parametrize("bad, match", [
    (decision({"CK": 0.5}, 1.0), "sums to 0.5000"),
    (decision({"CK": 1.0}, math.nan), "stamp is not finite"),
    (decision({"CK": 1.0}, 1.0, candidates=["ZZ"]), r"unknown action code\(s\) \['ZZ'\] in the candidate set"),
    (DecisionDistribution(1.0, np.full(9, 1 / 9)), "9 entries, expected 10"),
])
def test_check_decision_names_what_is_wrong(bad, match):
    with pytest.raises(InvalidDecision, match=match):
        check_decision(bad)


def test_check_decision_returns_float64_probabilities():
    d = decision({"CK": 0.75, "DK": 0.25}, 4.0)
    d.probabilities = d.probabilities.astype(np.float32)
    checked = check_decision(d)
    assert checked.probabilities.dtype == np.float64 and checked.candidate_set == ["CK", "DK"]


def test_timeout_derives_from_t_d_unless_set():
    assert DecisionTiming().expiry == 4.0  # 2 T_d with the default T_d = 2 s
    assert DecisionTiming(period=0.5).expiry == 1.0
    assert DecisionTiming(period=0.5, timeout=3.0).expiry == 3.0
    assert DecisionTiming(period=0.0, timeout=3.0).expiry == 3.0


@pytest.mark.parametrize("period, timeout, match", [
    (0.0, 0.0, "decision_timeout must be set"),
    (-1.0, 0.0, "period must be a finite number >= 0"),
    (2.0, math.inf, "timeout must be a finite number >= 0"),
])
def test_unusable_timing_is_refused(period, timeout, match):
    with pytest.raises(DecisionTimingError, match=match):
        DecisionTiming(period, timeout)


def test_decision_instants_are_multiples_of_t_d():
    timing = DecisionTiming(period=2.0)
    assert [timing.due(t) for t in (0.0, 2.0, 4.000000001, 4.5, 5.0, 100.0)] == [True, True, True, False, False, True]
    assert not DecisionTiming(period=0.0, timeout=1.0).due(4.0), "T_d = 0: never a decision instant"
    # 0.1 s steps accumulated in floating point still land on the instant.
    assert DecisionTiming(period=0.5).due(sum([0.1] * 15))


def test_stale_says_how_old_and_why():
    assert DecisionTiming(period=2.0).stale(10.0, 14.0) == ""  # exactly 2 T_d: still in force
    assert DecisionTiming(period=2.0).stale(10.0, 14.5) == "decision is stale (4.50 s old > 4.00 s = 2 T_d)"
    assert DecisionTiming(period=2.0, timeout=1.0).stale(10.0, 11.5) == "decision is stale (1.50 s old > 1.00 s)"


def test_tracker_follows_the_published_candidate_set():
    # C_t as the decision node published it, even where the planner's own gamma_p would give another.
    tracker = DecisionTracker(DecisionTiming(2.0), gamma_p=0.3)
    d = decision({"CK": 0.5, "DK": 0.3, "CL": 0.2}, 10.0, candidates=["CK", "DK", "CL"])
    in_force, notes = tracker.follow(d, history(8.0), 10.5)
    assert in_force is not None and notes == []
    assert in_force.candidate_set == ("CK", "DK", "CL")
    # Without a published set, the tracker's gamma_p gives it.
    in_force, _ = DecisionTracker(DecisionTiming(2.0), gamma_p=0.3).follow(
        decision({"CK": 0.5, "DK": 0.3, "CL": 0.2}, 10.0, candidates=[]), history(8.0), 10.5)
    assert in_force is not None and in_force.candidate_set == ("CK", "DK")


def test_tracker_latches_once_per_decision_and_ages_it():
    tracker = DecisionTracker(DecisionTiming(period=1.0))
    d = decision({"CK": 1.0}, 10.0)
    first, _ = tracker.follow(d, history(8.0), 10.0, {"K": ["A1"]})
    assert first is not None and first.reference_speed == 8.0 and first.lanes == {"K": ("A1",)}
    # The same decision later, the ego faster and in other lanes: the latched values stay.
    again, _ = tracker.follow(d, history(12.0, until=11.5), 11.5, {"K": ["B1"]})
    assert again is first
    stale, notes = tracker.follow(d, history(12.0, until=12.5), 12.5)
    assert stale is None and notes == ["decision is stale (2.50 s old > 2.00 s = 2 T_d)"]
    newer, _ = tracker.follow(decision({"DK": 1.0}, 12.0), history(12.0, until=12.5), 12.5)
    assert newer is not None and newer.stamp == 12.0 and newer.reference_speed == 12.0


def test_tracker_reports_a_missing_or_invalid_decision():
    tracker = DecisionTracker()
    assert tracker.follow(None, history(8.0), 10.0) == (None, ["no decision received"])
    in_force, notes = tracker.follow(decision({"CK": 0.4}, 10.0), history(8.0), 10.0)
    assert in_force is None and notes == ["invalid decision: decision distribution sums to 0.4000, not 1"]
    assert tracker.current is None


def test_the_planner_ages_decisions_with_the_same_timing():
    from luna_core.planning.decision_guided import DecisionGuidedConfig

    assert DecisionGuidedConfig().timing == DecisionTiming(2.0, 0.0)
    assert DecisionGuidedConfig(decision_period=0.5).timing.expiry == 1.0  # derived: 2 T_d
    assert DecisionGuidedConfig(decision_period=0.5, decision_timeout=3.0).timing.expiry == 3.0
    with pytest.raises(ValueError, match="DecisionGuidedConfig: DecisionTiming: decision_timeout must be set"):
        DecisionGuidedConfig(decision_period=0.0)
