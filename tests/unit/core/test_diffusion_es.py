"""Diffusion-ES loop: per-group objectives in one batched search, warm starts, elite resampling, the
anytime deadline and the waypoint densification. The prior is a real (tiny, untrained) denoiser; the
objectives are simple analytic functions of the trajectories, so the expected winners are known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core.planning.diffusion import DiffusionPriorConfig, TrajectoryDiffusionPrior
from luna_core.planning.diffusion_es import DiffusionESConfig, Evaluation, densify, diffusion_es

SEED = np.array([[-5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
HIST = np.zeros((5, 7))


@pytest.fixture(scope="module")
def prior() -> TrajectoryDiffusionPrior:
    torch.manual_seed(0)
    p = TrajectoryDiffusionPrior(DiffusionPriorConfig(d_model=32, num_layers=1, num_heads=2, ff_dim=64,
                                                      action_scale=[0.5, 0.5, 0.05]))
    with torch.no_grad():  # a non-trivial (random) denoiser instead of the zero-initialised head
        p.model.head.weight.normal_(0.0, 0.05)
    return p


class EndLateral:
    """Group g wants the final lateral position near targets[g]: J = exp(-|y_end - target| / 2)."""

    def __init__(self, targets: list[float]) -> None:
        self.targets = targets
        self.evaluated = 0

    def evaluate(self, poses: np.ndarray) -> Evaluation:
        self.evaluated += len(poses)
        states = np.zeros((len(poses), 2, 8))
        states[:, 1, :3] = poses[:, -1]
        return Evaluation(states, np.ones(len(poses)))

    def group_terms(self, group: int, evaluation: Evaluation, rows: np.ndarray) -> dict[str, np.ndarray]:
        y = evaluation.states[rows, 1, 1]
        score = np.exp(-np.abs(y - self.targets[group]) / 2.0)
        return {"score": score, "j_gen": evaluation.j_gen[rows], "y_end": y}


def straight(lateral_end: float, count: int) -> np.ndarray:
    k = np.arange(1, 17)
    y = lateral_end * (k / 16.0) ** 2
    return np.repeat(np.column_stack([5.0 * k, y, np.zeros(16)])[None], count, axis=0)


def test_groups_are_optimised_separately_in_one_search(prior) -> None:
    obj = EndLateral([20.0, -20.0])
    cfg = DiffusionESConfig(population=48, warm_starts=4, iterations=2)
    res = diffusion_es(prior, HIST, SEED, [straight(0.0, 4), straight(0.0, 4)], obj, cfg)
    assert res.stages_done == ["warm_starts", "prior", "iteration 1", "iteration 2"]
    assert res.budget_cut == ""
    warm_score = float(np.exp(-10.0))
    for g, sign in ((0, 1.0), (1, -1.0)):
        best = res.best[g]
        assert best is not None and best.score > warm_score
        assert sign * best.terms["y_end"] > 5.0  # moved far towards its own target
        assert best.poses.shape == (16, 3)
    # Scored: 8 warm starts, 44 shared prior samples (48 minus the 4 warm starts each group holds: no
    # more than a population takes), 2 x 2 x 48 iteration members.
    assert obj.evaluated == res.members_scored == 8 + 44 + 2 * 2 * 48
    assert res.network_evaluations == 10 + 5 + 1


def test_elite_resampling_only_improves_the_best(prior) -> None:
    obj = EndLateral([3.0])
    res0 = diffusion_es(prior, HIST, SEED, [straight(0.0, 2)], obj, DiffusionESConfig(population=32, iterations=0))
    res2 = diffusion_es(prior, HIST, SEED, [straight(0.0, 2)], obj, DiffusionESConfig(population=32, iterations=2))
    assert res2.best[0].score >= res0.best[0].score


def test_a_good_warm_start_is_kept_when_nothing_beats_it(prior) -> None:
    obj = EndLateral([7.0])
    res = diffusion_es(prior, HIST, SEED, [straight(7.0, 1)], obj, DiffusionESConfig(population=16, iterations=1))
    assert res.best[0].origin == "warm_start"
    assert res.best[0].score == pytest.approx(1.0)


class FakeClock:
    """A fake clock advancing a fixed step per reading, so deadlines cut deterministically."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_deadline_returns_the_warm_start_result_with_a_reason_fake_clock(prior) -> None:
    obj = EndLateral([2.0])
    clock = FakeClock(0.01)
    res = diffusion_es(prior, HIST, SEED, [straight(1.0, 3)], obj, DiffusionESConfig(population=16),
                       deadline=0.025, clock=clock)
    assert res.stages_done == ["warm_starts"]
    assert "deadline" in res.budget_cut
    assert res.best[0] is not None and res.best[0].origin == "warm_start"
    assert res.network_evaluations == 0


def test_a_search_without_warm_starts_still_returns_prior_samples(prior) -> None:
    res = diffusion_es(prior, HIST, SEED, [np.zeros((0, 16, 3))], EndLateral([0.0]),
                       DiffusionESConfig(population=8, iterations=1))
    assert res.stages_done == ["prior", "iteration 1"]
    assert res.best[0] is not None


def test_densify_passes_through_the_knots() -> None:
    poses = straight(4.0, 2) + np.array([0.0, 0.0, 0.01])
    dense = densify(poses, SEED, waypoint_dt=0.5, dt=0.1, steps=80)
    assert dense.shape == (2, 81, 3)
    np.testing.assert_allclose(dense[:, 0], 0.0, atol=1e-9)
    np.testing.assert_allclose(dense[:, 5::5], poses, atol=1e-9)


def test_known_stage_costs_limit_the_warm_starts_scored_fake_clock(prior) -> None:
    from luna_core.planning.diffusion_es import StageTimer

    timer = StageTimer()
    timer.record("evaluate", 10, 0.1)  # 10 ms per member, as measured in an earlier call
    clock = FakeClock(0.001)
    obj = EndLateral([2.0, -2.0])
    warm = [np.stack([straight(y, 1)[0] for y in np.linspace(-3, 3, 10)]) for _ in range(2)]
    res = diffusion_es(prior, HIST, SEED, warm, obj, DiffusionESConfig(population=8, warm_starts=10),
                       deadline=0.056, clock=clock, timer=timer)
    # ~54 ms left, sized with the 0.8 margin -> 4 members fit -> 2 per group, spread over each list
    # (its first and last entries).
    assert obj.evaluated == 4
    assert "scored 4 of 20 warm starts" in res.budget_cut
    assert res.best[0].terms["y_end"] == pytest.approx(3.0)
    assert res.best[1].terms["y_end"] == pytest.approx(-3.0)


def test_stages_shrink_to_the_time_left_fake_clock(prior) -> None:
    from luna_core.planning.diffusion_es import StageTimer

    timer = StageTimer()
    timer.record("evaluate", 100, 0.1)  # 1 ms per member scored
    timer.record("denoise", 1000, 1.0)  # 1 ms per member and denoising step
    clock = FakeClock(1e-6)
    obj = EndLateral([2.0, -2.0])
    # 0.25 s: at ~1 ms per member-step and ~1 ms per member scored, the prior stage affords about
    # 0.8 x 0.25 / 11 ms = 18 of 64 members (the fake clock makes measured costs tiny, so the moving-average
    # estimates drop a little with every stage and later stages afford more).
    res = diffusion_es(prior, HIST, SEED, [straight(0.0, 2), straight(0.0, 2)], obj,
                       DiffusionESConfig(population=64), deadline=0.25, clock=clock, timer=timer)
    import re

    n_prior = int(re.search(r"(\d+) of 62 prior samples", res.budget_cut).group(1))  # 64 - 2 warm starts
    assert 15 <= n_prior <= 22
    assert res.stages_done[:2] == ["warm_starts", "prior"]
    assert res.members_scored >= 4 + n_prior
    assert res.best[0] is not None and res.best[1] is not None
