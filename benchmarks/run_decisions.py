"""One scenario's runs side by side across evaluation folders: score, failing metrics, the ego's and the
expert's progress along the route (m), the planner's cycles by mode, how often Eq. 22 chose a* beside the
most likely candidate, and the decision timeline (the top three actions at each T_d) that the stack
planners store in their result files; a decision that retrieved reflection items names them with their
similarity and, where their lesson acted (``luna_core.lessons``), the student's own top three. It is how
docs/benchmarks.md reads a run that flips between seeds or differs from the oracle:

    .venv/bin/python benchmarks/run_decisions.py s1=out/eval/seed1:luna s2=out/eval/seed2:luna \
        oracle=out/eval/oracle:luna-oracle --suite commonroad --only USA_Peach-3_2_T-1

Each variant is LABEL=FOLDER:PLANNER as for run_spread.py. Result files written before the timeline was
stored (session 14) show only their decision counts.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import beside_argmax, beside_argmax_text, load_runs  # noqa: E402 - benchmarks/ on sys.path
from run_spread import MODES, parse_single_variant  # noqa: E402

PROGRESS = "ego_progress_along_expert_route"


def _top3_text(top3: list) -> str:
    return "/".join(f"{a} {p:.2f}" for a, p in top3)


def _decision_text(entry: dict[str, Any]) -> str:
    """One timeline entry: its stamp and top three, then the reflection items it used (with their
    similarity) and the student's own top three where a lesson changed the distribution."""
    text = f"{entry['stamp']:.0f} s {_top3_text(entry['top3'])}"
    items = entry.get("reflection_items") or []
    if items:
        similarity = entry.get("reflection_similarity") or []
        named = [f"{i[:13]} {similarity[k]:.3f}" if k < len(similarity) else i[:13] for k, i in enumerate(items)]
        text += f" [{', '.join(named)}"
        if entry.get("student_top3"):
            text += f"; student {_top3_text(entry['student_top3'])}"
        text += "]"
    return text


def describe(record: dict[str, Any]) -> list[str]:
    """Lines for one run: score, failing metrics, progress in metres, then the decisions."""
    metrics = record.get("metrics", {})
    failing = sorted(name for name, m in metrics.items() if m["score"] < 1.0)
    stats = metrics.get(PROGRESS, {}).get("statistics", {})
    progress = (f"; progress {stats['ego_progress']:.1f} m of the expert's {stats['expert_progress']:.1f} m"
                if "ego_progress" in stats and "expert_progress" in stats else "")
    lines = [f"score {record['score']:.2f}; failing: {', '.join(failing) or 'none'}{progress}"]
    cycles = record.get("planner_cycles") or {}
    if cycles.get("modes"):  # least-bad picks and emergency brakes: where the search found nothing passing
        lines.append(f"planner cycles by mode: {dict(sorted(cycles['modes'].items()))}")
    counted = beside_argmax(cycles)
    if counted is not None:
        lines.append(beside_argmax_text(*counted))
    decisions = record.get("decisions") or {}
    timeline = decisions.get("timeline")
    if timeline:
        lines.append("decisions: " + "  ".join(_decision_text(d) for d in timeline))
    elif decisions.get("top_actions"):
        lines.append(f"decisions by top action: {dict(sorted(decisions['top_actions'].items()))} (no timeline)")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", help="LABEL=FOLDER:PLANNER")
    p.add_argument("--suite", default="commonroad", help="suite folder name (default commonroad)")
    p.add_argument("--only", action="append", required=True, help="scenario name (repeatable)")
    p.add_argument("--mode", choices=list(MODES), action="append", help="only this mode (default both)")
    args = p.parse_args()
    variants = []
    for spec in args.variants:
        try:
            label, folder, planner = parse_single_variant(spec, args.suite)
        except ValueError as exc:
            p.error(str(exc))
        variants.append((label, planner, load_runs([folder / args.suite])[0]))
    for scenario in args.only:
        for mode in args.mode or MODES:
            print(f"{scenario} ({MODES[mode]}):")
            for label, planner, runs in variants:
                record = runs.get((planner, mode), {}).get(scenario)
                lines = describe(record) if record else ["no such run"]
                print(f"  {label}: {lines[0]}")
                for line in lines[1:]:
                    print(f"    {line}")


if __name__ == "__main__":
    main()
