"""Fingerprints of the reactive traffic: for every scenario of the standard set, the expert driven by
log replay in reactive mode, and a SHA-256 over every object's pose and velocity at every step. Run it in
two worktrees and diff the outputs to see which scenarios a change to the simulator's agents touches
(docs/benchmarks.md, "Session 19"):

    .venv/bin/python benchmarks/reactive_traffic_fingerprints.py > after.txt
    diff before.txt after.txt

One line per scenario: suite, name, the first 16 hex digits. The ego replays its log, so a difference is
the agents' own (their paths, IDM, leaders), not a planner's. About 1 min of one core.
"""
from __future__ import annotations

import argparse
import hashlib

import numpy as np
from tqdm import tqdm

from luna_bridge.evaluate import EVALUATION_SETS
from luna_bridge.scenarios.registry import load_entry, suite_refs
from luna_bridge.sim import LogReplayPlanner, simulate

def fingerprint(log) -> str:
    h = hashlib.sha256()
    for frame in log.objects:
        for o in frame.objects:
            h.update(o.id.encode())
            h.update(np.array([o.x, o.y, o.heading, o.vx, o.vy], dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    refs = [(suite, ref) for suite, every, _ in EVALUATION_SETS["standard"] for ref in suite_refs(suite)[::every]]
    for suite, (name, source, loader) in tqdm(refs, desc="scenarios", unit="scn"):
        scenario = load_entry(source, loader)
        print(suite, name, fingerprint(simulate(scenario, LogReplayPlanner(scenario), reactive=True)), flush=True)


if __name__ == "__main__":
    main()
