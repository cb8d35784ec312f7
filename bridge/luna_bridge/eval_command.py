"""``luna-bridge eval``: closed-loop evaluation of planners on a scenario suite (see ``evaluate``).

Example::

    luna-bridge eval --suite synthetic-hard --planner pdm --mode reactive --workers 2
    luna-bridge eval --suite synthetic-random --planner idm --planner pdm --mode both --out results/random
    luna-bridge eval --suite synthetic-hard --every 10 --replan-every 5 --planner luna --planner luna-k0 \
        --planner luna-onehot --planner diffusion-es --population 32 --iterations 1
    luna-bridge eval --set standard --replan-every 5 --planner idm --planner pdm --planner pdm@10hz \
        --planner diffusion-es --planner luna-oracle --planner luna --mode both --workers 2
    luna-bridge eval --set standard --planner luna --executor ray --ray-address auto   # on a Ray cluster

The stack planners (``luna`` and its ablations ``luna-k0``, ``luna-onehot``, ``luna-no-reflection``;
see ``luna_bridge.stack_planner``) decide every T_d with the student and the memory bank in process;
they and ``diffusion-es`` run the decision-guided Diffusion-ES in deterministic mode unless
``--time-budget`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import sys
from pathlib import Path

from luna_bridge.baselines import eval_planner_names
from luna_bridge.evaluate import (EVALUATION_SETS, EXECUTORS, MODES, EvalConfig, EvaluationError, ray_session,
                                  run_evaluation, run_set)
from luna_bridge.stack_planner import StackConfigError, add_stack_arguments, stack_settings_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="closed-loop evaluation with nuPlan metrics",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--suite", help="synthetic-hard | synthetic-random | commonroad | a directory of scenario files")
    which.add_argument("--set", dest="eval_set", choices=sorted(EVALUATION_SETS),
                       help="a named evaluation set: standard = every 5th scenario of each synthetic split + all "
                            "27 CommonRoad files (the results tables' protocol); full = every scenario. Each suite "
                            "goes to <out>/<suite>")
    p.add_argument("--planner", action="append", default=None,
                   help=f"planner to evaluate (repeatable; the expert log-replay row is always added), optionally "
                        f"with its own replanning rate (pdm@10hz); registered: {', '.join(eval_planner_names())}")
    p.add_argument("--mode", choices=sorted(MODES), default="both",
                   help="non-reactive (log-replay agents), reactive (IDM agents) or both")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes (default 1); with --executor ray, the CPUs of the local Ray instance")
    p.add_argument("--executor", choices=EXECUTORS, default="process",
                   help="process: worker processes on this machine (default); ray: Ray tasks, on a local Ray "
                        "instance or on the cluster at --ray-address (same result files)")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster address (e.g. ray://head:10001 or auto); default: start a local instance")
    p.add_argument("--out", type=Path, default=None, help="output directory (default out/eval/<suite>, git-ignored)")
    p.add_argument("--render", action="store_true", help="also write a BEV PNG and GIF per run")
    p.add_argument("--expect-count", type=int, default=None,
                   help="refuse to run unless the suite has this many (with --set: the set's)")
    p.add_argument("--limit", type=int, default=None, help="only the first N scenarios (smoke runs)")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="only this scenario of the --suite (repeatable; with --every, a scenario of that subset)")
    p.add_argument("--every", type=int, default=1,
                   help="every N-th scenario of the sorted suite (an even subset over scenario types)")
    p.add_argument("--replan-every", type=int, default=1,
                   help="simulation steps (0.1 s) between planner calls; 1 = nuPlan's 10 Hz (default)")
    stack = p.add_argument_group("stack planners (luna, luna-k0, luna-onehot, luna-no-reflection, diffusion-es)")
    add_stack_arguments(stack)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.workers < 1:
        print("luna-bridge eval: --workers must be >= 1", file=sys.stderr)
        return 2
    if args.only and args.eval_set:
        print("luna-bridge eval: --only names scenarios of one --suite, not of a --set", file=sys.stderr)
        return 2
    out = args.out or Path("out/eval") / (args.eval_set or Path(args.suite).name)
    try:
        stack = stack_settings_from_args(args)
    except StackConfigError as exc:
        print(f"luna-bridge eval: {exc}", file=sys.stderr)
        return 2
    cfg = EvalConfig(suite=args.suite or "", planners=args.planner or ["pdm"], modes=MODES[args.mode],
                     workers=args.workers, out_dir=out, render=args.render, expect_count=args.expect_count,
                     limit=args.limit, every=args.every, only=tuple(args.only or ()),
                     replan_every=args.replan_every, stack=stack,
                     executor=args.executor, ray_address=args.ray_address)
    command = "luna-bridge " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        with ray_session(cfg) if args.executor == "ray" else contextlib.nullcontext():  # one Ray for every suite
            summaries = run_set(args.eval_set, cfg, command) if args.eval_set else {
                args.suite: run_evaluation(cfg, command)}
    except EvaluationError as exc:
        print(f"luna-bridge eval: {exc}", file=sys.stderr)
        return 2
    for summary in summaries.values():
        print((summary.out_dir / "summary.md").read_text(encoding="utf-8"))
    failed = sum(len(s.failures) for s in summaries.values())
    if failed:  # scored 0 and listed in the summaries; the runs themselves completed
        print(f"luna-bridge eval: {failed} run(s) failed to load or crashed (see summary.md)", file=sys.stderr)
    return 0
