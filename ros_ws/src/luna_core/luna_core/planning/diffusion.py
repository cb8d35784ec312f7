"""Trajectory diffusion prior for Diffusion-ES (LUNA-AD Eq. 21, CALMM-Drive Eq. 7).

What is diffused: 16 ego waypoints (x, y, heading) at 0.5 s over 8 s in the ego rear-axle frame at
planning time, as Verlet actions a_k = s_k - (2 s_{k-1} - s_{k-2}) seeded by the two latest history
poses (s_{-1} at -0.5 s, s_0 = the origin). Actions are second differences, so independent noise on
them gives smooth trajectories; they are divided per channel by their spread in the training data
(``action_scale``) so the model sees unit-scale data.

Conditioning: the ego history only, 5 frames at 0.5 s (-2 s .. now) x 7 features (x, y, cos h, sin h,
speed, acceleration, yaw rate) in the same ego frame.

Denoiser: a compact transformer, deliberately cheaper than Diffusion-ES's (8 layers, 21 tokens of
width 256): one history token plus 4 trajectory tokens of 4 waypoints each, width 128, 4 layers
(~0.85 M parameters). Measured on the 2 shared cores here, 21 tokens made one network evaluation of
a 640-member population (5 candidate actions x 128) cost ~270 ms and 5 tokens ~50 ms. A smaller
model (width 96, 3 layers, 0.37 M) trained in the same 13 minutes sampled clearly worse
trajectories (a quarter of them running backwards from a 3 m/s history), so the default stays at
this size and the cycle relies on the anytime budget when the machine is busy. The diffusion timestep is embedded
(sinusoidal + MLP) and added to every token; epsilon prediction, cosine noise schedule over 100
training steps, DDIM (eta 0) over 10 "trailing" steps at inference.

Diffusion-ES needs three operations, all on normalised actions:
``sample`` (full denoising from noise), ``renoise`` (forward-diffuse clean samples to the noise
level from which ``k`` DDIM steps remain) and ``denoise`` (run those last ``k`` steps).

Weights: ``save_pretrained`` / ``from_pretrained`` write and read a folder with ``config.json`` and
``model.safetensors`` (tensors only; nothing is unpickled).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from luna_core.geometry import AUTOCASTS
from luna_core.types import EgoState, wrap_angle

MODEL_TYPE = "luna-trajectory-diffusion"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class PriorLoadError(ValueError):
    """A prior folder is missing a file or its config/weights do not match."""


@dataclass
class DiffusionPriorConfig:
    """Architecture, schedule and data normalisation of the prior (saved as config.json)."""

    model_type: str = MODEL_TYPE
    num_waypoints: int = 16
    waypoint_dt: float = 0.5  # s between waypoints (and between history frames)
    history_frames: int = 5  # frames at waypoint_dt ending now
    waypoints_per_token: int = 4
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    ff_dim: int = 512
    train_timesteps: int = 100
    inference_steps: int = 10
    x0_clip: float = 6.0  # clip predicted clean actions to +- this many spreads (DDIM stability)
    # Spread of the raw Verlet actions (x m, y m, heading rad), fitted on the training data.
    action_scale: list[float] = field(default_factory=lambda: [0.25, 0.05, 0.02])
    # Divisors of the 7 history features (x, y, cos, sin, speed, acceleration, yaw rate).
    history_scale: list[float] = field(default_factory=lambda: [10.0, 2.0, 1.0, 1.0, 10.0, 2.0, 0.3])

    HISTORY_FEATURES = 7

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise PriorLoadError(f"config model_type is {self.model_type!r}, expected {MODEL_TYPE!r}")
        if self.num_waypoints % self.waypoints_per_token:
            raise PriorLoadError(f"num_waypoints {self.num_waypoints} is not a multiple of "
                                 f"waypoints_per_token {self.waypoints_per_token}")
        if not 1 <= self.inference_steps <= self.train_timesteps:
            raise PriorLoadError(f"inference_steps {self.inference_steps} must be in 1..{self.train_timesteps}")
        if len(self.action_scale) != 3 or min(self.action_scale) <= 0.0:
            raise PriorLoadError(f"action_scale must be 3 positive numbers, got {self.action_scale}")
        if len(self.history_scale) != self.HISTORY_FEATURES or min(self.history_scale) <= 0.0:
            raise PriorLoadError(f"history_scale must be {self.HISTORY_FEATURES} positive numbers")
        if self.history_frames < 2:
            raise PriorLoadError("history_frames must be >= 2 (the Verlet seed needs two poses)")

    @property
    def horizon(self) -> float:
        return self.num_waypoints * self.waypoint_dt

    @property
    def waypoint_times(self) -> np.ndarray:
        """(N,) times of the waypoints from now: 0.5 .. 8.0 s."""
        return self.waypoint_dt * np.arange(1, self.num_waypoints + 1)

    @property
    def history_times(self) -> np.ndarray:
        """(H,) times of the history frames from now: -2.0 .. 0 s."""
        return self.waypoint_dt * np.arange(-(self.history_frames - 1), 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DiffusionPriorConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PriorLoadError(f"unknown prior config keys: {', '.join(unknown)}")
        return cls(**data)


# --------------------------------------------------------------------------------------------------
# Ego-frame trajectories, Verlet actions, history features (NumPy: shared by the planner and training)
# --------------------------------------------------------------------------------------------------


def to_ego_frame(poses: np.ndarray, origin: Sequence[float] | np.ndarray) -> np.ndarray:
    """Map-frame poses (..., 3) into the frame of ``origin`` (x, y, heading); headings not wrapped."""
    poses = np.asarray(poses, dtype=np.float64)
    ox, oy, oh = (float(v) for v in origin)
    dx, dy = poses[..., 0] - ox, poses[..., 1] - oy
    c, s = math.cos(oh), math.sin(oh)
    return np.stack([c * dx + s * dy, -s * dx + c * dy, poses[..., 2] - oh], axis=-1)


def to_map_frame(poses: np.ndarray, origin: Sequence[float] | np.ndarray) -> np.ndarray:
    """Inverse of ``to_ego_frame`` for one origin (x, y, heading); headings wrapped."""
    poses = np.asarray(poses, dtype=np.float64)
    ox, oy, oh = (float(v) for v in origin)
    c, s = math.cos(oh), math.sin(oh)
    x = ox + c * poses[..., 0] - s * poses[..., 1]
    y = oy + s * poses[..., 0] + c * poses[..., 1]
    return np.stack([x, y, wrap_angle(poses[..., 2] + oh)], axis=-1)


def verlet_encode(poses: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Raw Verlet actions (B, N, 3) of ego-frame poses (B, N, 3) given seed poses (B, 2, 3) = (s_-1, s_0).

    Headings must be continuous (unwrapped) across seed and poses.
    """
    full = np.concatenate([seed, poses], axis=1)
    return full[:, 2:] - 2.0 * full[:, 1:-1] + full[:, :-2]


def verlet_decode(actions: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Poses (B, N, 3) from raw Verlet actions (B, N, 3) and seed poses (B, 2, 3)."""
    b, n, _ = actions.shape
    out = np.empty((b, n + 2, 3))
    out[:, :2] = seed
    for k in range(n):
        out[:, k + 2] = actions[:, k] + 2.0 * out[:, k + 1] - out[:, k]
    return out[:, 2:]


def history_features(t: np.ndarray, x: np.ndarray, y: np.ndarray, heading: np.ndarray, speed: np.ndarray,
                     acceleration: np.ndarray, yaw_rate: np.ndarray, now: float,
                     config: DiffusionPriorConfig) -> tuple[np.ndarray, np.ndarray]:
    """Conditioning features (H, 7) and the Verlet seed (2, 3), from one vehicle's past states.

    The states (increasing times ``t``, the last one at ``now``) are resampled at the history frame
    times in the frame of the state at ``now``. Before the first state the vehicle is extrapolated
    backwards at its first speed and heading, so a planner started a moment ago still has a history.
    """
    t = np.asarray(t, dtype=np.float64)
    h = np.unwrap(np.asarray(heading, dtype=np.float64))
    times = now + config.history_times
    first = times < t[0]
    back = np.minimum(times - t[0], 0.0)  # <= 0 seconds before the first state
    px = np.interp(times, t, x) + back * speed[0] * math.cos(h[0])
    py = np.interp(times, t, y) + back * speed[0] * math.sin(h[0])
    ph = np.interp(times, t, h)
    pv = np.interp(times, t, speed)
    pa = np.where(first, 0.0, np.interp(times, t, acceleration))
    pw = np.where(first, 0.0, np.interp(times, t, yaw_rate))
    origin = (float(np.interp(now, t, x)), float(np.interp(now, t, y)), float(np.interp(now, t, h)))
    local = to_ego_frame(np.column_stack([px, py, ph]), origin)
    feats = np.column_stack([local[:, 0], local[:, 1], np.cos(local[:, 2]), np.sin(local[:, 2]), pv, pa, pw])
    feats = feats / np.asarray(config.history_scale)
    return feats, local[-2:].copy()


def history_from_states(history: Sequence[EgoState], config: DiffusionPriorConfig
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``history_features`` of an ego history (oldest first; non-finite or out-of-order states dropped)."""
    states = [s for s in history if s.is_finite()]
    if not states:
        raise ValueError("the ego history has no finite state")
    now = states[-1].stamp
    kept = [states[-1]]
    for s in reversed(states[:-1]):  # strictly increasing stamps, newest wins
        if s.stamp < kept[-1].stamp:
            kept.append(s)
    kept.reverse()
    arr = np.array([[s.stamp, s.x, s.y, s.heading, s.velocity, s.acceleration, s.yaw_rate] for s in kept])
    if len(arr) == 1:  # one state: a flat, constant-speed past
        arr = np.vstack([arr - [1.0, 0, 0, 0, 0, 0, 0], arr])
        arr[0, 1] -= arr[1, 4] * math.cos(arr[1, 3])
        arr[0, 2] -= arr[1, 4] * math.sin(arr[1, 3])
    return history_features(*arr.T, now=now, config=config)


# --------------------------------------------------------------------------------------------------
# Denoiser
# --------------------------------------------------------------------------------------------------


def _timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


class TrajectoryDenoiser(nn.Module):
    """epsilon_theta(noisy normalised actions (B, N, 3), timestep (B,), history (B, H, 7))."""

    def __init__(self, config: DiffusionPriorConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.num_tokens = config.num_waypoints // config.waypoints_per_token
        token_in = 3 * config.waypoints_per_token
        self.history_in = nn.Sequential(
            nn.Linear(config.history_frames * config.HISTORY_FEATURES, d), nn.SiLU(), nn.Linear(d, d))
        self.trajectory_in = nn.Linear(token_in, d)
        self.position = nn.Parameter(torch.zeros(1 + self.num_tokens, d))
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        layer = nn.TransformerEncoderLayer(d, config.num_heads, config.ff_dim, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)
        self.out_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, token_in)
        nn.init.normal_(self.position, std=0.02)
        nn.init.zeros_(self.head.weight)  # start by predicting zero noise: a stable first step
        nn.init.zeros_(self.head.bias)

    def forward(self, actions: torch.Tensor, timestep: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        b = actions.shape[0]
        traj = self.trajectory_in(actions.reshape(b, self.num_tokens, -1))
        hist = self.history_in(history.reshape(b, -1))[:, None]
        tokens = torch.cat([hist, traj], dim=1) + self.position[None]
        tokens = tokens + self.time_mlp(_timestep_embedding(timestep, self.config.d_model))[:, None]
        out = self.head(self.out_norm(self.encoder(tokens)[:, 1:]))
        return out.reshape(b, self.config.num_waypoints, 3)


def cosine_alphas_cumprod(steps: int, s: float = 0.008) -> torch.Tensor:
    """alpha_bar_t for t = 0..steps-1 of the cosine schedule (Nichol & Dhariwal), betas capped at 0.999."""
    x = torch.linspace(0, steps, steps + 1, dtype=torch.float64)
    f = torch.cos(((x / steps) + s) / (1 + s) * math.pi / 2) ** 2
    betas = torch.clamp(1 - f[1:] / f[:-1], max=0.999)
    return torch.cumprod(1.0 - betas, dim=0).float()


# --------------------------------------------------------------------------------------------------
# The prior: model + schedule + DDIM
# --------------------------------------------------------------------------------------------------


class TrajectoryDiffusionPrior:
    """The denoiser with its noise schedule; all sampling methods work on normalised actions."""

    def __init__(self, config: DiffusionPriorConfig, model: TrajectoryDenoiser | None = None,
                 device: str | torch.device = "cpu", autocast: str = "none") -> None:
        self.config = config
        self.device = torch.device(device)
        if autocast not in AUTOCASTS:
            raise ValueError(f"TrajectoryDiffusionPrior: autocast must be one of {', '.join(AUTOCASTS)}, got {autocast!r}")
        # The denoiser's matrix products in this dtype (torch autocast); the DDIM update stays float32.
        # It changes the samples (a sampled trajectory is a chaotic function of the noise), so the
        # default is none: a planner with it needs its own closed-loop evaluation.
        self.autocast = autocast
        self.model = (model or TrajectoryDenoiser(config)).to(self.device).eval()
        self.alphas_cumprod = cosine_alphas_cumprod(config.train_timesteps).to(self.device)
        # "Trailing" DDIM timesteps (99, 89, ..., 9 for 100/10): the first step starts at pure noise.
        stride = config.train_timesteps / config.inference_steps
        self.timesteps: list[int] = [int(round(config.train_timesteps - i * stride)) - 1
                                     for i in range(config.inference_steps)]
        self._scale = torch.tensor(config.action_scale, dtype=torch.float32, device=self.device)

    # ---- persistence -----------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path) -> None:
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")
        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt", "model_type": MODEL_TYPE})

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu",
                        autocast: str = "none") -> "TrajectoryDiffusionPrior":
        folder = Path(path)
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise PriorLoadError(f"diffusion prior folder {folder} has no {name}")
        try:
            data = json.loads((folder / CONFIG_NAME).read_text())
        except json.JSONDecodeError as exc:
            raise PriorLoadError(f"{folder / CONFIG_NAME} is not valid JSON: {exc}") from None
        config = DiffusionPriorConfig.from_dict(data)
        model = TrajectoryDenoiser(config)
        try:
            model.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))
        except (RuntimeError, OSError, ValueError) as exc:
            raise PriorLoadError(f"{folder / WEIGHTS_NAME} does not match its config: {exc}") from None
        return cls(config, model, device, autocast)

    # ---- normalisation ---------------------------------------------------------------------------

    def normalise(self, raw_actions: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(raw_actions, dtype=torch.float32, device=self.device) / self._scale

    def denormalise(self, actions: torch.Tensor) -> np.ndarray:
        return (actions * self._scale).detach().cpu().double().numpy()

    def history_tensor(self, features: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(features, dtype=torch.float32, device=self.device)

    # ---- training --------------------------------------------------------------------------------

    def loss(self, actions: torch.Tensor, history: torch.Tensor, generator: torch.Generator | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """Epsilon-prediction MSE at uniformly drawn timesteps; ``mask`` (B, N) leaves out waypoints
        a recording does not cover (their actions are filled in but not learned from)."""
        b = actions.shape[0]
        t = torch.randint(0, self.config.train_timesteps, (b,), generator=generator).to(self.device)
        noise = self.noise(actions.shape, generator)
        ab = self.alphas_cumprod[t][:, None, None]
        noisy = ab.sqrt() * actions + (1 - ab).sqrt() * noise
        err = (self.model(noisy, t, history) - noise) ** 2
        if mask is None:
            return err.mean()
        w = mask[..., None].expand_as(err)
        return (err * w).sum() / w.sum().clamp(min=1.0)

    # ---- sampling --------------------------------------------------------------------------------

    def noise(self, shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None = None) -> torch.Tensor:
        """Standard normal noise on the prior's device, drawn on the CPU: a seeded search draws the same
        samples whatever the device (a CPU generator cannot fill a CUDA tensor)."""
        return torch.randn(tuple(shape), generator=generator).to(self.device)

    def _check_level(self, steps: int) -> None:
        if not 1 <= steps <= self.config.inference_steps:
            raise ValueError(f"denoising steps must be in 1..{self.config.inference_steps}, got {steps}")

    def renoise(self, actions: torch.Tensor, steps: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Forward-diffuse clean actions to the noise level from which ``steps`` DDIM steps remain."""
        self._check_level(steps)
        t = self.timesteps[self.config.inference_steps - steps]
        ab = self.alphas_cumprod[t]
        return ab.sqrt() * actions + (1 - ab).sqrt() * self.noise(actions.shape, generator)

    @torch.inference_mode()
    def denoise(self, noisy: torch.Tensor, history: torch.Tensor, steps: int,
                should_stop: Callable[[], bool] | None = None) -> torch.Tensor | None:
        """Run the last ``steps`` DDIM steps (eta 0) on ``noisy``; returns clean actions, or None if
        ``should_stop()`` turned true before a step (an anytime caller out of time).

        ``history`` is (B, H, 7) or (H, 7) shared by the whole batch.
        """
        self._check_level(steps)
        x = noisy
        b = x.shape[0]
        if history.dim() == 2:
            history = history[None].expand(b, -1, -1)
        clip = self.config.x0_clip
        ts = self.timesteps[self.config.inference_steps - steps:]
        for i, t in enumerate(ts):
            if should_stop is not None and should_stop():
                return None
            ab = self.alphas_cumprod[t]
            ab_prev = self.alphas_cumprod[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=self.device)
            with torch.autocast(self.device.type, dtype=getattr(torch, self.autocast, torch.float32),
                                enabled=self.autocast != "none"):
                eps = self.model(x, torch.full((b,), t, device=self.device, dtype=torch.long), history).float()
            x0 = ((x - (1 - ab).sqrt() * eps) / ab.sqrt()).clamp(-clip, clip)
            eps = (x - ab.sqrt() * x0) / (1 - ab).sqrt()  # consistent with the clipped x0
            x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps
        return x

    def warm_up(self) -> None:
        """One small sampling pass on a standing ego, so that torch's first-call set-up is paid now (a
        standby planner, before it takes over); with a generator of its own: no random stream moves."""
        history, _ = history_from_states([EgoState(0.0, 0.0, 0.0, 0.0, 0.0)], self.config)
        self.sample(self.history_tensor(history), 8, torch.Generator().manual_seed(0))

    def sample(self, history: torch.Tensor, num_samples: int, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        """Full DDIM sampling of ``num_samples`` clean normalised actions (B, N, 3)."""
        c = self.config
        out = self.denoise(self.noise((num_samples, c.num_waypoints, 3), generator), history, c.inference_steps)
        assert out is not None  # no stop condition given
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())
