"""Throughput of the batched LQR + kinematic bicycle (the scorer's proposal simulation) and of one
closed-loop log-replay run. Usage: python benchmarks/bench_control.py [--repeats 20]"""

from __future__ import annotations

import argparse
import time

import numpy as np

from luna_core.control import simulate_proposals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    state = np.zeros(8)
    state[3] = 8.0
    print("| proposals x steps | median ms | per proposal-step us |")
    print("|---|---|---|")
    for batch in (15, 128):
        t = np.arange(41) * 0.1
        curv = rng.uniform(-0.05, 0.05, size=(batch, 1))
        heading = curv * 8.0 * t[None]
        x = np.cumsum(8.0 * 0.1 * np.cos(heading), axis=1)
        y = np.cumsum(8.0 * 0.1 * np.sin(heading), axis=1)
        props = np.stack([x, y, heading], axis=-1)
        simulate_proposals(state, props)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            simulate_proposals(state, props)
            times.append(time.perf_counter() - start)
        med = float(np.median(times))
        print(f"| {batch} x 40 | {med * 1e3:.1f} | {med / (batch * 40) * 1e6:.1f} |")

    from luna_bridge.scenarios.registry import load_entry, suite_refs
    from luna_bridge.sim import LogReplayPlanner, simulate

    name, source, loader = suite_refs("synthetic-hard")[0]
    sc = load_entry(source, loader)
    for reactive in (False, True):
        start = time.perf_counter()
        simulate(sc, LogReplayPlanner(sc), reactive=reactive)
        print(f"log replay of {name} ({sc.num_steps} steps, {len(sc.agents)} agents, "
              f"{'reactive' if reactive else 'non-reactive'}): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
