"""Benchmark of the SAT collision checker (issue 6): Algorithm 1 over (N_obj, T) windows.

Times ``luna_core.geometry.colliding_objects`` on the torch backend (tensors on the device: CUDA when
present, else CPU) against (a) a Python loop over objects and time steps calling shapely
``Polygon.intersects``, (b) the same checker on the NumPy backend (the default for NumPy input on a
machine without GPU), and (c) Algorithm 1 transcribed literally in torch (8 edge normals,
8 x 8 corner projections) to show what the closed-form oriented-box test gains. Also times the
planner's form ``proposals_vs_objects`` at Diffusion-ES scale. Reports medians of repeated calls in
one run, as a Markdown table (stdout, or ``--markdown FILE``) and a PNG plot.

    .venv/bin/python benchmarks/bench_sat.py --threads 1 --markdown /tmp/sat.md \
        --plot docs/figures/bench_sat.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import numpy as np
import shapely
import torch
from tqdm import tqdm

from luna_core.geometry import colliding_objects, default_device, proposals_vs_objects
from luna_core.types import box_corners

N_OBJ = (16, 64, 256, 1024)
STEPS = (10, 20, 40)


def scene(rng: np.random.Generator, n_obj: int, steps: int) -> np.ndarray:
    """Box trajectories (n_obj, steps, 4, 2) at 0.1 s: the ego at index 0, traffic within 60 m."""
    t = np.arange(steps) * 0.1
    x0 = rng.uniform(-60, 60, (n_obj, 1))
    y0 = rng.uniform(-60, 60, (n_obj, 1))
    x0[0], y0[0] = 0.0, 0.0
    h = rng.uniform(-np.pi, np.pi, (n_obj, 1))
    v = rng.uniform(0, 15, (n_obj, 1))
    x = x0 + v * np.cos(h) * t
    y = y0 + v * np.sin(h) * t
    return box_corners(x, y, h * np.ones_like(t), rng.uniform(3.5, 5.5, (n_obj, 1)),
                       rng.uniform(1.7, 2.2, (n_obj, 1)))


def shapely_loop(boxes: np.ndarray) -> list[int]:
    """The reference: one shapely intersects call per (object, time step)."""
    hits = []
    for i in range(1, boxes.shape[0]):
        for k in range(boxes.shape[1]):
            if shapely.Polygon(boxes[0, k]).intersects(shapely.Polygon(boxes[i, k])):
                hits.append(i)
                break
    return hits


def algorithm1_literal(boxes: torch.Tensor) -> torch.Tensor:
    """LUNA-AD Algorithm 1 as printed (edge normals of both boxes, einsum projections)."""
    n, steps = boxes.shape[:2]
    v0 = boxes[0].expand(n - 1, steps, 4, 2).reshape(-1, 4, 2)
    v = boxes[1:].reshape(-1, 4, 2)
    d0 = torch.roll(v0, -1, 1) - v0
    d = torch.roll(v, -1, 1) - v
    normals = torch.cat([torch.stack([-d0[..., 1], d0[..., 0]], -1),
                         torch.stack([-d[..., 1], d[..., 0]], -1)], 1)
    p0 = torch.einsum("bvk,bak->bav", v0, normals)
    p = torch.einsum("bvk,bak->bav", v, normals)
    sep = (p0.amax(2) < p.amin(2)) | (p.amax(2) < p0.amin(2))
    hit = (~sep.any(1)).reshape(n - 1, steps).any(1)
    return torch.nonzero(hit)[:, 0] + 1


def median_time(fn: Callable[[], object], min_repeats: int, budget_s: float) -> float:
    """Median wall time of ``fn`` over at least ``min_repeats`` calls (more while within budget)."""
    fn()  # warm-up (allocations, lazy init)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="write the tables to this file as well")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared CPU more threads only add waiting)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = default_device()
    rng = np.random.default_rng(0)
    rows = []
    for n_obj in tqdm(N_OBJ, desc="N_obj"):
        for steps in STEPS:
            boxes = scene(rng, n_obj, steps)
            on_device = torch.from_numpy(boxes).to(device)
            expected = shapely_loop(boxes)
            # Every implementation must agree before it is timed.
            assert colliding_objects(boxes).tolist() == expected
            assert colliding_objects(boxes, backend="numpy").tolist() == expected
            assert algorithm1_literal(on_device.float()).cpu().tolist() == expected
            t_torch = median_time(lambda: colliding_objects(on_device), 20, 0.5)
            t_np = median_time(lambda: colliding_objects(boxes, backend="numpy"), 20, 0.5)
            t_lit = median_time(lambda: algorithm1_literal(on_device.float()), 20, 0.5)
            t_shp = median_time(lambda: shapely_loop(boxes), 3, 1.0)
            rows.append((n_obj, steps, len(expected), t_torch, t_np, t_lit, t_shp))

    load = os.getloadavg()[0]
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    lines = [f"Device: `{device}`{gpu}, torch {torch.__version__}, {args.threads} torch thread(s). Medians of "
             f"repeated calls in one run on {os.cpu_count()} CPU cores (1-min load average "
             f"{load:.1f} at the end of the run).",
             "",
             "| N_obj | T | colliding | torch checker ms | NumPy checker ms | Algorithm 1 literal (torch) ms | "
             "shapely loop ms | shapely / torch | shapely / NumPy | NumPy / torch | literal / torch |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n_obj, steps, hits, t_torch, t_np, t_lit, t_shp in rows:
        lines.append(f"| {n_obj} | {steps} | {hits} | {t_torch * 1e3:.3f} | {t_np * 1e3:.3f} | "
                     f"{t_lit * 1e3:.3f} | {t_shp * 1e3:.1f} | {t_shp / t_torch:.0f}x | {t_shp / t_np:.0f}x | "
                     f"{t_np / t_torch:.2f}x | {t_lit / t_torch:.2f}x |")

    # The planner's form at Diffusion-ES scale: population 128, 40 steps.
    lines += ["", "Planner form `proposals_vs_objects` (P proposals x N objects x T = 40 steps):", "",
              "| P | N | T | torch (tensors on device) ms | NumPy ms |",
              "|---:|---:|---:|---:|---:|"]
    for p, n in tqdm([(128, 16), (128, 64), (128, 256)], desc="proposals"):
        props = scene(rng, p, 40)
        objs = scene(rng, n, 40)
        tp, to = torch.from_numpy(props).float().to(device), torch.from_numpy(objs).float().to(device)
        t_torch = median_time(lambda: proposals_vs_objects(tp, to), 10, 0.5)
        t_np = median_time(lambda: proposals_vs_objects(props, objs, backend="numpy"), 10, 0.5)
        lines.append(f"| {p} | {n} | 40 | {t_torch * 1e3:.2f} | {t_np * 1e3:.2f} |")

    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.plot:
        plot(rows, args.plot, str(device))


def plot(rows: list[tuple], path: str, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STEPS), figsize=(4 * len(STEPS), 3.6), sharey=True)
    labels = ("torch checker", "NumPy checker", "Algorithm 1 literal (torch)", "shapely loop")
    for ax, steps in zip(axes, STEPS):
        sub = [r for r in rows if r[1] == steps]
        for j, label in enumerate(labels):
            ax.loglog([r[0] for r in sub], [r[3 + j] * 1e3 for r in sub], marker="o", label=label)
        ax.set_title(f"T = {steps}")
        ax.set_xlabel("N_obj")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time per check (ms)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"SAT collision checker (Algorithm 1) on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
