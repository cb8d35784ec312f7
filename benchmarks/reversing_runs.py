"""Runs whose ego drove backwards: every result file of ``luna-bridge eval`` folders whose driving-direction
statistic ``min_progress_in_horizon`` (m of progress within 1 s; negative = backwards) is below a threshold
(docs/benchmarks.md, "Session 20"):

    .venv/bin/python benchmarks/reversing_runs.py out/eval/standard --planner luna [--below -0.2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import MODES, load_runs  # noqa: E402 - benchmarks/ on sys.path


def reversing_runs(folder: Path, planner: str, below: float) -> tuple[int, list[tuple[float, float, str, str]]]:
    """(runs read, [(min progress in 1 s (m), score, scenario, mode)] of those below ``below``, sorted), over
    every suite folder of ``folder`` that has runs of ``planner`` (read as eval_tables reads them)."""
    runs, found = 0, []
    for suite_folder in sorted(p.parent.parent for p in folder.glob(f"*/scenarios/{planner}")):
        records, _ = load_runs([suite_folder])
        for mode, _label in MODES:
            for record in records.get((planner, mode), {}).values():
                stats = record.get("metrics", {}).get("driving_direction_compliance", {}).get("statistics", {})
                if "min_progress_in_horizon" not in stats:
                    continue
                runs += 1
                progress = stats["min_progress_in_horizon"]
                if progress is not None and progress < below:
                    found.append((float(progress), float(record["score"]), record["scenario"], mode))
    return runs, sorted(found)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--planner", default="luna")
    ap.add_argument("--below", type=float, default=-0.2, help="m of progress within 1 s (negative: backwards)")
    args = ap.parse_args(argv)
    for folder in args.folders:
        runs, found = reversing_runs(folder, args.planner, args.below)
        print(f"{folder} {args.planner}: {len(found)} of {runs} runs below {args.below} m")
        for progress, score, scenario, mode in found:
            print(f"  {progress:+.2f} m  score {score:.3f}  {scenario} {mode}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
