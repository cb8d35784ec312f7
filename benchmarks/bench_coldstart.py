"""Cold start of the stack's processes before and after a change (issue 17: back within 2 T_d = 4 s).

Two source trees (``--before``: a checkout of the earlier commit; after: this checkout), measured
alternately (before, after, after, before, ...) so that both see the same machine load:

- import: ``python -X importtime -c "import <node module>"``, the cumulative time of the node module;
- start: wall time from spawning the process's own ``main`` (the topology's executable, with its
  parameter files, as ``luna up`` starts it) until its nodes are constructed and the managed ones
  configured and active, i.e. until the executor would start spinning (interpreter start included);
- ``--predict``: one ``DualHeadStudent.predict`` (full prefill, no prefix cache, ``--k`` examples) of
  the bundled student loaded with the adapter merged (the inference default) versus peft's LoRA
  modules, calls alternating in one process.

Medians of ``--rounds`` (the machine is shared: run it at a known load and say which).

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python benchmarks/bench_coldstart.py --before /tmp/before --rounds 3 [--only decision]
    .venv/bin/python benchmarks/bench_coldstart.py --predict --rounds 7 --k 0 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("ros_ws/src/luna_core", "ros_ws/src/luna_msgs_py", "ros_ws/src/luna_nodes", "ros_ws/src/luna_bags", "ros_ws/src/luna_bringup", "bridge", "offline")
#: The node executables (ros_ws/src/luna_nodes/setup.py) by the topology's executable name.
ENTRY = {"map_server": "luna_nodes.map_server:main", "scene_descriptor": "luna_nodes.scene_descriptor:main",
         "progress_monitor": "luna_nodes.progress_monitor:main", "planner": "luna_nodes.planner:main",
         "decision_stack": "luna_nodes.decision_stack:main",
         "reflection_client": "luna_nodes.reflection_client:main"}

# The process's main() as the executable runs it, with the executor's spin replaced by a READY line:
# everything before spinning (imports, parameters, node construction, configure/activate) is timed.
CHILD = """
import importlib, sys
import luna_nodes.base as base
class Ready(base.MultiThreadedExecutor):
    def spin(self):
        print("READY", flush=True)
base.MultiThreadedExecutor = Ready
module, name = sys.argv[1].split(":")
sys.exit(getattr(importlib.import_module(module), name)(sys.argv[2:]))
"""


@dataclass
class Samples:
    imports: dict[str, list[float]] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)


def tree_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(tree / s) for s in SOURCES)
    env.setdefault("ROS_DOMAIN_ID", "66")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def import_seconds(tree: Path, module: str) -> float:
    """Cumulative -X importtime of ``module`` (its own line, the last one naming it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], env=tree_env(tree),
                          capture_output=True, text=True, timeout=600, cwd=tree)
    if proc.returncode != 0:
        raise RuntimeError(f"importing {module} from {tree} failed:\n{proc.stderr[-3000:]}")
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return next(int(r[1]) for r in reversed(rows) if r[2].strip() == module) / 1e6


def start_seconds(tree: Path, process) -> float:
    """Spawn to READY of one topology process from ``tree`` (its own parameter files)."""
    from luna_bringup.topology import load_topology

    topology = load_topology(tree / "ros_ws/src/luna_bringup/config/topology.yaml")
    args = topology.ros_arguments(process, tree / "ros_ws/src/luna_bringup/config")
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty node cannot block on it
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, ENTRY[process.executable], process.executable,
                                 *args], env=tree_env(tree), stdout=subprocess.PIPE, stderr=log, text=True,
                                cwd=tree)
        for line in proc.stdout:
            if line.strip() == "READY":
                elapsed = time.perf_counter() - t0
                break
        else:
            proc.wait()
            log.seek(0)
            raise RuntimeError(f"{process.name} from {tree} exited before spinning:\n{log.read()[-3000:]}")
        proc.communicate(timeout=120)
    return elapsed


def measure(before: Path, after: Path, rounds: int, only: list[str] | None = None) -> dict[str, Samples]:
    from luna_bringup.topology import load_topology

    topology = load_topology(after / "ros_ws/src/luna_bringup/config/topology.yaml")
    processes = topology.select(only).processes if only else topology.processes
    out = {"before": Samples(), "after": Samples()}
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        if r % 2:
            order.reverse()
        for process in processes:
            module = ENTRY[process.executable].split(":")[0]
            for label, tree in order:
                out[label].imports.setdefault(process.name, []).append(import_seconds(tree, module))
                out[label].starts.setdefault(process.name, []).append(start_seconds(tree, process))
                print(f"round {r + 1} {process.name} {label}: import {out[label].imports[process.name][-1]:.2f} s, "
                      f"start {out[label].starts[process.name][-1]:.2f} s", flush=True)
    return out


def table(samples: dict[str, Samples], load: str) -> str:
    med = statistics.median
    n = len(next(iter(samples["after"].starts.values())))
    lines = ["| process | import before | import after | start before | start after |", "|---|---:|---:|---:|---:|"]
    for name in samples["after"].starts:
        b, a = samples["before"], samples["after"]
        lines.append(f"| {name} | {med(b.imports[name]):.2f} s | {med(a.imports[name]):.2f} s | "
                     f"{med(b.starts[name]):.2f} s | {med(a.starts[name]):.2f} s |")
    return "\n".join(lines) + f"\n\n(medians of {n} alternating rounds, load {load})"


def predict_ab(rounds: int, k: int, threads: int) -> str:
    """Merged versus peft ``predict`` on the bundled student, calls alternating."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_student import example, scene  # the prompts of the student-latency benchmark

    from luna_core.prompts import PromptManager
    from luna_core.scene import head_scene_values
    from luna_core.student import DualHeadStudent

    torch.set_num_threads(threads)
    prompts = PromptManager()
    students = {"merged": DualHeadStudent.from_pretrained(ROOT / "models/student", prompts, device="cpu"),
                "peft": DualHeadStudent.from_pretrained(ROOT / "models/student", prompts, device="cpu",
                                                         for_training=True)}
    for s in students.values():
        s.config.reuse_prefix_cache = False  # a full forward pass each call
    query, examples = prompts.decision_query(scene(0)), [example(prompts, i) for i in range(k)]
    vector = head_scene_values(scene(0))  # for a head that reads scene values beside h_i*
    times: dict[str, list[float]] = {k: [] for k in students}
    for r in range(rounds + 1):  # round 0 warms up
        for name in (list(students) if r % 2 else list(students)[::-1]):
            t0 = time.perf_counter()
            _, latency = students[name].predict(query, examples, scene_vector=vector)
            if r:
                times[name].append(time.perf_counter() - t0)
    tokens = latency.prompt_tokens
    return (f"predict, K = {k}, {tokens} prompt tokens, full prefill, {threads} thread(s): merged {statistics.median(times['merged']):.3f} s, "
            f"peft {statistics.median(times['peft']):.3f} s (medians of {rounds}; merged {times['merged']}, "
            f"peft {times['peft']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout of the earlier commit (source tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=0, help="--predict: retrieved examples in the prompt")
    ap.add_argument("--threads", type=int, default=1, help="--predict: torch threads")
    ap.add_argument("--only", nargs="+", help="only these processes (names as in topology.yaml)")
    ap.add_argument("--predict", action="store_true", help="instead: merged versus peft predict latency")
    args = ap.parse_args()
    if args.predict:
        print(predict_ab(args.rounds, args.k, args.threads))
        return 0
    if args.before is None:
        ap.error("--before is required (or --predict)")
    samples = measure(args.before.resolve(), ROOT, args.rounds, args.only)
    print(table(samples, f"{os.getloadavg()[0]:.1f} at the end"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
