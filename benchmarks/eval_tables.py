"""One Table III from several ``luna-bridge eval`` output folders, per-type means and a PNG.

``luna-bridge eval`` writes one JSON per run (``<out>/scenarios/<planner>/<mode>/<scenario>.json``) and
a summary of the planners of *that* command. Rows measured by different commands (the stack at 2 Hz
with ``--population 64``, the baselines at nuPlan's 10 Hz, ablations in non-reactive mode only) are
put side by side here, on the scenarios every row has in that mode (the rest are listed, never
silently dropped). The expert row comes from the first folder that has one (list the folder whose
protocol it should follow first; the output says where the others differ)::

    .venv/bin/python benchmarks/eval_tables.py --title synthetic-hard \
        out/eval/stack-hard-baselines out/eval/stack-hard --plot docs/figures/stack_hard.png

CLS = 100 x mean scenario score, SR = % of scenarios with a non-zero score (``luna_bridge.metrics``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from luna_bridge.baselines import EXPERT
from luna_bridge.metrics import aggregate

MODES = (("non_reactive", "NR"), ("reactive", "R"))


def load_runs(folders: list[Path]) -> tuple[dict[tuple[str, str], dict[str, dict[str, Any]]], list[str]]:
    """(planner, mode) -> scenario -> run record, and notes on the expert rows.

    A planner's run found in two folders is refused. Every eval folder has its own expert log replay;
    the first folder's is used, and where a later folder's differs (e.g. it was run with another
    ``--replan-every``) the notes say on how many runs.
    """
    runs: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    expert_from: str | None = None
    differs: dict[str, int] = defaultdict(int)
    for folder in folders:
        files = sorted((folder / "scenarios").glob("*/*/*.json"))
        if not files:
            raise SystemExit(f"{folder}: no run files under scenarios/<planner>/<mode>/")
        for f in files:
            record = json.loads(f.read_text(encoding="utf-8"))
            key = (record["planner"], record["mode"])
            kept = runs[key].get(record["scenario"])
            if kept is not None:
                if key[0] != EXPERT:
                    raise SystemExit(f"{f}: {key[0]} / {key[1]} / {record['scenario']} is in two folders")
                if kept["score"] != record["score"]:
                    differs[str(folder)] += 1
                continue
            if key[0] == EXPERT:
                expert_from = expert_from or str(folder)
            runs[key][record["scenario"]] = record
    notes = [f"{EXPERT} runs from {expert_from}" + "".join(
        f"; {folder}'s {EXPERT} scores differ on {n} run(s)" for folder, n in differs.items())] \
        if expert_from else []
    return runs, notes


def table(runs: dict[tuple[str, str], dict[str, dict[str, Any]]], planners: list[str]
          ) -> tuple[list[dict[str, Any]], dict[str, list[str]], dict[str, list[str]]]:
    """Rows of Table III over the common scenarios of each mode; also those scenarios and the dropped ones."""
    common: dict[str, list[str]] = {}
    dropped: dict[str, list[str]] = {}
    for mode, _ in MODES:
        sets = [set(runs[(p, mode)]) for p in planners if runs.get((p, mode))]
        if not sets:
            continue
        common[mode] = sorted(set.intersection(*sets))
        dropped[mode] = sorted(set.union(*sets) - set(common[mode]))
    rows = []
    for p in planners:
        row: dict[str, Any] = {"planner": p}
        for mode, short in MODES:
            if mode in common and runs.get((p, mode)):
                agg = aggregate([runs[(p, mode)][s]["score"] for s in common[mode]])
                row[f"{short}-CLS"], row[f"{short}-SR"] = agg.cls, agg.success_rate
        rows.append(row)
    return rows, common, dropped


def per_type(runs: dict[tuple[str, str], dict[str, dict[str, Any]]], planners: list[str],
             common: dict[str, list[str]]) -> tuple[list[str], list[tuple[str, str]], dict]:
    """Mean CLS per scenario type and (planner, mode) column."""
    cols = [(p, mode) for mode, _ in MODES if mode in common for p in planners if runs.get((p, mode))]
    types: dict[str, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    for p, mode in cols:
        for s in common[mode]:
            r = runs[(p, mode)][s]
            types[r.get("scenario_type") or s][(p, mode)].append(r["score"])
    return sorted(types), cols, types


def beside_argmax(cycles: dict[str, Any]) -> tuple[int, int] | None:
    """(decision cycles whose a* was not the most likely candidate, decision cycles) of one result file's
    ``planner_cycles``; None for files written before the count (session 24)."""
    if "picks_beside_argmax" not in cycles:
        return None
    return cycles["picks_beside_argmax"], cycles.get("modes", {}).get("decision", 0)


def beside_argmax_text(beside: int, decided: int) -> str:
    """The one wording of that count in every script that prints it."""
    return f"a* not the most likely candidate in {beside} of {decided} decision cycles"


def run_facts(runs: dict, planner: str, common: dict[str, list[str]]) -> list[str]:
    """One line per planner: runs over the speed limit, planner cycles by mode (fallbacks, emergency
    brakes) with the flips of a* per minute and how often Eq. 22 chose a candidate other than the most
    likely (runs written since session 24 record it), and for the stack its decisions by top action."""
    sel = [runs[(planner, mode)][s] for mode in common for s in common[mode] if s in runs.get((planner, mode), {})]
    over = sum(1 for r in sel if r.get("metrics", {}).get("speed_limit_compliance", {}).get("score", 1.0) < 1.0)
    top: dict[str, int] = defaultdict(int)
    modes: dict[str, int] = defaultdict(int)
    flips, minutes = 0, 0.0
    beside, decided_cycles = 0, 0  # over the runs that record picks beside the argmax
    for r in sel:
        for action, n in (r.get("decisions") or {}).get("top_actions", {}).items():
            top[action] += n
        cycles = r.get("planner_cycles") or {}
        for mode, n in cycles.get("modes", {}).items():
            modes[mode] += n
        flips += cycles.get("flips", 0)
        counted = beside_argmax(cycles)
        if counted is not None:
            beside += counted[0]
            decided_cycles += counted[1]
        minutes += r.get("steps", 0) * 0.1 / 60.0
    cycled = (f"; planner cycles by mode: {dict(sorted(modes.items()))}, a* flips per minute: "
              f"{flips / minutes if minutes else 0.0:.2f}") if modes else ""
    if decided_cycles:
        cycled += ", " + beside_argmax_text(beside, decided_cycles)
    decided = f"; decisions by top action: {dict(sorted(top.items()))}" if top else ""
    return [f"- {planner}: {over} of {len(sel)} runs with speed-limit compliance below 1{cycled}{decided}"]


METRIC_COLUMNS = (("no_ego_at_fault_collisions", "no coll."), ("drivable_area_compliance", "drivable"),
                  ("driving_direction_compliance", "direction"), ("ego_is_making_progress", "making prog."),
                  ("ego_progress_along_expert_route", "progress"), ("time_to_collision_within_bound", "TTC"),
                  ("speed_limit_compliance", "speed limit"), ("ego_is_comfortable", "comfort"))


def per_metric(runs: dict, planners: list[str], common: dict[str, list[str]]) -> list[str]:
    """Mean score x 100 of each nuPlan metric per (planner, mode): where a row's CLS points go."""
    short = dict(MODES)
    out = ["| planner | mode | " + " | ".join(name for _, name in METRIC_COLUMNS) + " |",
           "|---|---|" + "---:|" * len(METRIC_COLUMNS)]
    for mode in common:
        for p in planners:
            sel = [runs[(p, mode)][s] for s in common[mode] if s in runs.get((p, mode), {})]
            if not sel:
                continue
            cells = []
            for key, _ in METRIC_COLUMNS:
                vals = [r["metrics"][key]["score"] for r in sel if key in r.get("metrics", {})]
                cells.append(f"{100 * sum(vals) / len(vals):.1f}" if vals else "-")
            out.append(f"| {p} | {short[mode]} | " + " | ".join(cells) + " |")
    return out


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown(title: str, rows: list[dict[str, Any]], common: dict[str, list[str]],
             dropped: dict[str, list[str]], runs: dict, planners: list[str], notes: list[str]) -> str:
    cols = ["NR-CLS", "NR-SR", "R-CLS", "R-SR"]
    n = ", ".join(f"{short} {len(common[mode])}" for mode, short in MODES if mode in common)
    out = [f"**{title}** (scenarios: {n})", "", "| planner | " + " | ".join(cols) + " |",
           "|---|" + "---:|" * len(cols)]
    out += [f"| {r['planner']} | " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    for mode, names in dropped.items():
        if names:
            out += ["", f"Not in every {mode} row (left out of it): {', '.join(names)}."]
    out += [f"\n{note}." for note in notes if EXPERT in planners]
    out += [""] + [line for p in planners for line in run_facts(runs, p, common)]
    out += ["", f"<details><summary>{title}: mean score of each metric (x 100)</summary>", ""]
    out += per_metric(runs, planners, common) + ["", "</details>"]
    types, tcols, means = per_type(runs, planners, common)
    short = dict(MODES)
    out += ["", f"<details><summary>{title}: mean CLS per scenario type</summary>", "",
            "| type | n | " + " | ".join(f"{p} {short[m]}" for p, m in tcols) + " |",
            "|---|---:|" + "---:|" * len(tcols)]
    for t in types:
        n_t = max(len(v) for v in means[t].values())
        out.append(f"| {t} | {n_t} | " + " | ".join(
            f"{100 * sum(means[t][c]) / len(means[t][c]):.0f}" if means[t].get(c) else "-" for c in tcols) + " |")
    out += ["", "</details>"]
    return "\n".join(out) + "\n"


def plot(path: Path, title: str, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.38
    for k, (col, colour) in enumerate((("NR-CLS", "#4c72b0"), ("R-CLS", "#dd8452"))):
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        vals = [r.get(col) for r in rows]
        ax.bar([x for x, v in zip(xs, vals) if v is not None], [v for v in vals if v is not None], width,
               label=col, color=colour)
    ax.set_xticks(range(len(rows)), [r["planner"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("CLS")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="luna-bridge eval output folders")
    ap.add_argument("--title", required=True)
    ap.add_argument("--planner", action="append", dest="planners",
                    help="row order (repeatable; default: the expert, then as found)")
    ap.add_argument("--plot", type=Path, help="PNG bar chart of NR-CLS and R-CLS")
    args = ap.parse_args(argv)
    runs, notes = load_runs(args.folders)
    found = sorted({p for p, _ in runs})
    planners = args.planners or [EXPERT] + [p for p in found if p != EXPERT]
    missing = [p for p in planners if p not in found]
    if missing:
        raise SystemExit(f"no runs of {', '.join(missing)} in {', '.join(map(str, args.folders))}")
    rows, common, dropped = table(runs, planners)
    sys.stdout.write(markdown(args.title, rows, common, dropped, runs, planners, notes))
    if args.plot:
        plot(args.plot, args.title, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
