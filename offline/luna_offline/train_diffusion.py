"""``luna-offline train-diffusion``: train the Diffusion-ES trajectory prior (DESIGN Sec. 7).

Training data (all as 10 s windows: 2 s of history, 8 s of future at 0.5 s, rear-axle poses):

* **recorded**: every vehicle recorded in the CommonRoad scenarios (real NGSIM traffic). The
  recordings are short (mostly 1-10 s), so a window keeps whatever future exists (at least 2 s) and
  the waypoints past the end of the recording are masked out of the loss; a missing past is
  extrapolated backwards at constant speed, as the planner does with a short ego history.
* **synthetic**: manoeuvres driven on the CommonRoad scenarios' real lanelet networks, covering the
  whole action space the planner asks for (accelerate / cruise / decelerate / stop x keep / left /
  right lane change, from standstill up to 30 m/s), with smooth jerk-limited speed profiles and
  quintic lateral lane-change profiles;
* **suite**: the expert ego trajectories of the bundled synthetic suite's training split
  (``synthetic-train``; never the hard / random evaluation splits), when it has been generated.

Training: epsilon-prediction MSE (``TrajectoryDiffusionPrior.loss``), AdamW with cosine decay,
wall-clock budget (``--minutes``), resumable from ``--work-dir`` (checkpoint = safetensors tensors +
JSON state; no pickle). Writes ``model.safetensors`` + ``config.json`` + ``loss_curve.png`` +
``metrics.json`` + ``README.md`` (model card) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from luna_core.lanes import Polyline
from luna_core.planning.diffusion import (DiffusionPriorConfig, TrajectoryDiffusionPrior, history_features,
                                          to_ego_frame, verlet_decode, verlet_encode)
from luna_core.types import VehicleParameters

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "models" / "diffusion_prior"
DEFAULT_COMMONROAD = REPO_ROOT.parent / "shared" / "scenarios" / "commonroad"
STEP = 0.1  # s, resolution of the recordings and of the synthetic manoeuvres
# Plausibility limits on one Verlet action (second difference over 0.5 s): 8 m/s^2 in x and y
# (8 * 0.5^2 = 2 m) and a yaw-rate change of 1 rad/s per 0.5 s. Windows beyond them come from
# recording noise or kinks in lanelet chains, not from driving, and are dropped.
MAX_ACTION = np.array([2.0, 2.0, 0.5])
MIN_FUTURE_WAYPOINTS = 4  # 2 s


@dataclass
class WindowSet:
    """Training windows: raw Verlet actions (M, N, 3), history features (M, H, 7), seeds (M, 2, 3),
    loss mask (M, N), ground-truth ego-frame poses (M, N, 3) and the source of each window."""

    actions: np.ndarray
    history: np.ndarray
    seeds: np.ndarray
    mask: np.ndarray
    poses: np.ndarray
    source: np.ndarray

    @classmethod
    def concat(cls, parts: list["WindowSet"]) -> "WindowSet":
        parts = [p for p in parts if len(p.actions)]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("actions", "history", "seeds", "mask", "poses", "source")))

    def mirrored(self) -> "WindowSet":
        """The left-right mirror image (y, heading, sin heading and yaw rate negated)."""
        flip = np.array([1.0, -1.0, -1.0])
        hist_flip = np.array([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0])
        return WindowSet(self.actions * flip, self.history * hist_flip, self.seeds * flip, self.mask.copy(),
                         self.poses * flip, self.source.copy())

    def take(self, idx: np.ndarray) -> "WindowSet":
        return WindowSet(self.actions[idx], self.history[idx], self.seeds[idx], self.mask[idx],
                         self.poses[idx], self.source[idx])


def track_windows(t: np.ndarray, x: np.ndarray, y: np.ndarray, h: np.ndarray, v: np.ndarray, a: np.ndarray,
                  config: DiffusionPriorConfig, source: str, stride: int = 5,
                  min_future: int = MIN_FUTURE_WAYPOINTS, anchors: list[int] | None = None) -> WindowSet:
    """Windows of one track sampled every ``STEP`` (rear-axle poses; headings may be wrapped), anchored
    every ``stride`` samples (or at ``anchors``) where at least ``min_future`` waypoints follow."""
    h = np.unwrap(h)
    yaw_rate = np.gradient(h, t) if len(t) > 1 else np.zeros_like(h)
    n = config.num_waypoints
    per = int(round(config.waypoint_dt / STEP))
    out: dict[str, list] = {k: [] for k in ("actions", "history", "seeds", "mask", "poses")}
    starts = range(0, len(t) - per * min_future, stride) if anchors is None else \
        [i for i in anchors if i < len(t) - per * min_future]
    for i in starts:
        avail = min((len(t) - 1 - i) // per, n)
        feats, seed = history_features(t[:i + 1], x[:i + 1], y[:i + 1], h[:i + 1], v[:i + 1], a[:i + 1],
                                       yaw_rate[:i + 1], now=float(t[i]), config=config)
        idx = i + per * np.arange(1, avail + 1)
        origin = (x[i], y[i], h[i])
        fut = to_ego_frame(np.column_stack([x[idx], y[idx], h[idx]]), origin)
        if avail < n:  # run on at the last speed: actions ~0 there, and masked anyway
            last = fut[-1] if avail else np.zeros(3)
            prev = fut[-2] if avail >= 2 else (seed[1] if avail == 1 else seed[0])
            k = np.arange(1, n - avail + 1)[:, None]
            fut = np.vstack([fut, last + k * (last - prev)])
        actions = verlet_encode(fut[None], seed[None])[0]
        if np.any(np.abs(actions) > MAX_ACTION) or np.any(np.abs(feats) > 20.0):
            continue
        out["actions"].append(actions)
        out["history"].append(feats)
        out["seeds"].append(seed)
        out["mask"].append(np.arange(n) < avail)
        out["poses"].append(fut)
    m = len(out["actions"])
    if m == 0:
        return WindowSet(np.zeros((0, n, 3)), np.zeros((0, config.history_frames, 7)), np.zeros((0, 2, 3)),
                         np.zeros((0, n), bool), np.zeros((0, n, 3)), np.zeros(0, dtype="<U10"))
    return WindowSet(*(np.asarray(out[k]) for k in ("actions", "history", "seeds", "mask", "poses")),
                     source=np.full(m, source, dtype="<U10"))


# --------------------------------------------------------------------------------------------------
# CommonRoad sources
# --------------------------------------------------------------------------------------------------


def _read(path: Path):
    from commonroad.common.file_reader import CommonRoadFileReader  # optional heavy import

    scenario, _ = CommonRoadFileReader(str(path)).open()
    return scenario


def _smooth(values: np.ndarray, taps: int = 5) -> np.ndarray:
    """Centred moving average along axis 0 with edge padding (keeps the length)."""
    if len(values) < taps:
        return values
    pad = taps // 2
    padded = np.concatenate([np.repeat(values[:1], pad, 0), values, np.repeat(values[-1:], pad, 0)])
    kernel = np.ones(taps) / taps
    return np.column_stack([np.convolve(padded[:, j], kernel, mode="valid") for j in range(values.shape[1])])


def recorded_windows(paths: list[Path], config: DiffusionPriorConfig) -> WindowSet:
    """Windows of every recorded vehicle (box centre moved back to an estimated rear axle)."""
    ratio = VehicleParameters().rear_axle_to_center / VehicleParameters().length
    parts = []
    for path in tqdm(paths, desc="recorded vehicles", unit="scenario"):
        scenario = _read(path)
        for obs in scenario.dynamic_obstacles:
            if obs.prediction is None or not hasattr(obs.prediction, "trajectory"):
                continue
            states = [obs.initial_state] + list(obs.prediction.trajectory.state_list)
            arr = np.array([[s.time_step * scenario.dt, *s.position, s.orientation, s.velocity,
                             getattr(s, "acceleration", 0.0) or 0.0] for s in states])
            arr[:, 3] = np.unwrap(arr[:, 3])
            arr[:, 1:5] = _smooth(arr[:, 1:5])  # NGSIM positions and headings are noisy
            back = ratio * obs.obstacle_shape.length
            arr[:, 1] -= back * np.cos(arr[:, 3])
            arr[:, 2] -= back * np.sin(arr[:, 3])
            parts.append(track_windows(*arr.T, config=config, source="recorded"))
    return WindowSet.concat(parts)


def _lane_paths(scenario, rng: np.random.Generator, count: int, min_length: float = 150.0
                ) -> list[tuple[Polyline, Polyline | None, Polyline | None]]:
    """Random lane paths through the lanelet network (random successors), each with the paths of
    its same-direction left and right neighbours when the start lanelet has them."""
    net = scenario.lanelet_network
    lanelets = {ll.lanelet_id: ll for ll in net.lanelets}
    ids = list(lanelets)

    def chain(start: int) -> Polyline:
        pts = [lanelets[start].center_vertices]
        length = Polyline(pts[0]).length
        cur = start
        seen = {start}
        while length < min_length and lanelets[cur].successor:
            cur = int(rng.choice(lanelets[cur].successor))
            if cur in seen or cur not in lanelets:
                break
            seen.add(cur)
            pts.append(lanelets[cur].center_vertices)
            length += Polyline(pts[-1]).length
        return Polyline(np.vstack(pts))

    out = []
    for _ in range(count):
        start = int(rng.choice(ids))
        ll = lanelets[start]
        left = chain(ll.adj_left) if ll.adj_left in lanelets and ll.adj_left_same_direction else None
        right = chain(ll.adj_right) if ll.adj_right in lanelets and ll.adj_right_same_direction else None
        out.append((chain(start), left, right))
    return out


def _speed_profile(rng: np.random.Generator, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A smooth, jerk-limited speed profile over times ``t`` (now = 0) for one random manoeuvre."""
    mode = rng.choice(["accelerate", "cruise", "decelerate", "stop", "start"], p=[0.25, 0.25, 0.2, 0.15, 0.15])
    v0 = 0.0 if mode == "start" else rng.uniform(1.0, 28.0)
    past_a = rng.normal(0.0, 0.4)  # a gentle trend in the history
    a_cmd = np.full_like(t, past_a)
    t_start = rng.uniform(-0.5, 2.0)
    future = t >= t_start
    if mode in ("accelerate", "start"):
        a_cmd[future] = rng.uniform(0.5, 2.5)
        v_cap = rng.uniform(max(v0, 3.0) + 2.0, 32.0)
    elif mode == "cruise":
        a_cmd[future] = rng.normal(0.0, 0.2)
        v_cap = 40.0
    else:
        a_cmd[future] = -rng.uniform(0.5, 3.5) if mode == "decelerate" else -rng.uniform(1.0, 4.5)
        v_cap = 40.0
    if mode == "start":
        a_cmd[~future] = 0.0
    # First-order lag (~0.5 s) smooths the steps of the command into a jerk-limited acceleration.
    acc = np.empty_like(t)
    state = a_cmd[0]
    for k in range(len(t)):
        state += (a_cmd[k] - state) * STEP / 0.5
        acc[k] = state
    v = np.empty_like(t)
    i0 = int(np.argmin(np.abs(t)))
    v[i0] = v0
    for k in range(i0 + 1, len(t)):
        v[k] = v[k - 1] + acc[k - 1] * STEP
    for k in range(i0 - 1, -1, -1):
        v[k] = v[k + 1] - acc[k] * STEP
    floor = 0.0 if mode != "decelerate" else rng.uniform(0.0, v0 * 0.6)
    v = np.clip(v, floor if mode == "decelerate" else 0.0, v_cap)
    if mode == "start":
        v[~future] = 0.0
    acc = np.gradient(v, t)
    return v, acc


def synthetic_windows(paths: list[Path], per_scenario: int, config: DiffusionPriorConfig,
                      seed: int = 0) -> WindowSet:
    """Random manoeuvres on the lanelet networks of ``paths`` (one window each)."""
    rng = np.random.default_rng(seed)
    t = np.round(np.arange(-config.history_frames * config.waypoint_dt, config.horizon + 1e-9, STEP), 6)
    parts = []
    for path in tqdm(paths, desc="synthetic manoeuvres", unit="scenario"):
        scenario = _read(path)
        for centre, left, right in _lane_paths(scenario, rng, per_scenario):
            v, acc = _speed_profile(rng, t)
            s = np.concatenate([[0.0], np.cumsum((v[:-1] + v[1:]) / 2 * STEP)])
            s = s - s[int(np.argmin(np.abs(t)))] + rng.uniform(5.0, max(centre.length / 3, 6.0))
            # Lateral offsets are functions of arc length (a car at rest does not drift sideways).
            lateral = rng.normal(0.0, 0.15) + 0.1 * np.sin(2 * np.pi * s / rng.uniform(40, 150) + rng.uniform(0, 6))
            side = rng.choice(["keep", "left", "right"], p=[0.5, 0.25, 0.25])
            target = left if side == "left" else right if side == "right" else None
            if target is not None and v.min() > 3.0:
                mid = centre.interpolate(s[len(s) // 2])
                # Signed distance (left positive) from this lane's centreline to the target lane's.
                offset = -float(target.project(mid[:2]).lateral)
                if 2.0 < abs(offset) < 6.0:
                    t0, dur = rng.uniform(-1.0, 4.0), rng.uniform(3.0, 7.0)
                    u = np.clip((t - t0) / dur, 0.0, 1.0)
                    lateral = lateral + offset * (10 * u ** 3 - 15 * u ** 4 + 6 * u ** 5)
            base = centre.interpolate(s)
            normal = np.column_stack([-np.sin(base[:, 2]), np.cos(base[:, 2])])
            xy = base[:, :2] + lateral[:, None] * normal
            d = np.gradient(xy, axis=0)
            moving = np.hypot(d[:, 0], d[:, 1]) > 1e-3
            heading = np.where(moving, np.arctan2(d[:, 1], d[:, 0]), base[:, 2])
            now = int(np.argmin(np.abs(t)))
            parts.append(track_windows(t, xy[:, 0], xy[:, 1], heading, v, acc, config=config,
                                       source="synthetic", min_future=config.num_waypoints, anchors=[now]))
    return WindowSet.concat(parts)


def suite_windows(config: DiffusionPriorConfig, suite: str = "synthetic-train") -> WindowSet | None:
    """Windows of the expert ego trajectories of the bundled synthetic suite's *training* split
    (the hard and random splits are evaluation data and stay out). None, with a note, when the
    suite has not been generated (``luna-bridge generate-suite``)."""
    try:
        from luna_bridge.scenarios.registry import load_suite
        loaded = load_suite(suite)
    except (ImportError, KeyError, FileNotFoundError) as exc:
        tqdm.write(f"synthetic suite {suite!r} not used: {exc}")
        return None
    for failure in loaded.failures:
        tqdm.write(f"synthetic suite: could not load {failure.source}: {failure.error}")
    parts = []
    for sc in tqdm(loaded.scenarios, desc=f"suite {suite}", unit="scenario"):
        e = sc.expert
        ok = np.isfinite(e.x) & np.isfinite(e.y) & np.isfinite(e.heading)
        if ok.sum() < 2:
            continue
        h = np.unwrap(e.heading[ok])
        speed = e.vx[ok] * np.cos(h) + e.vy[ok] * np.sin(h)  # along the heading (rear axle)
        accel = np.gradient(speed, e.t[ok])
        parts.append(track_windows(e.t[ok], e.x[ok], e.y[ok], h, speed, accel, config=config, source="suite"))
    return WindowSet.concat(parts) if parts else None


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _save_checkpoint(path: Path, prior: TrajectoryDiffusionPrior, optimizer: torch.optim.Optimizer,
                     state: dict) -> None:
    """Model + AdamW moments as safetensors, the rest (step, losses, config) as JSON; atomic."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().contiguous() for k, v in prior.model.state_dict().items()}
    opt = optimizer.state_dict()
    for pid, st in opt["state"].items():
        for name, value in st.items():
            tensors[f"optim.{pid}.{name}"] = torch.as_tensor(value).contiguous()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "checkpoint.safetensors.tmp"))
    (path / "checkpoint.json.tmp").write_text(json.dumps({**state, "param_groups": opt["param_groups"],
                                                          "config": prior.config.to_dict()}))
    (path / "checkpoint.safetensors.tmp").replace(path / "checkpoint.safetensors")
    (path / "checkpoint.json.tmp").replace(path / "checkpoint.json")


def _load_checkpoint(path: Path, prior: TrajectoryDiffusionPrior, optimizer: torch.optim.Optimizer) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "checkpoint.safetensors"))
    meta = json.loads((path / "checkpoint.json").read_text())
    prior.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    opt_state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            opt_state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": meta.pop("param_groups")})
    return meta


def min_ade(prior: TrajectoryDiffusionPrior, data: WindowSet, samples: int, seed: int = 0) -> dict[str, float]:
    """minADE / minFDE over ``samples`` prior samples per window (on the unmasked waypoints) and the
    share of samples inside plausible dynamics (|Verlet action| within MAX_ACTION)."""
    g = torch.Generator().manual_seed(seed)
    ades, fdes, plausible = [], [], []
    for i in range(len(data.actions)):
        hist = prior.history_tensor(data.history[i])
        raw = prior.denormalise(prior.sample(hist, samples, g))
        poses = verlet_decode(raw, np.repeat(data.seeds[i][None], samples, 0))
        m = data.mask[i]
        err = np.hypot(poses[:, m, 0] - data.poses[i, m, 0], poses[:, m, 1] - data.poses[i, m, 1])
        ades.append(err.mean(axis=1).min())
        fdes.append(err[:, -1].min())
        plausible.append(np.mean(np.all(np.abs(raw) <= MAX_ACTION, axis=(1, 2))))
    return {"min_ade": float(np.mean(ades)), "min_fde": float(np.mean(fdes)),
            "plausible_share": float(np.mean(plausible)), "windows": len(ades), "samples": samples}


def _plot(curve: list[tuple[int, float, float | None]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [c[0] for c in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, [c[1] for c in curve], label="train (running mean)")
    val = [(c[0], c[2]) for c in curve if c[2] is not None]
    if val:
        ax.plot(*zip(*val), "o-", label="held out")
    ax.set_xlabel("step")
    ax.set_ylabel("epsilon MSE")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Diffusion-ES trajectory prior")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def build_dataset(commonroad_dir: Path, synthetic_per_scenario: int, config: DiffusionPriorConfig,
                  seed: int) -> tuple[WindowSet, dict[str, int]]:
    paths = sorted(commonroad_dir.glob("*.xml"))
    if not paths:
        raise FileNotFoundError(f"no CommonRoad scenarios (*.xml) in {commonroad_dir}; pass --commonroad-dir "
                                f"or set LUNA_COMMONROAD_DIR")
    parts = [recorded_windows(paths, config), synthetic_windows(paths, synthetic_per_scenario, config, seed)]
    suite = suite_windows(config)
    if suite is not None:
        parts.append(suite)
    data = WindowSet.concat(parts)
    counts = {str(k): int(v) for k, v in zip(*np.unique(data.source, return_counts=True))}
    return data, counts


def train(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(args.work_dir)
    out = Path(args.out)
    config = DiffusionPriorConfig(d_model=args.d_model, num_layers=args.layers, ff_dim=args.ff_dim)
    data, counts = build_dataset(Path(args.commonroad_dir), args.synthetic_per_scenario, config, args.seed)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(data.actions))
    n_val = max(int(0.05 * len(order)), 64)
    val, tr = data.take(order[:n_val]), data.take(order[n_val:])
    tr = WindowSet.concat([tr, tr.mirrored()])
    # Normalisation fitted on the training windows (masked waypoints excluded).
    config.action_scale = [float(v) for v in tr.actions[tr.mask].std(axis=0)]
    prior = TrajectoryDiffusionPrior(config)
    optimizer = torch.optim.AdamW(prior.model.parameters(), lr=args.lr, weight_decay=1e-4)
    meta = {"step": 0, "elapsed": 0.0, "curve": []}
    if (work / "checkpoint.json").is_file() and not args.restart:
        meta = _load_checkpoint(work, prior, optimizer)
        config = DiffusionPriorConfig.from_dict(meta.pop("config"))
        prior.config = config
        prior._scale = torch.tensor(config.action_scale)  # the scale the checkpoint was trained with
        tqdm.write(f"resuming from {work} at step {meta['step']}")
    x = prior.normalise(tr.actions)
    h = prior.history_tensor(tr.history)
    m = torch.as_tensor(tr.mask, dtype=torch.float32)
    xv, hv = prior.normalise(val.actions), prior.history_tensor(val.history)
    mv = torch.as_tensor(val.mask, dtype=torch.float32)
    g = torch.Generator().manual_seed(args.seed + meta["step"])
    budget = args.minutes * 60.0
    start = time.monotonic() - meta["elapsed"]
    running = None
    bar = tqdm(total=args.max_steps, initial=meta["step"], desc="train-diffusion", unit="step")
    last_save = time.monotonic()
    while meta["step"] < args.max_steps and time.monotonic() - start < budget:
        progress = min(max(meta["step"] / args.max_steps, (time.monotonic() - start) / budget), 1.0)
        for group in optimizer.param_groups:  # cosine decay over whichever budget ends first
            group["lr"] = args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        idx = torch.randint(0, len(x), (args.batch_size,), generator=g)
        prior.model.train()
        loss = prior.loss(x[idx], h[idx], g, m[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prior.model.parameters(), 1.0)
        optimizer.step()
        meta["step"] += 1
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        bar.update(1)
        bar.set_postfix(loss=f"{running:.4f}")
        if meta["step"] % 250 == 0:
            prior.model.eval()
            with torch.no_grad():
                vl = prior.loss(xv, hv, torch.Generator().manual_seed(1), mv).item()
            meta["curve"].append((meta["step"], running, vl))
            if time.monotonic() - last_save > 60.0:
                meta["elapsed"] = time.monotonic() - start
                _save_checkpoint(work, prior, optimizer, meta)
                last_save = time.monotonic()
        elif meta["step"] % 50 == 0:
            meta["curve"].append((meta["step"], running, None))
    bar.close()
    meta["elapsed"] = time.monotonic() - start
    _save_checkpoint(work, prior, optimizer, meta)
    prior.model.eval()
    with torch.no_grad():
        val_loss = prior.loss(xv, hv, torch.Generator().manual_seed(1), mv).item()
    recorded_val = val.take(np.flatnonzero(val.source == "recorded")[: args.eval_windows])
    synthetic_val = val.take(np.flatnonzero(val.source == "synthetic")[: args.eval_windows])
    metrics = {
        "steps": meta["step"], "train_minutes": round(meta["elapsed"] / 60.0, 2), "val_loss": val_loss,
        "train_windows": int(len(tr.actions)), "val_windows": int(len(val.actions)), "sources": counts,
        "parameters": prior.num_parameters(), "batch_size": args.batch_size, "lr": args.lr,
        "recorded_held_out": min_ade(prior, recorded_val, args.eval_samples),
        "synthetic_held_out": min_ade(prior, synthetic_val, args.eval_samples),
    }
    out.mkdir(parents=True, exist_ok=True)
    prior.save_pretrained(out)
    _plot(meta["curve"], out / "loss_curve.png")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "README.md").write_text(model_card(metrics, config, args))
    return metrics


def model_card(metrics: dict, config: DiffusionPriorConfig, args: argparse.Namespace) -> str:
    rec, syn = metrics["recorded_held_out"], metrics["synthetic_held_out"]
    return f"""# Diffusion-ES trajectory prior (`luna_core.planning.diffusion`)

A small denoising diffusion model over ego trajectories, the generative prior of the decision-guided
Diffusion-ES planner (LUNA-AD Eq. 21). Pure PyTorch, CPU-friendly; weights `model.safetensors`,
architecture and normalisation `config.json`.

## What it models
16 waypoints (x, y, heading) at {config.waypoint_dt} s over {config.horizon:.0f} s in the ego rear-axle frame,
as Verlet actions (second differences, seeded by the two latest history poses), normalised per channel
by their spread in the training data ({', '.join(f'{v:.4f}' for v in config.action_scale)} for x m,
y m, heading rad). Conditioned on the ego history only: {config.history_frames} frames at
{config.waypoint_dt} s x 7 features (x, y, cos, sin heading, speed, acceleration, yaw rate).
Transformer denoiser: 1 history token + {config.num_waypoints // config.waypoints_per_token} trajectory tokens,
width {config.d_model}, {config.num_layers} layers, {config.num_heads} heads, feed-forward {config.ff_dim};
{metrics['parameters']:,} parameters. Epsilon prediction, cosine schedule over {config.train_timesteps}
steps, DDIM (eta 0) with {config.inference_steps} trailing steps at inference.

## Data
Windows of 2 s history + 8 s future from {', '.join(f'{k}: {v}' for k, v in metrics['sources'].items())}
(before the left-right mirror augmentation of the training split):
- *recorded*: every vehicle in the CommonRoad NGSIM scenarios (`../shared/scenarios/commonroad`,
  US-101, Lankershim, Peachtree); these recordings are short, so waypoints past the end of a
  recording are masked out of the loss;
- *synthetic*: jerk-limited accelerate / cruise / decelerate / stop / start manoeuvres with quintic
  lane changes driven on those scenarios' real lanelet networks ({args.synthetic_per_scenario} per scenario).
Windows with implausible dynamics (|second difference| over 8 m/s^2 or 1 rad/s per 0.5 s) are dropped.
5 % of the windows are held out.

## Training
AdamW lr {args.lr} (cosine decay), batch {args.batch_size}, {metrics['steps']} steps in
{metrics['train_minutes']} min on 2 shared CPU cores (seed {args.seed}). Loss curve: `loss_curve.png`.

## Metrics (held-out windows, {rec['samples']} samples each)
| split | windows | minADE (m) | minFDE (m) | plausible samples |
|---|---|---|---|---|
| recorded (real NGSIM) | {rec['windows']} | {rec['min_ade']:.2f} | {rec['min_fde']:.2f} | {rec['plausible_share']:.1%} |
| synthetic manoeuvres | {syn['windows']} | {syn['min_ade']:.2f} | {syn['min_fde']:.2f} | {syn['plausible_share']:.1%} |

Held-out epsilon MSE: {metrics['val_loss']:.4f}. minFDE on recorded windows is at the end of the recorded part.

## Limits
Trained on little, mostly synthetic data: it is a smoothness and feasibility prior for Diffusion-ES
(which re-scores and mutates its samples), not a driving policy; it knows nothing about the map or
other agents.

## Rebuild
```
luna-offline train-diffusion --minutes {args.minutes} --max-steps {args.max_steps} \\
    --synthetic-per-scenario {args.synthetic_per_scenario} --seed {args.seed} \\
    --d-model {args.d_model} --layers {args.layers} --ff-dim {args.ff_dim} --batch-size {args.batch_size}
```
(reads `../shared/scenarios/commonroad` or `--commonroad-dir`; resumable from `--work-dir`).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-diffusion", help="train the Diffusion-ES trajectory prior",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    import os

    p.add_argument("--commonroad-dir", default=os.environ.get("LUNA_COMMONROAD_DIR", str(DEFAULT_COMMONROAD)))
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the weights and the model card")
    p.add_argument("--work-dir", default=str(REPO_ROOT / "out" / "train_diffusion"),
                   help="checkpoint folder (training resumes from it)")
    p.add_argument("--restart", action="store_true", help="ignore an existing checkpoint")
    p.add_argument("--minutes", type=float, default=13.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=12000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--synthetic-per-scenario", type=int, default=300)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=32)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on the shared 2-core machine)")
    p.add_argument("--seed", type=int, default=0)
    defaults = DiffusionPriorConfig()
    p.add_argument("--d-model", type=int, default=defaults.d_model, help="transformer width")
    p.add_argument("--layers", type=int, default=defaults.num_layers)
    p.add_argument("--ff-dim", type=int, default=defaults.ff_dim)
    p.set_defaults(func=lambda a: (print(json.dumps(train(a), indent=2)), 0)[1])
