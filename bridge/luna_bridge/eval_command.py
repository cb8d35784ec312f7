"""``luna-bridge eval``: closed-loop evaluation of planners on a scenario suite (see ``evaluate``).

Example::

    luna-bridge eval --suite synthetic-hard --planner pdm --mode reactive --workers 2
    luna-bridge eval --suite synthetic-random --planner idm --planner pdm --mode both --out results/random
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from luna_bridge.baselines import planner_names
from luna_bridge.evaluate import MODES, EvalConfig, EvaluationError, run_evaluation


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="closed-loop evaluation with nuPlan metrics",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True,
                   help="synthetic-hard | synthetic-random | commonroad | a directory of scenario files")
    p.add_argument("--planner", action="append", default=None,
                   help=f"planner to evaluate (repeatable; the expert log-replay row is always added); "
                        f"registered: {', '.join(planner_names())}")
    p.add_argument("--mode", choices=sorted(MODES), default="both",
                   help="non-reactive (log-replay agents), reactive (IDM agents) or both")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default out/eval/<suite>, git-ignored)")
    p.add_argument("--render", action="store_true", help="also write a BEV PNG and GIF per run")
    p.add_argument("--expect-count", type=int, default=None, help="refuse to run unless the suite has this many")
    p.add_argument("--limit", type=int, default=None, help="only the first N scenarios (smoke runs)")
    p.add_argument("--every", type=int, default=1,
                   help="every N-th scenario of the sorted suite (an even subset over scenario types)")
    p.add_argument("--replan-every", type=int, default=1,
                   help="simulation steps (0.1 s) between planner calls; 1 = nuPlan's 10 Hz (default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.workers < 1:
        print("luna-bridge eval: --workers must be >= 1", file=sys.stderr)
        return 2
    out = args.out or Path("out/eval") / Path(args.suite).name
    cfg = EvalConfig(suite=args.suite, planners=args.planner or ["pdm"], modes=MODES[args.mode],
                     workers=args.workers, out_dir=out, render=args.render, expect_count=args.expect_count,
                     limit=args.limit, every=args.every, replan_every=args.replan_every)
    command = "luna-bridge " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        summary = run_evaluation(cfg, command=command)
    except EvaluationError as exc:
        print(f"luna-bridge eval: {exc}", file=sys.stderr)
        return 2
    print((out / "summary.md").read_text(encoding="utf-8"))
    if summary.failures:  # scored 0 and listed in the summary; the run itself completed
        print(f"luna-bridge eval: {len(summary.failures)} run(s) failed to load or crashed (see summary.md)",
              file=sys.stderr)
    return 0
