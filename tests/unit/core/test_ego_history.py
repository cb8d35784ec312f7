"""The ego history both the planner node and the scene descriptor keep (luna_core.ego_history): the
reported acceleration paired with the odometry by stamp in either arrival order, a smoothed finite
difference only for a source without acceleration, the instant's inputs complete, out-of-order and
non-finite states refused."""

from __future__ import annotations

import math

import pytest

from luna_core.ego_history import EgoHistory, EgoHistoryError, heard_at
from luna_core.types import EgoState


def state(stamp: float, velocity: float = 8.0, acceleration: float = 0.0) -> EgoState:
    # acceleration: what a converter might have put there; the history sets its own.
    return EgoState(stamp, 10.0 * stamp, 0.0, 0.0, velocity, acceleration)


def test_acceleration_is_paired_by_stamp_in_either_order():
    h = EgoHistory()
    h.add_acceleration(1.0, 0.5)
    assert h.add_state(state(1.0)).acceleration == 0.5  # its own arrived first
    provisional = h.add_state(state(1.1))
    assert provisional.acceleration == 0.5, "its own not in yet: the latest reported, until it comes"
    h.add_acceleration(1.1, -1.25)
    assert provisional.acceleration == -1.25 and h.latest is provisional
    assert [s.acceleration for s in h.states] == [0.5, -1.25]
    h.add_acceleration(1.05, 9.0)  # no state of that stamp: pairs with nothing
    assert [s.acceleration for s in h.states] == [0.5, -1.25]


def test_without_an_acceleration_source_the_speed_is_differentiated_and_smoothed():
    h = EgoHistory()
    assert h.add_state(state(0.0, 8.0, acceleration=3.0)).acceleration == 0.0  # first state: nothing to difference
    # raw = (9 - 8) / 0.5 = 2 -> 0.7 * 0 + 0.3 * 2
    assert h.add_state(state(0.5, 9.0)).acceleration == pytest.approx(0.6)
    # raw = (9 - 9) / 0.5 = 0 -> 0.7 * 0.6
    assert h.add_state(state(1.0, 9.0)).acceleration == pytest.approx(0.42)
    assert h.add_state(state(1.0, 20.0)).acceleration == pytest.approx(0.42), "same stamp: no division by ~0"
    # Once a source reports, its value is used, never the difference.
    h.add_acceleration(1.5, -2.0)
    assert h.add_state(state(1.5, 30.0)).acceleration == -2.0


def test_history_keeps_its_duration_and_refuses_bad_states():
    h = EgoHistory(duration=1.0)
    for k in range(21):
        h.add_state(state(k * 0.1))
    assert [round(s.stamp, 3) for s in h.states][0] == 1.0 and len(h.states) == 11
    with pytest.raises(EgoHistoryError, match=r"odometry stamp 1.500 s is older than the last one \(2.000 s\)"):
        h.add_state(state(1.5))
    with pytest.raises(EgoHistoryError, match="odometry contains NaN or inf"):
        h.add_state(state(3.0, velocity=math.nan))
    with pytest.raises(EgoHistoryError, match="not finite"):
        h.add_acceleration(3.0, math.inf)


def test_the_state_of_an_instant_and_whether_its_inputs_are_in():
    h = EgoHistory()
    assert h.latest is None and h.at_or_before(1.0) is None and h.missing_at(1.0) == ["odometry (latest never)"]
    for t in (1.0, 1.1, 1.2):
        h.add_state(state(t))
    assert h.at_or_before(1.15).stamp == 1.1 and h.at_or_before(0.5).stamp == 1.0
    assert h.missing_at(1.2) == [], "no acceleration source heard: nothing to wait for"
    assert h.missing_at(1.3) == ["odometry (latest 1.20 s)"]
    h.add_acceleration(1.1, 0.0)
    assert h.missing_at(1.2) == ["acceleration (latest 1.10 s)"], "the source is heard: wait for the instant's"
    h.add_acceleration(1.2, 0.0)
    assert h.missing_at(1.2) == []
    assert heard_at(None, 5.0) and heard_at(5.0 - 1e-9, 5.0) and not heard_at(4.9, 5.0)


def test_an_expected_source_is_waited_for_before_its_first_report():
    """A node that sees a publisher on the acceleration topic waits for the first report too: it may
    come after the first odometry (DDS does not order topics), and without the wait the first scene
    would carry a finite difference (0) instead of the reported value."""
    h = EgoHistory()
    h.accelerations.expected = True
    h.add_state(state(1.0))
    assert h.missing_at(1.0) == ["acceleration (latest never)"], "a publisher exists: its first report is waited for"
    h.add_acceleration(1.0, 1.5)
    assert h.missing_at(1.0) == [] and h.latest.acceleration == 1.5
    h.accelerations.expected = False
    h.add_state(state(1.1))
    assert h.missing_at(1.1) == ["acceleration (latest 1.00 s)"], "once heard, the instant's report is waited for whatever the flag says"


def test_steering_angle_is_paired_by_stamp_and_unknown_without_reports():
    h = EgoHistory()
    assert h.add_state(state(1.0)).steering_angle is None, "never reported: not measured (planning estimates it)"
    assert h.missing_at(1.0) == [], "no steering source heard: nothing to wait for"
    h.add_steering_angle(1.1, 0.25)  # its own arrived first
    assert h.add_state(state(1.1)).steering_angle == 0.25
    provisional = h.add_state(state(1.2))
    assert provisional.steering_angle == 0.25, "its own not in yet: the latest reported, until it comes"
    assert h.missing_at(1.2) == ["steering angle (latest 1.10 s)"], "the source is heard: wait for the instant's angle"
    h.add_steering_angle(1.2, -0.3)
    assert provisional.steering_angle == -0.3 and h.missing_at(1.2) == []
    assert [s.steering_angle for s in h.states] == [None, 0.25, -0.3]
    assert [s.acceleration for s in h.states] == [0.0, 0.0, 0.0], "the acceleration is not touched"
    with pytest.raises(EgoHistoryError, match="steering angle nan at stamp 1.3 is not finite"):
        h.add_steering_angle(1.3, math.nan)
