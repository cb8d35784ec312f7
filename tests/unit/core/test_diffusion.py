"""The trajectory diffusion prior: Verlet actions, history features, DDIM operations, persistence,
and that training a tiny model really learns the history-conditioned distribution."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from luna_core.planning.diffusion import (DiffusionPriorConfig, PriorLoadError, TrajectoryDiffusionPrior,
                                          history_from_states, to_ego_frame, to_map_frame, verlet_decode,
                                          verlet_encode)
from luna_core.types import EgoState

TINY = dict(d_model=32, num_layers=1, num_heads=2, ff_dim=64)


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


def test_verlet_round_trip_and_constant_velocity_has_zero_actions() -> None:
    rng = np.random.default_rng(0)
    seed = rng.normal(size=(4, 2, 3))
    poses = rng.normal(size=(4, 16, 3)).cumsum(axis=1)
    np.testing.assert_allclose(verlet_decode(verlet_encode(poses, seed), seed), poses, atol=1e-9)
    line_seed = np.array([[[-5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    line = np.column_stack([5.0 * np.arange(1, 17), np.zeros(16), np.zeros(16)])[None]
    np.testing.assert_allclose(verlet_encode(line, line_seed), 0.0, atol=1e-12)


def test_ego_frame_round_trip() -> None:
    origin = (10.0, -3.0, 2.5)
    poses = np.array([[11.0, -2.0, 2.0], [0.0, 0.0, -3.0]])
    back = to_map_frame(to_ego_frame(poses, origin), origin)
    np.testing.assert_allclose(back[:, :2], poses[:, :2], atol=1e-12)
    np.testing.assert_allclose(np.cos(back[:, 2] - poses[:, 2]), 1.0)
    np.testing.assert_allclose(to_ego_frame(np.array([origin]), origin), 0.0, atol=1e-12)


def _straight_history(speed: float, heading: float = 0.7, n: int = 21, dt: float = 0.1) -> list[EgoState]:
    c, s = math.cos(heading), math.sin(heading)
    return [EgoState(5.0 - dt * k, 100.0 - speed * dt * k * c, 50.0 - speed * dt * k * s, heading, speed)
            for k in range(n - 1, -1, -1)]


def test_history_features_of_a_straight_drive_in_the_ego_frame() -> None:
    cfg = DiffusionPriorConfig()
    feats, seed = history_from_states(_straight_history(10.0), cfg)
    assert feats.shape == (5, 7)
    np.testing.assert_allclose(feats[:, 0] * cfg.history_scale[0], [-20, -15, -10, -5, 0], atol=1e-9)
    np.testing.assert_allclose(feats[:, 1], 0.0, atol=1e-9)
    np.testing.assert_allclose(feats[:, 2], 1.0)  # cos of the relative heading
    np.testing.assert_allclose(feats[:, 4] * cfg.history_scale[4], 10.0)
    np.testing.assert_allclose(seed, [[-5.0, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-9)
    # A single state (planner just started) is extrapolated backwards at its speed: the same result.
    feats1, seed1 = history_from_states(_straight_history(10.0)[-1:], cfg)
    np.testing.assert_allclose(feats1, feats, atol=1e-9)
    np.testing.assert_allclose(seed1, seed, atol=1e-9)


def test_history_drops_non_finite_and_out_of_order_states() -> None:
    cfg = DiffusionPriorConfig()
    hist = _straight_history(10.0)
    bad = hist[:10] + [EgoState(4.5, math.nan, 0.0, 0.0, 1.0), hist[3]] + hist[10:]
    np.testing.assert_allclose(history_from_states(bad, cfg)[0], history_from_states(hist, cfg)[0], atol=1e-9)
    with pytest.raises(ValueError, match="no finite state"):
        history_from_states([EgoState(0.0, math.nan, 0.0, 0.0, 0.0)], cfg)


def test_save_and_load_round_trip(tmp_path) -> None:
    prior = TrajectoryDiffusionPrior(DiffusionPriorConfig(**TINY))
    with torch.no_grad():
        for p in prior.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    prior.save_pretrained(tmp_path)
    loaded = TrajectoryDiffusionPrior.from_pretrained(tmp_path)
    x, h = torch.randn(3, 16, 3), torch.randn(3, 5, 7)
    t = torch.tensor([0, 50, 99])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x, t, h), prior.model(x, t, h))
    assert json.loads((tmp_path / "config.json").read_text())["d_model"] == 32


def test_load_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(PriorLoadError, match="no config.json"):
        TrajectoryDiffusionPrior.from_pretrained(tmp_path)
    TrajectoryDiffusionPrior(DiffusionPriorConfig(**TINY)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "d_model": 48}))
    with pytest.raises(PriorLoadError, match="does not match its config"):
        TrajectoryDiffusionPrior.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "surprise": 1}))
    with pytest.raises(PriorLoadError, match="unknown prior config keys: surprise"):
        TrajectoryDiffusionPrior.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PriorLoadError, match="not valid JSON"):
        TrajectoryDiffusionPrior.from_pretrained(tmp_path)


def test_ddim_operations_use_the_right_number_of_steps() -> None:
    prior = TrajectoryDiffusionPrior(DiffusionPriorConfig(**TINY))
    assert prior.timesteps == [99, 89, 79, 69, 59, 49, 39, 29, 19, 9]
    calls = []
    prior.model.register_forward_hook(lambda *_: calls.append(1))
    h = torch.zeros(5, 7)
    x = prior.sample(h, 6, torch.Generator().manual_seed(0))
    assert x.shape == (6, 16, 3) and len(calls) == 10
    noisy = prior.renoise(x, 5, torch.Generator().manual_seed(1))
    calls.clear()
    assert prior.denoise(noisy, h, 5).shape == (6, 16, 3) and len(calls) == 5
    assert prior.denoise(noisy, h, 5, should_stop=lambda: True) is None
    for bad in (0, 11):
        with pytest.raises(ValueError, match="denoising steps"):
            prior.renoise(x, bad)


def test_tiny_prior_learns_the_history_conditioned_acceleration() -> None:
    """Futures continue the acceleration shown in the history: after training, histories that
    accelerate must yield samples that travel much further than histories that brake."""
    torch.manual_seed(0)
    cfg = DiffusionPriorConfig(**TINY, action_scale=[0.5, 0.05, 0.02])
    prior = TrajectoryDiffusionPrior(cfg)
    rng = np.random.default_rng(0)
    m = 512
    accel = rng.choice([-1.5, 1.5], m)
    actions = np.zeros((m, 16, 3))
    actions[:, :, 0] = (accel * cfg.waypoint_dt ** 2)[:, None] + rng.normal(0, 0.02, (m, 16))
    hist = np.zeros((m, 5, 7))
    hist[:, :, 2] = 1.0
    hist[:, :, 4] = 1.0
    hist[:, :, 5] = (accel / cfg.history_scale[5])[:, None]
    x, h = prior.normalise(actions), prior.history_tensor(hist)
    opt = torch.optim.AdamW(prior.model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    prior.model.train()
    for _ in range(300):
        idx = torch.randint(0, m, (64,), generator=g)
        loss = prior.loss(x[idx], h[idx], g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    prior.model.eval()
    seed = np.array([[-5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    ends = {}
    for a in (-1.5, 1.5):
        cond = torch.tensor(hist[np.flatnonzero(accel == a)[0]], dtype=torch.float32)
        raw = prior.denormalise(prior.sample(cond, 64, torch.Generator().manual_seed(3)))
        ends[a] = float(np.median(verlet_decode(raw, np.broadcast_to(seed, (64, 2, 3)))[:, -1, 0]))
    # Constant 10 m/s gives 80 m; +-1.5 m/s^2 over 8 s adds or removes 48 m (Verlet sums: 0.25 a k(k+1)/2).
    assert ends[1.5] - ends[-1.5] > 50.0, ends


@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_shipped_prior_samples_plausible_trajectories_for_the_history(autocast: str) -> None:
    """The default weights (models/diffusion_prior) load and, for a straight 10 m/s history, sample
    forward-going, smooth trajectories whose travel grows with the history speed; with the denoiser's
    products in bfloat16 too (other samples, the same plausibility)."""
    from luna_core.assets import default_path

    prior = TrajectoryDiffusionPrior.from_pretrained(default_path("diffusion_prior"), autocast=autocast)
    assert 0.2e6 < prior.num_parameters() < 3e6
    ends = {}
    for speed in (3.0, 15.0):
        feats, seed = history_from_states(_straight_history(speed), prior.config)
        raw = prior.denormalise(prior.sample(prior.history_tensor(feats), 64, torch.Generator().manual_seed(0)))
        poses = verlet_decode(raw, np.broadcast_to(seed, (64, 2, 3)))
        assert np.all(np.isfinite(poses))
        assert np.median(np.abs(poses[:, -1, 1])) < 8.0  # mostly along the lane, some lane changes
        step = np.hypot(*np.diff(poses[..., :2], axis=1).transpose(2, 0, 1)) / prior.config.waypoint_dt
        assert np.percentile(step, 95) < 45.0  # m/s between waypoints: no jumps
        ends[speed] = float(np.median(poses[:, -1, 0]))
    assert 0.0 < ends[3.0] < 60.0 and 60.0 < ends[15.0] < 200.0, ends


def test_an_unknown_autocast_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="autocast must be one of none, bfloat16"):
        TrajectoryDiffusionPrior(DiffusionPriorConfig(), autocast="float8")
