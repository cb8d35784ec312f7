"""How far single runs swing between variants of one planner: the runs of a suite whose CLS spans more
than ``--min-range`` across several evaluation folders, and each variant's column (mean CLS x 100) per
mode. It tells how much of a "no loss" comparison a few knife-edge runs decide (docs/benchmarks.md,
"Session 15"):

    .venv/bin/python benchmarks/run_spread.py default=out/eval/std:luna bf16=out/eval/bf16:luna \
        pop64=out/eval/pop64:luna --suite commonroad --min-range 0.3

Each variant is LABEL=FOLDER:PLANNER, FOLDER holding ``<suite>/scenarios/<planner>/<mode>/*.json`` as
``luna-bridge eval`` writes them. Only runs present in every variant count.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import load_runs  # noqa: E402 - benchmarks/ on sys.path

MODES = {"non_reactive": "NR", "reactive": "R"}


def scores(folder: Path, planner: str, suite: str) -> dict[tuple[str, str], float]:
    """(scenario, mode) -> CLS of one variant's runs (read as eval_tables reads an eval folder)."""
    suite_folder = folder / suite
    if not (suite_folder / "scenarios" / planner).is_dir():
        return {}
    runs, _ = load_runs([suite_folder])
    return {(scenario, mode): float(record["score"])
            for mode in MODES for scenario, record in runs.get((planner, mode), {}).items()}


def parse_variant(spec: str) -> tuple[str, list[tuple[Path, str]]]:
    """LABEL=FOLDER:PLANNER[,FOLDER:PLANNER...] -> (label, [(folder, planner), ...])."""
    label, sep, rest = spec.partition("=")
    if not (sep and label and rest):
        raise ValueError(f"{spec!r} is not LABEL=FOLDER:PLANNER[,FOLDER:PLANNER...]")
    runs = []
    for run in rest.split(","):
        folder, sep2, planner = run.rpartition(":")
        if not (sep2 and folder and planner):
            raise ValueError(f"{spec!r}: {run!r} is not FOLDER:PLANNER")
        runs.append((Path(folder), planner))
    return label, runs


def parse_single_variant(spec: str, suite: str) -> tuple[str, Path, str]:
    """LABEL=FOLDER:PLANNER with exactly one run that has results in ``suite`` -> (label, folder, planner)."""
    label, runs = parse_variant(spec)
    if len(runs) != 1:
        raise ValueError(f"{spec!r}: one FOLDER:PLANNER per variant (several seeds: benchmarks/seed_means.py)")
    (folder, planner), = runs
    if not (folder / suite / "scenarios" / planner).is_dir():
        raise ValueError(f"{spec!r}: no runs under {folder}/{suite}/scenarios/{planner}/")
    return label, folder, planner


def column(variant: dict[tuple[str, str], float], keys: list[tuple[str, str]]) -> float:
    """CLS (100 x mean score) of one variant over the given (scenario, mode) runs."""
    return 100 * sum(variant[k] for k in keys) / len(keys)


def spread_table(variants: dict[str, dict[tuple[str, str], float]], min_range: float) -> list[str]:
    """Markdown: the column per variant and mode, then every run whose scores span more than min_range."""
    labels = list(variants)
    common = set.intersection(*(set(v) for v in variants.values()))
    if not common:
        raise SystemExit("run_spread: the variants share no run")
    lines = ["| variant | " + " | ".join(f"{m} CLS" for m in MODES.values()) + " |",
             "|---|" + "---:|" * len(MODES)]
    for label in labels:
        cols = []
        for mode in MODES:
            keys = [k for k in common if k[1] == mode]
            cols.append(f"{column(variants[label], keys):.2f}" if keys else "-")
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    swings = sorted(k for k in common if max(v[k] for v in variants.values()) - min(v[k] for v in variants.values())
                    > min_range)
    lines += ["", f"{len(swings)} of {len(common)} runs span more than {min_range} in CLS:", "",
              "| run | mode | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels)]
    lines += [f"| {s} | {MODES[m]} | " + " | ".join(f"{variants[label][(s, m)]:.2f}" for label in labels) + " |"
              for s, m in swings]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="LABEL=FOLDER:PLANNER (at least two)")
    p.add_argument("--suite", default="commonroad", help="suite folder name (default commonroad)")
    p.add_argument("--min-range", type=float, default=0.3, help="list runs whose CLS spans more than this")
    args = p.parse_args()
    if len(args.variants) < 2:
        p.error("give at least two variants")
    variants = {}
    for spec in args.variants:
        try:
            label, folder, planner = parse_single_variant(spec, args.suite)
        except ValueError as exc:
            p.error(str(exc))
        variants[label] = scores(folder, planner, args.suite)
        if not variants[label]:
            p.error(f"{spec!r}: no runs under {folder}/{args.suite}/scenarios/{planner}/")
    print("\n".join(spread_table(variants, args.min_range)))


if __name__ == "__main__":
    main()
