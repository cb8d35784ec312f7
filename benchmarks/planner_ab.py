"""Planner cycles of this checkout against a git revision, in one run (issue 14).

The revision's ``luna_core`` and ``luna_bridge`` are exported with ``git archive`` to a temporary
folder and run in a worker process (this script with ``--serve``, the export first on its
``PYTHONPATH``; the same bundled diffusion prior). Both sides run full, deterministic cycles of the
decision-guided planner (|C_t| = 3: CK, CL, DK; population 128, 2 rounds) on the scenes of
``bench_planner.py`` (three-lane road, synthetic junction, CommonRoad USA_Lanker-1_10_T-1), one
cycle each in turn, the order alternating, so that load hits both alike. Reported: p50 wall and CPU
time per cycle of each side, and whether the two published the same action and a bit-identical
trajectory in every cycle (two planners called in lockstep draw the same random streams). With
``--breakdown``, where one profiled cycle's time goes on each side (road and CommonRoad). With
``--eval "ARGS"``, also ``luna-bridge eval ARGS`` in closed loop with each side's code (the revision
first, then this checkout, one process each): per run, the CPU seconds against the simulated
seconds (the runs' ``timings/``), and whether the two result files are byte-identical.

    .venv/bin/python benchmarks/planner_ab.py --against c8e939b --cycles 5 --breakdown --markdown /tmp/ab.md
    .venv/bin/python benchmarks/planner_ab.py --against main --cycles 0 \
        --eval "--suite synthetic-hard --every 7 --planner luna --replan-every 5 --mode non-reactive"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bench_planner import DECISIONS, PARTS, breakdown, commonroad_scene, pct, scene
from luna_core.planning.decision_guided import DecisionGuidedConfig, DecisionGuidedPlanner, PlanResult

ROOT = Path(__file__).resolve().parents[1]
SCENES = {"road": "three-lane road", "junction": "synthetic junction hard_starting_left_turn_00, t = 0",
          "lanker": "CommonRoad USA_Lanker-1_10_T-1, t = 0"}
FIELDS = ("t", "x", "y", "heading", "velocity", "acceleration")
REPLY = "@@"  # prefix of the worker's reply lines (anything else on its stdout is passed through)


def planner_input(key: str):
    if key == "road":
        return scene(DECISIONS[3])
    if key == "junction":
        return commonroad_scene(DECISIONS[3], "hard_starting_left_turn_00", "synthetic-hard")
    return commonroad_scene(DECISIONS[3])


def config(population: int) -> DecisionGuidedConfig:
    base = DecisionGuidedConfig()
    return DecisionGuidedConfig(search=type(base.search)(population=population), deterministic=True)


class Side:
    """One code version: planners per scene, timed cycles."""

    def __init__(self, population: int) -> None:
        self.population = population
        self.planners: dict[str, tuple[DecisionGuidedPlanner, object]] = {}

    def cycle(self, key: str) -> dict:
        if key not in self.planners:
            self.planners[key] = (DecisionGuidedPlanner(config(self.population)), planner_input(key))
        planner, pi = self.planners[key]
        t0, c0 = time.perf_counter(), time.process_time()
        res: PlanResult = planner.plan_detailed(pi)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"wall": wall, "cpu": cpu, "action": res.action,
                "trajectory": {f: np.asarray(getattr(res.trajectory, f)).tolist() for f in FIELDS}}

    def breakdown(self, key: str) -> dict:
        median, shares = breakdown(DecisionGuidedPlanner(config(self.population)), planner_input(key))
        return {"median": median, "shares": shares}


def serve(population: int) -> int:
    """Worker: one JSON request per stdin line, one reply line per request on stdout."""
    import luna_core

    side = Side(population)
    print(REPLY + json.dumps({"luna_core": luna_core.__file__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        reply = side.cycle(req["scene"]) if req["op"] == "cycle" else side.breakdown(req["scene"])
        print(REPLY + json.dumps(reply), flush=True)
    return 0


def closed_loop(args: str, tree: Path | None, out: Path) -> None:
    """``luna-bridge eval ARGS --out OUT`` with the code of the exported ``tree`` (None: this checkout)."""
    from luna_bridge.scenarios import commonroad_dir
    from luna_core.assets import models_dir

    env = dict(os.environ, LUNA_MODELS_DIR=str(models_dir()), LUNA_COMMONROAD_DIR=str(commonroad_dir()))
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([f"{tree}/ros_ws/src/luna_core", f"{tree}/bridge"])
    subprocess.run([sys.executable, "-m", "luna_bridge.cli", "eval", *shlex.split(args), "--out", str(out)],
                   check=True, env=env, cwd=tree or ROOT, stdout=subprocess.DEVNULL)


def closed_loop_lines(args: str, rev: str, tree: Path, scratch: Path) -> list[str]:
    runs = {}
    for side, code in (("rev", tree), ("here", None)):
        closed_loop(args, code, scratch / side)
        for f in sorted((scratch / side / "scenarios").rglob("*.json")):
            key = f.relative_to(scratch / side / "scenarios")
            timing = json.loads((scratch / side / "timings" / key).read_text())
            data = f.read_bytes()
            if code is not None:  # a bundled suite's files lie in each side's tree: same `source` path
                data = data.replace(str(code).encode(), str(ROOT).encode())
            runs.setdefault(key, {})[side] = (data, timing)
    lines = ["", f"Closed loop, `luna-bridge eval {args}` with each side's code ({rev} first, then this "
             "checkout; CPU seconds of each run against its simulated seconds, from the runs' `timings/`; the "
             "files compared with the export's folder replaced by this checkout's in the scenario paths):", "",
             f"| run | simulated (s) | CPU {rev} (s) | CPU this (s) | CPU / simulated, this | result file "
             "byte-identical |", "|---|---:|---:|---:|---:|---|"]
    total = {"sim": 0.0, "rev": 0.0, "here": 0.0}
    for key, side in runs.items():
        (a, ta), (b, tb) = side["rev"], side["here"]
        sim = tb["simulated_s"]
        total["sim"] += sim
        total["rev"] += ta["cpu_s"]
        total["here"] += tb["cpu_s"]
        lines.append(f"| {key.with_suffix('')} | {sim:.1f} | {ta['cpu_s']:.1f} | {tb['cpu_s']:.1f} | "
                     f"{tb['cpu_s'] / max(sim, 1e-9):.2f} | {'yes' if a == b else 'NO'} |")
    lines.append(f"| all {len(runs)} runs | {total['sim']:.1f} | {total['rev']:.1f} | {total['here']:.1f} | "
                 f"{total['here'] / max(total['sim'], 1e-9):.2f} | "
                 f"{'all' if all(s['rev'][0] == s['here'][0] for s in runs.values()) else 'NOT all'} |")
    return lines


class Worker:
    """The revision's side, in a subprocess on its exported code."""

    def __init__(self, rev: str, population: int, threads: int) -> None:
        from luna_bridge.scenarios import commonroad_dir
        from luna_core.assets import models_dir

        self.tmp = tempfile.TemporaryDirectory(prefix="luna-ab-")
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "ros_ws/src/luna_core", "bridge"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", self.tmp.name], input=archive, check=True)
        env = dict(os.environ, LUNA_MODELS_DIR=str(models_dir()), LUNA_COMMONROAD_DIR=str(commonroad_dir()),
                   PYTHONPATH=os.pathsep.join([f"{self.tmp.name}/ros_ws/src/luna_core", f"{self.tmp.name}/bridge",
                                               str(ROOT / "benchmarks")]))
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--population", str(population),
                                      "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=self.tmp.name)
        self.hello = self._reply()

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
            sys.stdout.write(line)
        raise RuntimeError(f"the worker for the other revision exited (code {self.proc.wait()})")

    def ask(self, op: str, key: str) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, "scene": key}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self.tmp.cleanup()


def same(a: dict, b: dict) -> tuple[bool, float]:
    """(same action and bit-identical trajectory, max abs difference of the trajectory fields)."""
    diff = max(float(np.max(np.abs(np.subtract(a["trajectory"][f], b["trajectory"][f])))) for f in FIELDS)
    equal = a["action"] == b["action"] and all(a["trajectory"][f] == b["trajectory"][f] for f in FIELDS)
    return equal, diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="git revision to compare with (default HEAD)")
    ap.add_argument("--cycles", type=int, default=5,
                    help="timed cycles per side and scene (after one warm-up); 0: no cycle comparison")
    ap.add_argument("--scenes", default="road,junction,lanker", help=f"comma-separated, of {', '.join(SCENES)}")
    ap.add_argument("--population", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on each side")
    ap.add_argument("--breakdown", action="store_true", help="profile one cycle per side (road, CommonRoad)")
    ap.add_argument("--eval", action="append", default=[], metavar="ARGS",
                    help="also run `luna-bridge eval ARGS` in closed loop with each side's code (repeatable)")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.serve:
        return serve(args.population)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.against], check=True,
                         capture_output=True, text=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], check=True,
                          capture_output=True, text=True).stdout.strip()
    load = [os.getloadavg()[0]]
    worker = Worker(args.against, args.population, args.threads)
    local = Side(args.population)
    rows = []
    try:
        for key in [k for k in args.scenes.split(",") if k] if args.cycles > 0 else []:
            times: dict[str, list[tuple[float, float]]] = {"rev": [], "here": []}
            identical, max_diff = True, 0.0
            for k in tqdm(range(args.cycles + 1), desc=key, unit="cycle", leave=False):
                order = ("rev", "here") if k % 2 == 0 else ("here", "rev")
                out = {}
                for which in order:
                    out[which] = worker.ask("cycle", key) if which == "rev" else local.cycle(key)
                    if k:  # cycle 0 is the warm-up
                        times[which].append((out[which]["wall"], out[which]["cpu"]))
                eq, diff = same(out["rev"], out["here"])
                identical &= eq
                max_diff = max(max_diff, diff)
            rows.append((key, times, identical, max_diff))
        shares = {}
        if args.breakdown:
            for key in ("road", "lanker"):
                shares[key] = (worker.ask("breakdown", key), local.breakdown(key))
        loop = [line for k, a in enumerate(args.eval)
                for line in closed_loop_lines(a, rev, Path(worker.tmp.name), Path(worker.tmp.name) / f"eval{k}")]
    finally:
        worker.close()
    load.append(os.getloadavg()[0])
    lines = [f"Command: `.venv/bin/python benchmarks/planner_ab.py --against {args.against} --cycles {args.cycles}"
             f"{' --scenes ' + args.scenes if args.scenes != 'road,junction,lanker' else ''}"
             f"{' --breakdown' if args.breakdown else ''}"
             f"{''.join(' --eval ' + shlex.quote(a) for a in args.eval)}` (this checkout: {here}; the other side: "
             f"{rev}, luna_core from {worker.hello['luna_core']}). 1-minute load average {load[0]:.1f} at the start, "
             f"{load[1]:.1f} at the end; torch {torch.__version__}, {args.threads} thread(s) per side."]
    if rows:
        lines += ["", f"| scene | p50 {rev} (ms) | p50 this (ms) | change | CPU p50 {rev} (ms) | CPU p50 this (ms) | "
                  "same action and bit-identical trajectory every cycle |", "|---|---:|---:|---:|---:|---:|---|"]
    for key, times, identical, max_diff in rows:
        w = {s: pct([t[0] for t in times[s]], 50) for s in times}
        c = {s: pct([t[1] for t in times[s]], 50) for s in times}
        lines.append(f"| {SCENES[key]} | {w['rev'] * 1e3:.0f} | {w['here'] * 1e3:.0f} | "
                     f"{100 * (w['here'] / w['rev'] - 1):+.0f} % | {c['rev'] * 1e3:.0f} | {c['here'] * 1e3:.0f} | "
                     + ("yes" if identical else f"NO (max abs difference {max_diff:.3g})") + " |")
    if shares:
        lines += ["", f"Where one full cycle goes ({rev} vs this; shares of one cycle profiled with cProfile, which "
                  "inflates the Python-heavy parts; cumulative, so indented rows are parts of the row above):", "",
                  "| part | road, " + rev + " | road, this | CommonRoad, " + rev + " | CommonRoad, this |",
                  "|---|---:|---:|---:|---:|",
                  "| full cycle, unprofiled median of 3 (ms) | " + " | ".join(
                      f"{side['median'] * 1e3:.0f}" for key in ("road", "lanker") for side in shares[key]) + " |"]
        for label, _, _ in PARTS:
            lines.append(f"| {label} | " + " | ".join(f"{100 * side['shares'][label]:.0f} %"
                                                     for key in ("road", "lanker") for side in shares[key]) + " |")
    text = "\n".join(lines + loop)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
