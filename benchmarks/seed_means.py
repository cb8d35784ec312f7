"""Variants of a planner compared over several search seeds: each suite's NR / R CLS per seed, the mean
over the seeds and their range, so that a verdict of "no loss" rests on more than one deterministic draw
per scenario (docs/benchmarks.md, "How far a column moves by itself"):

    .venv/bin/python benchmarks/seed_means.py \
        default=out/eval/std:luna,out/eval/std-seed1:luna \
        pop64=out/eval/pop64:luna,out/eval/pop64-seed1:luna

Each variant is LABEL=RUN[,RUN...], one RUN (FOLDER:PLANNER, FOLDER holding
``<suite>/scenarios/<planner>/<mode>/*.json`` as ``luna-bridge eval --set standard`` writes them) per
seed. Every column is over the runs that all variants' seeds share in that suite and mode, so a missing
run cannot move one side only; a suite a seed lacks entirely is an error naming it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_spread import MODES, column, parse_variant, scores  # noqa: E402 - benchmarks/ on sys.path

SUITES = ("synthetic-hard", "synthetic-random", "commonroad")


def seed_columns(variants: dict[str, list[dict[tuple[str, str], float]]]) -> dict[str, dict[str, list[float]]]:
    """label -> mode -> one CLS (100 x mean score) per seed, on the runs every seed of every variant has."""
    every = [seed for seeds in variants.values() for seed in seeds]
    common = set.intersection(*(set(s) for s in every))
    out: dict[str, dict[str, list[float]]] = {}
    for label, seeds in variants.items():
        out[label] = {}
        for mode in MODES:
            keys = [k for k in common if k[1] == mode]
            out[label][mode] = [column(s, keys) for s in seeds] if keys else []
    return out


def suite_table(suite: str, columns: dict[str, dict[str, list[float]]]) -> list[str]:
    """Markdown rows: per variant and mode the mean over seeds, the seeds' range and the values; then each
    variant's difference to the first variant's mean."""
    first = next(iter(columns))
    lines = [f"{suite}:", "", "| variant | seeds | " + " | ".join(
        f"{m} CLS mean (range) | {m} per seed" for m in MODES.values()) + " |",
        "|---|---:|" + "---:|---|" * len(MODES)]
    for label, by_mode in columns.items():
        cells = []
        for mode in MODES:
            v = by_mode[mode]
            cells += [f"{mean(v):.2f} ({max(v) - min(v):.2f})" if v else "-",
                      ", ".join(f"{x:.2f}" for x in v) or "-"]
        lines.append(f"| {label} | {max(len(v) for v in by_mode.values())} | " + " | ".join(cells) + " |")
    for label, by_mode in list(columns.items())[1:]:
        diffs = [f"{mean(by_mode[m]) - mean(columns[first][m]):+.2f}" if by_mode[m] and columns[first][m] else "-"
                 for m in MODES]
        lines.append(f"| {label} - {first} | |" + "".join(f" {d} | |" for d in diffs))
    return lines + [""]


def overall(tables: dict[str, dict[str, dict[str, list[float]]]]) -> list[str]:
    """The mean of the 6 columns (3 suites x NR / R) per variant, each column first averaged over seeds."""
    labels = list(next(iter(tables.values())))
    lines = ["| variant | mean of the suites' NR / R columns over seeds |", "|---|---:|"]
    for label in labels:
        cols = [mean(tables[s][label][m]) for s in tables for m in MODES if tables[s][label][m]]
        lines.append(f"| {label} | {mean(cols):.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="LABEL=FOLDER:PLANNER[,FOLDER:PLANNER...], one run per seed")
    p.add_argument("--suite", action="append", choices=SUITES, help="only these suites (repeatable; default all)")
    args = p.parse_args()
    try:
        specs = dict(parse_variant(s) for s in args.variants)
    except ValueError as exc:
        p.error(str(exc))
    tables = {}
    for suite in args.suite or SUITES:
        variants = {}
        for label, runs in specs.items():
            variants[label] = [scores(folder, planner, suite) for folder, planner in runs]
            for (folder, planner), seed in zip(runs, variants[label]):
                if not seed:
                    p.error(f"{label}: no runs under {folder}/{suite}/scenarios/{planner}/")
        tables[suite] = seed_columns(variants)
        print("\n".join(suite_table(suite, tables[suite])))
    print("\n".join(overall(tables)))


if __name__ == "__main__":
    main()
