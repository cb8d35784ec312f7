"""``luna-bridge generate-suite`` and ``luna-bridge scenarios {list,check,plot}``."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from luna_bridge.scenarios.registry import DATA_DIR, SUITES, load_entry, suite_refs

DEFAULT_COUNTS = {"hard": 10, "random": 10, "train": 6, "reflect": 10}
BUNDLED_SPLITS = ("hard", "random", "train")  # what the default generate-suite writes into the package
REAL_ROADS_FOLDER = "train_real"  # training scenarios on real road layouts (``scenarios.real_roads``)


def _generate_one(job: tuple[str, str, int, str]) -> tuple[str, str]:
    """One scenario: a synthetic type of a split, or (split ``REAL_ROADS_FOLDER``) a real road layout."""
    from luna_bridge.scenarios import real_roads, synthetic
    from luna_bridge.scenarios.format import save_scenario

    kind, split, index, out = job
    try:
        if split == REAL_ROADS_FOLDER:
            scenario = real_roads.generate(kind, index)
        else:
            scenario = synthetic.generate(kind, split, index)
    except Exception as exc:  # noqa: BLE001 - reported in the summary
        return f"{split}/{kind}/{index}", f"{type(exc).__name__}: {exc}"
    path = save_scenario(scenario, Path(out) / split / f"{scenario.name}.json.gz")
    return str(path), ""


def generate_suite(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from luna_bridge.scenarios.synthetic import SCENARIO_TYPES

    counts = dict(DEFAULT_COUNTS)
    if args.per_type is not None:
        counts.update({"hard": args.per_type, "random": args.per_type})
    if args.train_per_type is not None:
        counts["train"] = args.train_per_type
    if args.reflect_per_type is not None:
        counts["reflect"] = args.reflect_per_type
    types = args.types or list(SCENARIO_TYPES)
    jobs = [(t, split, i, str(args.out)) for split in args.splits for t in types for i in range(counts[split])]
    if args.real_roads:
        from luna_bridge.scenarios.real_roads import LAYOUTS, map_path

        map_path(LAYOUTS[0])  # a missing wheel is said once, before any job starts
        jobs += [(layout.name, REAL_ROADS_FOLDER, i, str(args.out)) for layout in LAYOUTS for i in range(args.real_roads)]
    failures = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for path, error in tqdm(pool.map(_generate_one, jobs), total=len(jobs), desc="generate-suite", unit="scn"):
            if error:
                failures.append((path, error))
    print(f"{len(jobs) - len(failures)} of {len(jobs)} scenarios written under {args.out}")
    for path, error in failures:
        print(f"FAILED {path}: {error}", file=sys.stderr)
    return 1 if failures else 0


def _load_all(suite: str):
    from tqdm import tqdm

    refs = suite_refs(suite)
    for name, source, loader in tqdm(refs, desc=f"load {suite}", unit="scn", disable=len(refs) < 20):
        try:
            yield name, load_entry(source, loader), ""
        except Exception as exc:  # noqa: BLE001 - reported
            yield name, None, f"{type(exc).__name__}: {exc}"


def list_scenarios(args: argparse.Namespace) -> int:
    print(f"| {'name':58s} | {'type':55s} | agents | lanes | expert m |")
    print(f"|{'-' * 60}|{'-' * 57}|--------|-------|----------|")
    failed = 0
    for name, sc, error in _load_all(args.suite):
        if sc is None:
            failed += 1
            print(f"| {name:58s} | LOAD FAILED: {error}")
            continue
        import numpy as np

        ok = np.isfinite(sc.expert.x) & (sc.expert.t >= 0)
        dist = float(np.sum(np.hypot(np.diff(sc.expert.x[ok]), np.diff(sc.expert.y[ok]))))
        print(f"| {name:58s} | {sc.scenario_type:55s} | {len(sc.agents):6d} | {len(sc.lane_graph.lanes):5d} | "
              f"{dist:8.1f} |")
    return 1 if failed else 0


def check_scenarios(args: argparse.Namespace) -> int:
    """Load every scenario and replay its expert: it must neither collide nor leave the road."""
    from luna_bridge.scenarios.synthetic import check_log_replay

    bad = 0
    for name, sc, error in _load_all(args.suite):
        problem = error or check_log_replay(sc)
        if problem:
            bad += 1
            print(f"{name}: {problem}")
    print(f"{bad} problem(s)")
    return 1 if bad else 0


def plot_scenario(args: argparse.Namespace) -> int:
    from luna_bridge.scenarios.plot import plot_scenario_file

    refs = {name: (source, loader) for name, source, loader in suite_refs(args.suite)}
    if args.name not in refs:
        print(f"no scenario {args.name!r} in suite {args.suite!r}", file=sys.stderr)
        return 2
    scenario = load_entry(*refs[args.name])
    out = plot_scenario_file(scenario, Path(args.out or f"{args.name}.png"), replay=args.replay)
    print(out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate-suite", help="generate the bundled synthetic scenario suite (fixed seeds)")
    g.add_argument("--splits", nargs="*", default=list(BUNDLED_SPLITS), choices=list(DEFAULT_COUNTS),
                   help="synthetic splits (none: only --real-roads)")
    g.add_argument("--types", nargs="+", default=None, help="scenario types (default: all 14)")
    g.add_argument("--per-type", type=int, default=None, help="scenarios per type for hard and random (10)")
    g.add_argument("--train-per-type", type=int, default=None,
                   help="scenarios per type for train (6 bundled; the distillation suite uses 50, see docs/student.md)")
    g.add_argument("--reflect-per-type", type=int, default=None,
                   help="scenarios per type for the reflection split (10; generated on demand, never bundled)")
    g.add_argument("--real-roads", type=int, default=0, metavar="N",
                   help=f"also N training scenarios per real road layout into <out>/{REAL_ROADS_FOLDER} "
                        "(synthetic traffic on the maps of the commonroad-dataset-converter wheel; docs/scenarios.md)")
    g.add_argument("--out", type=Path, default=DATA_DIR)
    g.add_argument("--workers", type=int, default=2)
    g.set_defaults(func=generate_suite)

    s = sub.add_parser("scenarios", help="inspect scenario suites")
    ssub = s.add_subparsers(dest="scenarios_cmd", required=True)
    for cmd, func, doc in (("list", list_scenarios, "table of the scenarios of a suite"),
                           ("check", check_scenarios, "load and replay every expert (collision, drivable area)")):
        p = ssub.add_parser(cmd, help=doc)
        p.add_argument("--suite", required=True, help=f"{', '.join(SUITES)} or a directory")
        p.set_defaults(func=func)
    p = ssub.add_parser("plot", help="bird's-eye PNG of one scenario (map, expert, agents)")
    p.add_argument("--suite", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--out", default=None)
    p.add_argument("--replay", action="store_true", help="also draw the closed-loop log replay")
    p.set_defaults(func=plot_scenario)
