"""Intelligent Driver Model: hand-computed accelerations and closed-loop following behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.idm import NUPLAN_AGENT, idm_acceleration, idm_profile, idm_step, pdm_policy


def test_hand_computed_acceleration() -> None:
    # v 5, leader 5 m/s at 20 m: s* = 1 + 5 * 1.5 = 8.5; a = 1 (1 - (5/10)^4 - (8.5/20)^2)
    a = idm_acceleration(5.0, 20.0, 5.0, NUPLAN_AGENT)
    assert float(a) == pytest.approx(1.0 - 0.0625 - (8.5 / 20.0) ** 2)


def test_free_road_limits() -> None:
    assert float(idm_acceleration(0.0, np.inf, 0.0, NUPLAN_AGENT)) == pytest.approx(1.0)
    assert float(idm_acceleration(10.0, np.inf, 0.0, NUPLAN_AGENT)) == pytest.approx(0.0)
    assert float(idm_acceleration(0.5, 0.0, 0.0, NUPLAN_AGENT)) == pytest.approx(-2.0)  # clipped at -b


def test_vectorised_broadcast_and_target_override() -> None:
    a = idm_acceleration(np.array([0.0, 5.0, 10.0]), np.inf, 0.0, NUPLAN_AGENT,
                         target_velocity=np.array([5.0, 5.0, 20.0]))
    assert a.shape == (3,)
    assert a[1] == pytest.approx(0.0) and a[0] == pytest.approx(1.0) and 0 < a[2] < 1


def test_pdm_policy_exponent_keeps_full_acceleration_longer() -> None:
    pdm = pdm_policy(10.0)
    assert pdm.exponent == 10.0 and pdm.accel_max == 1.5 and pdm.decel_max == 3.0
    assert float(idm_acceleration(8.0, np.inf, 0.0, pdm)) > float(idm_acceleration(8.0, np.inf, 0.0, NUPLAN_AGENT))


def test_free_road_converges_to_target_without_overshoot() -> None:
    s, v = idm_profile(0.0, np.inf, 0.0, NUPLAN_AGENT, steps=600)
    assert v[-1] == pytest.approx(10.0, abs=0.05)
    assert v.max() <= 10.0 + 1e-9
    assert np.all(np.diff(s) >= 0)


def test_stops_behind_a_stopped_leader() -> None:
    s, v = idm_profile(10.0, 60.0, 0.0, NUPLAN_AGENT.with_target_velocity(10.0), steps=300)
    assert v[-1] < 0.05
    assert s[-1] < 60.0 - 0.5  # never reaches the leader's rear
    assert np.all(v >= 0)


def test_idm_step_never_reverses() -> None:
    # v 1 at zero gap brakes at -2 m/s^2; over a 1 s step that would reverse, so it stops at 0.
    _, v = idm_step(np.zeros(2), np.array([1.0, 0.0]), np.array([0.0, 0.0]), np.zeros(2), NUPLAN_AGENT, dt=1.0)
    np.testing.assert_array_equal(v, [0.0, 0.0])
