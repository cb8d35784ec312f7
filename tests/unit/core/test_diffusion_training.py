"""train-diffusion data windows and checkpoints (luna_offline.train_diffusion)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from luna_core.planning.diffusion import DiffusionPriorConfig, TrajectoryDiffusionPrior, verlet_decode
from luna_offline.train_diffusion import (MAX_ACTION, _load_checkpoint, _save_checkpoint, recorded_windows,
                                          track_windows)

CFG = DiffusionPriorConfig(d_model=32, num_layers=1, num_heads=2, ff_dim=64)


def accelerating_track(seconds: float, a: float = 1.0, v0: float = 5.0, heading: float = 0.3):
    t = np.arange(0.0, seconds + 1e-9, 0.1)
    s = v0 * t + 0.5 * a * t ** 2
    return t, s * np.cos(heading), s * np.sin(heading), np.full_like(t, heading), v0 + a * t, np.full_like(t, a)


def test_windows_of_a_constant_acceleration_track() -> None:
    w = track_windows(*accelerating_track(12.0), config=CFG, source="test", stride=5)
    # Anchors every 0.5 s while >= 2 s of future remain: t = 0 .. 10 s -> 21 windows.
    assert len(w.actions) == 21
    full = w.mask.all(axis=1)
    np.testing.assert_array_equal(np.flatnonzero(full), np.arange(9))  # anchors 0 .. 4 s: all 8 s
    # Verlet actions of x(t) = v0 t + a t^2 / 2 sampled every 0.5 s: a * 0.25 along the heading
    # (anchor 0 has no past: its seed is extrapolated at constant speed, so its first action is half).
    np.testing.assert_allclose(w.actions[1:9, :, 0], 0.25, atol=1e-9)
    assert w.actions[0, 0, 0] == pytest.approx(0.125)
    np.testing.assert_allclose(w.actions[:9, :, 1:], 0.0, atol=1e-9)
    np.testing.assert_allclose(verlet_decode(w.actions, w.seeds), w.poses, atol=1e-9)
    # The last window keeps 2 s (4 waypoints) of future; the rest is masked.
    assert w.mask[-1].sum() == 4
    m = w.mirrored()
    np.testing.assert_allclose(m.actions[..., 1], -w.actions[..., 1])
    np.testing.assert_allclose(m.history[..., 3], -w.history[..., 3])


def test_implausible_windows_are_dropped() -> None:
    t, x, y, h, v, a = accelerating_track(12.0)
    x = x.copy()
    x[60:] += 30.0  # a 30 m jump: a recording glitch, not driving
    w = track_windows(t, x, y, h, v, a, config=CFG, source="test", stride=5)
    assert 0 < len(w.actions) < 21
    assert np.all(np.abs(w.actions) <= MAX_ACTION)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    prior = TrajectoryDiffusionPrior(CFG)
    opt = torch.optim.AdamW(prior.model.parameters(), lr=1e-3)
    loss = prior.loss(torch.randn(8, 16, 3), torch.randn(8, 5, 7))
    loss.backward()
    opt.step()
    _save_checkpoint(tmp_path, prior, opt, {"step": 7, "elapsed": 1.5, "curve": [[5, 0.9, None]]})
    other = TrajectoryDiffusionPrior(CFG)
    opt2 = torch.optim.AdamW(other.model.parameters(), lr=1e-3)
    meta = _load_checkpoint(tmp_path, other, opt2)
    assert meta["step"] == 7 and meta["curve"] == [[5, 0.9, None]]
    for a, b in zip(prior.model.state_dict().values(), other.model.state_dict().values()):
        torch.testing.assert_close(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    torch.testing.assert_close(s1[0]["exp_avg"], s2[0]["exp_avg"])
    assert not list(tmp_path.glob("*.tmp"))


def test_recorded_windows_from_a_real_commonroad_file() -> None:
    folder = Path(os.environ.get("LUNA_COMMONROAD_DIR",
                                 Path(__file__).resolve().parents[3].parent / "shared" / "scenarios" / "commonroad"))
    files = sorted(folder.glob("USA_US101-4_1_T-1.xml"))
    if not files:
        pytest.skip(f"CommonRoad scenarios not found in {folder} (set LUNA_COMMONROAD_DIR)")
    w = recorded_windows(files, CFG)
    assert len(w.actions) > 20
    assert np.all(np.abs(w.actions) <= MAX_ACTION)
    assert np.all(w.mask.sum(axis=1) >= 4) and np.all(w.mask[:, 0])
    assert np.all(np.isfinite(w.history))
