"""J_dec (CALMM-Drive Eq. 4-5), Eq. 20 and Eq. 22 against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from luna_core.planning.objectives import (ObjectiveConfig, action_objective, candidate_actions,
                                           decision_following, select, selection_score, speed_interval)

CFG = ObjectiveConfig()
T = CFG.horizon_steps


def test_defaults_are_the_papers_values() -> None:
    assert (CFG.gamma_p, CFG.omega_dec, CFG.omega_gen, CFG.omega_prob) == (0.1, 5.0, 1.0, 1.0)
    assert (CFG.omega_dec_tilde, CFG.omega_gen_tilde) == (0.1, 0.3)
    assert (CFG.lam, CFG.gamma, CFG.v_bar, CFG.d_max, CFG.dt, CFG.horizon_steps) == (1.25, 0.75, 2.0, 5.0,
                                                                                       0.1, 40)


@pytest.mark.parametrize("action, v0, lo, hi", [
    ("AK", 10.0, 12.5, math.inf), ("AL", 1.0, 2.0, math.inf),  # v_bar lifts the accelerate floor
    ("CK", 10.0, 7.5, 12.5), ("CR", 1.0, 0.75, 2.0), ("DK", 10.0, 0.0, 7.5), ("DL", 0.0, 0.0, 0.0),
])
def test_speed_interval_eq5(action: str, v0: float, lo: float, hi: float) -> None:
    low, high = speed_interval(action, v0)
    assert low.shape == high.shape == (T,)
    np.testing.assert_allclose(low, lo)
    np.testing.assert_allclose(high, hi)


def test_stop_interval_is_a_comfortable_ramp_to_zero() -> None:
    low, high = speed_interval("SK", 4.0)
    np.testing.assert_allclose(low, 0.0)
    # 4 m/s - 2 m/s^2 * tau: 3.8 at tau = 0.1 s, 0 from tau = 2 s on.
    assert high[0] == pytest.approx(3.8)
    assert high[19] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(high[20:], 0.0)


def test_a_leader_caps_the_bounds_so_braking_behind_it_keeps_j_dec_and_only_accelerate_may_close() -> None:
    # CK latched at 10 m/s asks for [7.5, 12.5]; behind a stopping lead IDM slows to 0 over the horizon.
    cap = np.r_[np.full(10, np.inf), np.linspace(9.0, 0.0, 30)]
    lo, hi = speed_interval("CK", 10.0, speed_cap=cap)
    assert np.all(lo[:10] == 7.5) and np.all(hi[:10] == 12.5)
    assert np.allclose(lo[10:], np.minimum(7.5, cap[10:])) and np.allclose(hi[10:], cap[10:])
    braking = np.r_[np.full(10, 9.5), np.linspace(9.0, 0.0, 30)][None]
    zero = np.zeros((1, 40))
    assert decision_following("CK", zero, braking, 10.0, speed_cap=cap)[0] == pytest.approx(1.0)
    assert decision_following("CK", zero, braking, 10.0)[0] < 0.8  # without the cap: penalised
    keeping = np.full((1, 40), 10.0)  # Cruise means follow: driving on into the stopping lead leaves it
    assert decision_following("CK", zero, keeping, 10.0, speed_cap=cap)[0] < 0.8
    # Accelerate keeps its open upper bound (the decider may foresee the leader moving off); its lower
    # bound is capped, so following is not punished either.
    lo_a, hi_a = speed_interval("AK", 10.0, speed_cap=cap)
    assert np.all(np.isinf(hi_a)) and np.allclose(lo_a[10:], np.minimum(12.5, cap[10:]))
    assert decision_following("AK", zero, keeping, 10.0, speed_cap=cap)[0] > \
        decision_following("AK", zero, keeping, 10.0)[0]


def test_centreline_at_interval_speed_scores_one() -> None:
    j = decision_following("CK", np.zeros((1, T)), np.full((1, T), 10.0), v0=10.0)
    assert j[0] == pytest.approx(1.0)


def test_five_metres_off_scores_zero() -> None:
    j = decision_following("CK", np.full((2, T), 5.0) * [[1], [-1]], np.full((2, T), 10.0), v0=10.0)
    np.testing.assert_allclose(j, 0.0)


def test_hand_computed_partial_scores() -> None:
    # 2.5 m off on average (1 m then 4 m), and 2.5 m/s too fast for Decelerate from 10 m/s (V = [0, 7.5)):
    # lane 1 - 2.5 / 5 = 0.5; speed 1 - 0.1 * 2.5 = 0.75.
    offsets = np.concatenate([np.full(T // 2, 1.0), np.full(T // 2, -4.0)])[None]
    j = decision_following("DK", offsets, np.full((1, T), 10.0), v0=10.0)
    assert j[0] == pytest.approx(0.5 * 0.75)
    # Accelerate from 8 m/s needs >= 10 m/s; half the steps at 9 m/s: mean deviation 0.5 -> 0.95.
    speeds = np.concatenate([np.full(T // 2, 9.0), np.full(T // 2, 11.0)])[None]
    assert decision_following("AK", np.zeros((1, T)), speeds, v0=8.0)[0] == pytest.approx(0.95)


def test_stop_penalises_only_speed_above_the_ramp() -> None:
    tau = np.arange(1, T + 1) * 0.1
    braking = np.maximum(6.0 - 3.0 * tau, 0.0)[None]  # firmer than 2 m/s^2: inside
    assert decision_following("SK", np.zeros((1, T)), braking, v0=6.0)[0] == pytest.approx(1.0)
    keeps_going = np.full((1, T), 6.0)
    expected = 1.0 - 0.1 * np.mean(6.0 - np.maximum(6.0 - 2.0 * tau, 0.0))
    assert decision_following("SK", np.zeros((1, T)), keeps_going, v0=6.0)[0] == pytest.approx(expected)


def test_eq20_and_eq22_weights() -> None:
    j = action_objective(np.array([0.9, 0.0, 1.0]), np.array([0.8, 1.0, 0.0]))
    np.testing.assert_allclose(j, [0.9 ** 5 * 0.8, 0.0, 0.0])
    np.testing.assert_allclose(action_objective(None, np.array([0.7])), [0.7])
    s = selection_score(0.6, 0.5, 0.8)
    assert float(s) == pytest.approx(0.6 * 0.5 ** 0.1 * 0.8 ** 0.3)


def test_eq22_prefers_quality_over_probability_when_it_should() -> None:
    # The likely action (0.6) only finds a trajectory with J_gen 0.05; the less likely (0.3) one 0.9.
    idx, scores = select(["CK", "CL"], [0.6, 0.3], [1.0, 0.8], [0.05, 0.9])
    assert idx == 1
    np.testing.assert_allclose(scores, [0.6 * 0.05 ** 0.3, 0.3 * 0.8 ** 0.1 * 0.9 ** 0.3])
    idx, _ = select(["CK", "CL"], [0.6, 0.3], [1.0, 0.8], [0.8, 0.9])
    assert idx == 0


def test_candidate_set_uses_gamma_p() -> None:
    p = np.zeros(10)
    p[[3, 4, 6]] = [0.55, 0.35, 0.10]  # CK, CL, DK
    assert candidate_actions(p) == ["CK", "CL", "DK"]
    assert candidate_actions(p, ObjectiveConfig(gamma_p=0.2)) == ["CK", "CL"]


def test_bad_config_and_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="gamma < 1 < lambda"):
        ObjectiveConfig(lam=0.9)
    with pytest.raises(ValueError, match="omega_dec"):
        ObjectiveConfig(omega_dec=-1.0)
    with pytest.raises(ValueError, match="unknown action code 'XK'"):
        speed_interval("XK", 3.0)
    with pytest.raises(ValueError, match="40 future steps"):
        decision_following("CK", np.zeros((1, 10)), np.zeros((1, 10)), v0=1.0)
