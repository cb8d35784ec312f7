"""What the result-altering search settings would buy (issue 14): planner cycle times of the default
search against cheaper settings that change results, in one run, the variants alternating cycle by
cycle (same load). None of these is a default: whether one keeps the driving quality needs the
closed-loop table of the standard evaluation set (``luna-bridge eval --set standard``).

Scenes: the three-lane road and CommonRoad USA_Lanker-1_10_T-1 of ``bench_planner.py``, |C_t| = 3
(CK, CL, DK), deterministic full cycles. Per variant: p50 wall and CPU time, the denoiser's share of
the CPU, and in how many cycles it published the same action as the default.

    .venv/bin/python benchmarks/bench_planner_variants.py --cycles 5 --markdown /tmp/variants.md
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bench_planner import DECISIONS, commonroad_scene, pct, scene
from luna_core.assets import resolve
from luna_core.planning.decision_guided import DecisionGuidedConfig, DecisionGuidedPlanner
from luna_core.planning.diffusion import TrajectoryDiffusionPrior
from luna_core.planning.diffusion_es import DiffusionESConfig

# name -> (DDIM steps of the prior samples, DiffusionESConfig overrides, the denoiser's autocast dtype)
VARIANTS = {
    "default (10 DDIM steps, rounds of 5 + 1 steps, population 128)": (10, {}, "none"),
    "prior 5 DDIM steps, rounds of 2 + 1": (5, {"renoise_steps": (2, 1)}, "none"),
    "rounds of 3 + 1 steps": (10, {"renoise_steps": (3, 1)}, "none"),
    "1 renoise-denoise round": (10, {"iterations": 1}, "none"),
    "population 64": (10, {"population": 64}, "none"),
    "population 64, prior 5 steps, rounds of 2 + 1": (5, {"population": 64, "renoise_steps": (2, 1)}, "none"),
    "population 64, 1 renoise-denoise round": (10, {"population": 64, "iterations": 1}, "none"),
    "denoiser in bfloat16 autocast": (10, {}, "bfloat16"),
    "bfloat16 autocast, population 64": (10, {"population": 64}, "bfloat16"),
}


class Timed(TrajectoryDiffusionPrior):
    """The prior, counting the CPU seconds spent denoising."""

    cpu = 0.0

    def denoise(self, *args, **kwargs):
        c0 = time.process_time()
        try:
            return super().denoise(*args, **kwargs)
        finally:
            Timed.cpu += time.process_time() - c0


def planner(steps: int, overrides: dict, autocast: str) -> DecisionGuidedPlanner:
    base = TrajectoryDiffusionPrior.from_pretrained(resolve("", "diffusion_prior"))
    prior = Timed(replace(base.config, inference_steps=steps), base.model, autocast=autocast)
    search = replace(DiffusionESConfig(), **overrides)
    return DecisionGuidedPlanner(DecisionGuidedConfig(search=search, deterministic=True), prior=prior)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = [os.getloadavg()[0]]
    lines = []
    for label, pi in (("three-lane road", scene(DECISIONS[3])),
                      ("CommonRoad USA_Lanker-1_10_T-1, t = 0", commonroad_scene(DECISIONS[3]))):
        planners = {name: planner(*v) for name, v in VARIANTS.items()}
        stats = {name: {"wall": [], "cpu": [], "denoise": [], "actions": []} for name in planners}
        for k in tqdm(range(args.cycles + 1), desc=label.split(",")[0], unit="cycle", leave=False):
            for name, p in planners.items():
                Timed.cpu = 0.0
                t0, c0 = time.perf_counter(), time.process_time()
                res = p.plan_detailed(pi)
                if k:  # cycle 0 is the warm-up
                    stats[name]["wall"].append(time.perf_counter() - t0)
                    stats[name]["cpu"].append(time.process_time() - c0)
                    stats[name]["denoise"].append(Timed.cpu)
                    stats[name]["actions"].append(res.action)
        default = stats[next(iter(VARIANTS))]["actions"]
        lines += ["", f"{label} (|C_t| = 3: CK, CL, DK; {args.cycles} cycles per variant after one warm-up):", "",
                  "| search | p50 wall (ms) | p50 CPU (ms) | denoiser share of CPU | same action as the default |",
                  "|---|---:|---:|---:|---|"]
        for name, s in stats.items():
            share = float(np.sum(s["denoise"]) / np.sum(s["cpu"]))
            same = sum(a == b for a, b in zip(s["actions"], default))
            lines.append(f"| {name} | {pct(s['wall'], 50) * 1e3:.0f} | {pct(s['cpu'], 50) * 1e3:.0f} | "
                         f"{100 * share:.0f} % | {same} of {len(default)} |")
    load.append(os.getloadavg()[0])
    text = "\n".join([f"Command: `.venv/bin/python benchmarks/bench_planner_variants.py --cycles {args.cycles}` "
                      f"(torch {torch.__version__}, 1 thread; 1-minute load average {load[0]:.1f} at the start, "
                      f"{load[1]:.1f} at the end)."] + lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
