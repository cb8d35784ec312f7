"""benchmarks/reversing_runs.py: which runs' ego drove backwards, read from result files."""

import json

from tests.benchmark_scripts import load_benchmark


def _result(folder, scenario, mode, progress, score):
    path = folder / "commonroad" / "scenarios" / "luna" / mode / f"{scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"planner": "luna", "scenario": scenario, "mode": mode, "score": score, "metrics": {
        "driving_direction_compliance": {"statistics": {"min_progress_in_horizon": progress}}}}))


def test_lists_only_the_runs_below_the_threshold(tmp_path):
    _result(tmp_path, "a", "reactive", -1.1, 0.0)
    _result(tmp_path, "b", "non_reactive", -0.1, 1.0)
    _result(tmp_path, "c", "non_reactive", 0.3, 1.0)
    script = load_benchmark("reversing_runs")
    runs, found = script.reversing_runs(tmp_path, "luna", -0.2)
    assert runs == 3 and found == [(-1.1, 0.0, "a", "reactive")]
