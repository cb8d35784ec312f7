"""Regenerate the standard-set tables of docs/benchmarks.md (issue 12) from ``luna-bridge eval --set
standard`` output: an overview (each planner's NR / R CLS on every suite and their mean), then per suite
Table III over the complete rows, the per-metric and per-type breakdowns (``eval_tables``), a PNG per
suite, and the CPU cost per run from the runs' ``timings/``.

A (planner, mode) row still running (fewer runs than the suite's expert row) is left out of its
table and listed under it, so a partial evaluation never shrinks the scenarios of the others::

    .venv/bin/python benchmarks/standard_set_doc.py out/eval/standard            # writes the doc block
    .venv/bin/python benchmarks/standard_set_doc.py out/eval/standard --print    # prints it instead

The block sits between ``<!-- standard-set:begin -->`` and ``<!-- standard-set:end -->``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import MODES, load_runs, markdown, plot, table  # noqa: E402 - benchmarks/ on sys.path

from luna_bridge.baselines import EXPERT  # noqa: E402

SUITES = ("synthetic-hard", "synthetic-random", "commonroad")
PLANNERS = (EXPERT, "idm", "idm@10hz", "pdm", "pdm@10hz", "diffusion-es", "luna-oracle", "luna-onehot-oracle",
            "luna-oracle-cv", "luna", "luna-k0", "luna-onehot")
BEGIN, END = "<!-- standard-set:begin -->", "<!-- standard-set:end -->"
REPO = Path(__file__).resolve().parent.parent


def suite_section(folder: Path, title: str, figure: Path | None
                  ) -> tuple[str, list[dict[str, Any]], dict[str, list[float]]]:
    """The suite's markdown, its Table III rows and, per planner, the CPU seconds and CPU / simulated time
    of its runs."""
    runs, notes = load_runs([folder])
    expected = {mode: len(runs.get((EXPERT, mode), {})) for mode, _ in MODES}
    running = []
    for (planner, mode), done in list(runs.items()):
        if len(done) < expected[mode]:
            running.append(f"`{planner}` {dict(MODES)[mode]} {len(done)} of {expected[mode]}")
            del runs[(planner, mode)]
    planners = [p for p in PLANNERS if any((p, mode) in runs for mode, _ in MODES)]
    rows, common, dropped = table(runs, planners)
    text = markdown(title, rows, common, dropped, runs, planners, notes)
    if running:
        text += f"\nStill running (left out of this table until complete): {', '.join(sorted(running))}.\n"
    if figure is not None:
        plot(figure, title, rows)
    cost: dict[str, list[float]] = {}
    for planner in PLANNERS:
        files = sorted((folder / "timings" / planner).glob("*/*.json"))
        records = [json.loads(f.read_text(encoding="utf-8")) for f in files]
        if records:
            cost[planner] = [statistics.median(r["cpu_s"] for r in records),
                             statistics.median(r["cpu_s"] / r["simulated_s"] for r in records)]
    return text, rows, cost


def overview(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Every planner's NR / R CLS on each suite (each over that suite's table: its common scenarios) and
    the mean of the six columns where a planner has all six."""
    cols = [(suite, short) for suite in SUITES for _, short in MODES]
    cls = {(r["planner"], suite, short): r[f"{short}-CLS"]
           for suite in rows for r in rows[suite] for _, short in MODES if f"{short}-CLS" in r}
    lines = ["**All suites** (CLS; the per-suite tables below give the scenarios, success rates and breakdowns)",
             "", "| planner | " + " | ".join(f"{suite} {short}" for suite, short in cols) + " | mean of 6 |",
             "|---|" + "---:|" * (len(cols) + 1)]
    for planner in PLANNERS:
        values = [cls.get((planner, suite, short)) for suite, short in cols]
        if all(v is None for v in values):
            continue
        mean = f"{statistics.fmean(values):.2f}" if all(v is not None for v in values) else "-"
        lines.append(f"| {planner} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in values)
                     + f" | {mean} |")
    return "\n".join(lines) + "\n"


def block(out: Path, figures: Path | None) -> str:
    parts, rows, costs = [], {}, {}
    for suite in SUITES:
        if not (out / suite / "scenarios").is_dir():
            parts.append(f"**{suite}**: no runs in {out / suite}.\n")
            continue
        fig = figures / f"standard_{suite}.png" if figures is not None else None
        text, rows[suite], costs[suite] = suite_section(out / suite, suite, fig)
        parts.append(text)
    parts.insert(0, overview(rows))
    lines = ["CPU per run, median, and CPU / simulated time (`timings/` of the runs; one worker's process time):",
             "", "| planner | " + " | ".join(SUITES) + " |", "|---|" + "---:|" * len(SUITES)]
    for planner in PLANNERS:
        if any(planner in costs.get(s, {}) for s in SUITES):
            cells = [f"{costs[s][planner][0]:.1f} s / {costs[s][planner][1]:.2f}" if planner in costs.get(s, {})
                     else "-" for s in SUITES]
            lines.append(f"| {planner} | " + " | ".join(cells) + " |")
    return "\n".join(parts) + "\n" + "\n".join(lines) + "\n"


def replace_block(doc: Path, text: str) -> None:
    old = doc.read_text(encoding="utf-8")
    if BEGIN not in old or END not in old:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} block to replace")
    head, rest = old.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the --out folder of luna-bridge eval --set standard")
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    ap.add_argument("--figures", type=Path, default=REPO / "docs" / "figures",
                    help="where standard_<suite>.png go")
    ap.add_argument("--print", action="store_true", help="print the block; write neither doc nor figures")
    args = ap.parse_args(argv)
    text = block(args.out, None if args.print else args.figures)
    if args.print:
        sys.stdout.write(text)
    else:
        replace_block(args.doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
