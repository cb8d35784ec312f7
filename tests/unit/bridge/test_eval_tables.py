"""benchmarks/eval_tables.py: rows from several eval folders on the scenarios every row has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark


def _script():
    return load_benchmark("eval_tables")


def _run(folder: Path, planner: str, mode: str, scenario: str, score: float) -> None:
    path = folder / "scenarios" / planner / mode / f"{scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"planner": planner, "mode": mode, "scenario": scenario, "score": score,
                                "scenario_type": scenario.rstrip("0123456789_")}))


def test_rows_from_two_folders_use_the_common_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    stack, base = tmp_path / "stack", tmp_path / "base"
    for folder in (stack, base):
        for s in ("a_0", "b_0"):
            _run(folder, "log-replay", "non_reactive", s, 1.0)
    _run(stack, "luna", "non_reactive", "a_0", 0.5)
    _run(stack, "luna", "non_reactive", "b_0", 0.0)
    _run(stack, "luna", "reactive", "a_0", 1.0)
    for s, score in (("a_0", 1.0), ("b_0", 0.25), ("c_0", 1.0)):
        _run(base, "pdm", "non_reactive", s, score)
    assert _script().main([str(stack), str(base), "--title", "t", "--plot", str(tmp_path / "t.png")]) == 0
    out = capsys.readouterr().out
    assert "(scenarios: NR 2, R 1)" in out
    assert "| luna | 25.00 | 50.00 | 100.00 | 100.00 |" in out
    assert "| pdm | 62.50 | 100.00 | - | - |" in out  # c_0 has no luna run: left out, and said so
    assert "Not in every non_reactive row (left out of it): c_0." in out
    assert "- luna: 0 of 3 runs with speed-limit compliance below 1" in out
    assert "| type | n | log-replay NR | luna NR | pdm NR | luna R |" in out
    assert "| b | 1 | 100 | 0 | 25 | - |" in out  # b_0 has no reactive run
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_the_expert_row_comes_from_the_first_folder_and_differences_are_said(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ten_hz, two_hz = tmp_path / "ten_hz", tmp_path / "two_hz"
    _run(ten_hz, "log-replay", "reactive", "a_0", 1.0)
    _run(ten_hz, "pdm", "reactive", "a_0", 0.5)
    _run(two_hz, "log-replay", "reactive", "a_0", 0.75)
    _run(two_hz, "luna", "reactive", "a_0", 1.0)
    _script().main([str(ten_hz), str(two_hz), "--title", "t"])
    out = capsys.readouterr().out
    assert "| log-replay | - | - | 100.00 | 100.00 |" in out
    assert f"log-replay runs from {ten_hz}; {two_hz}'s log-replay scores differ on 1 run(s)." in out


def test_the_same_run_in_two_folders_is_refused(tmp_path: Path) -> None:
    for folder in (tmp_path / "x", tmp_path / "y"):
        _run(folder, "pdm", "reactive", "a_0", 1.0)
    with pytest.raises(SystemExit, match="pdm / reactive / a_0 is in two folders"):
        _script().main([str(tmp_path / "x"), str(tmp_path / "y"), "--title", "t"])


def test_per_metric_breakdown_says_where_the_points_go(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for planner, limit in (("pdm", (1.0, 1.0)), ("luna", (0.0, 1.0))):
        for s, score in zip(("a_0", "b_0"), limit):
            path = tmp_path / "scenarios" / planner / "non_reactive" / f"{s}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"planner": planner, "mode": "non_reactive", "scenario": s, "score": score,
                                        "metrics": {"speed_limit_compliance": {"score": score},
                                                    "ego_is_comfortable": {"score": 1.0}}}))
    assert _script().main([str(tmp_path), "--title", "t", "--planner", "pdm", "--planner", "luna"]) == 0
    out = capsys.readouterr().out
    assert "| pdm | NR | - | - | - | - | - | - | 100.0 | 100.0 |" in out
    assert "| luna | NR | - | - | - | - | - | - | 50.0 | 100.0 |" in out  # half the runs over the limit
    assert "- luna: 1 of 2 runs with speed-limit compliance below 1" in out


def test_standard_set_doc_leaves_running_rows_out_and_replaces_only_its_block(tmp_path: Path) -> None:
    doc_script = load_benchmark("standard_set_doc")
    out = tmp_path / "standard"
    hard = out / "synthetic-hard"
    for s in ("a_0", "b_0"):
        _run(hard, "log-replay", "non_reactive", s, 1.0)
        _run(hard, "pdm", "non_reactive", s, 0.5)
    _run(hard, "luna", "non_reactive", "a_0", 0.0)  # 1 of 2: still running
    timing = hard / "timings" / "pdm" / "non_reactive" / "a_0.json"
    timing.parent.mkdir(parents=True)
    timing.write_text(json.dumps({"cpu_s": 3.0, "simulated_s": 15.0, "wall_s": 3.1}))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nbefore\n<!-- standard-set:begin -->\nold\n<!-- standard-set:end -->\nafter\n")
    assert doc_script.main([str(out), "--doc", str(doc), "--figures", str(tmp_path / "fig")]) == 0
    text = doc.read_text()
    assert text.startswith("# B\n\nbefore\n<!-- standard-set:begin -->\n**All suites** (CLS;")
    # The overview: pdm's hard NR; no mean without all six columns; the running luna row left out.
    assert "| pdm | 50.00 | - | - | - | - | - | - |" in text
    assert "\n**synthetic-hard** (scenarios: NR 2)" in text
    assert text.endswith("<!-- standard-set:end -->\nafter\n") and "\nold\n" not in text
    assert "| pdm | 50.00 | 100.00 | - | - |" in text and "| luna |" not in text
    assert "Still running (left out of this table until complete): `luna` NR 1 of 2." in text
    assert "**commonroad**: no runs in" in text
    assert "| pdm | 3.0 s / 0.20 | - | - |" in text
    assert (tmp_path / "fig" / "standard_synthetic-hard.png").read_bytes()[:4] == b"\x89PNG"


def test_run_spread_lists_the_runs_that_swing_between_variants(tmp_path: Path) -> None:
    """benchmarks/run_spread.py: each variant's column on the shared runs, and the runs whose CLS spans more
    than the threshold across the variants."""
    import subprocess
    import sys

    from tests.benchmark_scripts import REPO

    scores = {"a": {"p_1": 0.8, "q_1": 1.0, "r_1": 0.5}, "b": {"p_1": 0.0, "q_1": 0.9, "r_1": 0.5}}
    for label, runs in scores.items():
        for scenario, score in runs.items():
            _run(tmp_path / label / "commonroad", "luna", "non_reactive", scenario, score)
    _run(tmp_path / "a" / "commonroad", "luna", "non_reactive", "only_in_a", 0.0)  # not shared: left out
    spread = load_benchmark("run_spread")
    variants = {k: spread.scores(tmp_path / k, "luna", "commonroad") for k in scores}
    lines = spread.spread_table(variants, 0.3)
    assert "| a | 76.67 | - |" in lines and "| b | 46.67 | - |" in lines
    assert "1 of 3 runs span more than 0.3 in CLS:" in lines and "| p_1 | NR | 0.80 | 0.00 |" in lines
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_spread.py"), f"a={tmp_path / 'a'}:luna",
                          f"b={tmp_path / 'b'}:luna", "--min-range", "0.05"], capture_output=True, text=True,
                         check=True).stdout
    assert "2 of 3 runs span more than 0.05 in CLS:" in out and "| q_1 | NR | 1.00 | 0.90 |" in out
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_spread.py"), f"a={tmp_path / 'a'}:pdm",
                          f"b={tmp_path / 'b'}:luna"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no runs under" in bad.stderr


def test_seed_means_average_each_variant_over_its_seeds_on_the_shared_runs(tmp_path: Path) -> None:
    """benchmarks/seed_means.py: a column per seed, their mean and range, the difference to the first
    variant, all on the runs every seed of every variant has; a seed without the suite is refused."""
    import subprocess
    import sys

    from tests.benchmark_scripts import REPO

    seeds = {"d0": {"p_1": 1.0, "q_1": 0.5}, "d1": {"p_1": 0.0, "q_1": 0.5},
             "c0": {"p_1": 1.0, "q_1": 1.0}}
    for folder, runs in seeds.items():
        for scenario, score in runs.items():
            _run(tmp_path / folder / "commonroad", "luna", "reactive", scenario, score)
    _run(tmp_path / "d0" / "commonroad", "luna", "reactive", "only_in_d0", 0.0)  # not shared: left out
    script = [sys.executable, str(REPO / "benchmarks" / "seed_means.py"),
              f"default={tmp_path / 'd0'}:luna,{tmp_path / 'd1'}:luna", f"cheap={tmp_path / 'c0'}:luna",
              "--suite", "commonroad"]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "| default | 2 | - | - | 50.00 (50.00) | 75.00, 25.00 |" in out
    assert "| cheap | 1 | - | - | 100.00 (0.00) | 100.00 |" in out
    assert "| cheap - default | | - | | +50.00 | |" in out
    assert "| default | 50.00 |" in out and "| cheap | 100.00 |" in out
    bad = subprocess.run(script[:-2] + ["--suite", "synthetic-hard"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no runs under" in bad.stderr and "synthetic-hard" in bad.stderr


def test_run_decisions_prints_score_progress_and_decision_timeline_per_variant(tmp_path: Path) -> None:
    """benchmarks/run_decisions.py: per variant the run's score, failing metrics, progress in metres and
    the stored decision timeline; an old result file without a timeline shows its counts; a missing run
    says so; a variant without the planner is refused."""
    import subprocess
    import sys

    from tests.benchmark_scripts import REPO

    def record(folder: Path, planner: str, score: float, decisions: dict, cycles: dict | None = None) -> None:
        path = folder / "commonroad" / "scenarios" / planner / "reactive" / "peach_1.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "planner": planner, "mode": "reactive", "scenario": "peach_1", "score": score, "decisions": decisions,
            **({"planner_cycles": cycles} if cycles is not None else {}),
            "metrics": {"ego_is_making_progress": {"score": 0.0 if score == 0 else 1.0},
                        "ego_progress_along_expert_route": {"score": 0.1, "statistics": {
                            "ego_progress": 1.43, "expert_progress": 12.59, "ratio": 0.11}}}}))

    record(tmp_path / "new", "luna", 0.0, {"timeline": [
        {"stamp": 0.0, "top3": [["CK", 0.47], ["AK", 0.26], ["SK", 0.16]]},
        {"stamp": 2.0, "top3": [["DK", 0.6], ["CK", 0.3], ["SK", 0.1]], "reflection_items": ["refl-015d0806abcdef"],
         "reflection_similarity": [0.9805], "student_top3": [["CK", 0.6], ["DK", 0.2], ["SK", 0.1]]}]},
           {"cycles": 9, "modes": {"decision": 8, "emergency_brake": 1}, "picks_beside_argmax": 3})
    record(tmp_path / "old", "luna", 0.8, {"top_actions": {"CK": 2, "AK": 1}})
    script = [sys.executable, str(REPO / "benchmarks" / "run_decisions.py"), f"new={tmp_path / 'new'}:luna",
              f"old={tmp_path / 'old'}:luna", "--only", "peach_1"]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "peach_1 (R):" in out and "peach_1 (NR):" in out
    assert ("new: score 0.00; failing: ego_is_making_progress, ego_progress_along_expert_route; "
            "progress 1.4 m of the expert's 12.6 m") in out
    assert ("decisions: 0 s CK 0.47/AK 0.26/SK 0.16  2 s DK 0.60/CK 0.30/SK 0.10 [refl-015d0806 0.981; "
            "student CK 0.60/DK 0.20/SK 0.10]") in out
    assert "a* not the most likely candidate in 3 of 8 decision cycles" in out
    assert "planner cycles by mode: {'decision': 8, 'emergency_brake': 1}" in out
    assert out.count("most likely candidate") == 1  # the old file predates the count
    assert "old: score 0.80; failing: ego_progress_along_expert_route" in out
    assert "decisions by top action: {'AK': 1, 'CK': 2} (no timeline)" in out
    assert out.count("no such run") == 2  # neither folder has the NR run
    bad = subprocess.run(script[:2] + [f"x={tmp_path / 'new'}:pdm", "--only", "peach_1"], capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "no runs under" in bad.stderr


def test_compare_runs_counts_decisions_using_reflection_items_where_a_side_has_them(tmp_path: Path) -> None:
    """benchmarks/compare_runs.py: identical and moved runs per suite, the largest moves, and, once a side's
    runs retrieved reflection items, the decisions on each side and those that used one."""
    import subprocess
    import sys

    from tests.benchmark_scripts import REPO

    def record(folder: Path, scenario: str, score: float, decisions: dict | None) -> None:
        path = folder / "synthetic-hard" / "scenarios" / "luna" / "reactive" / f"{scenario}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"score": score, "metrics": {"no_ego_at_fault_collisions": {"score": score}},
                                    **({"decisions": decisions} if decisions is not None else {})}))

    for name, score, used in (("a_00", 1.0, 0), ("b_00", 0.5, 3)):
        record(tmp_path / "before", name, 1.0, {"count": 8, "using_reflection_items": 0})
        record(tmp_path / "after", name, score, {"count": 8, "using_reflection_items": used})
    script = [sys.executable, str(REPO / "benchmarks" / "compare_runs.py"), str(tmp_path / "before"), "luna",
              str(tmp_path / "after"), "luna", "--suite", "synthetic-hard"]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == ("synthetic-hard: 2 runs compared, 1 identical; R CLS 100.00 -> 75.00; decisions 16 / 16, "
                      "using reflection items 0 / 3")
    assert "-0.500 synthetic-hard R b_00 1.000 -> 0.500" in out
    # the items behind a move: named beside the run, and per item its runs and their summed change
    record(tmp_path / "after", "b_00", 0.5, {"count": 8, "using_reflection_items": 3,
                                             "reflection_items": {"refl-x": 2, "refl-y": 1}})
    lesson = {"reflection_items": ["refl-x"], "student_top3": [["CK", 0.6]]}  # a lesson acted on two decisions,
    record(tmp_path / "after", "c_00", 1.0, {"count": 8, "using_reflection_items": 1,  # changing the top once
                                             "reflection_items": {"refl-x": 1},
                                             "timeline": [{"stamp": 0.0, "top3": [["DK", 0.5]], **lesson},
                                                          {"stamp": 2.0, "top3": [["CK", 0.4]], **lesson}]})
    record(tmp_path / "before", "c_00", 0.75, {"count": 8, "using_reflection_items": 0})
    out = subprocess.run(script + ["--items", "--min-diff", "0.1"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].endswith("using reflection items 0 / 4; a lesson acted in 0 / 2 (top action changed in 0 / 1)")
    assert "| refl-x | 3 | 2 | 2 | 1 | 1 | -0.250 |" in out
    assert "| refl-y | 1 | 0 | 1 | 0 | 1 | -0.500 |" in out
    assert out.index("| refl-x | 3 | 2 | 2 | 1 | 1 | -0.250 |") < out.index("| refl-y | 1 | 0 | 1 | 0 | 1 | -0.500 |")
    assert ("-0.500 synthetic-hard R b_00 1.000 -> 0.500  fails: [] -> ['no_ego_at_fault_collisions']  "
            "items: [] -> ['refl-x', 'refl-y']") in out
    for side in ("before", "after"):
        (tmp_path / side / "synthetic-hard/scenarios/luna/reactive/c_00.json").unlink()
    # no reflection items on either side (or result files that predate the count): the plain line
    record(tmp_path / "after", "b_00", 0.5, None)
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "synthetic-hard: 2 runs compared, 1 identical; R CLS 100.00 -> 75.00"
    # a folder rerunning only the runs that can move: the runs it lacks are the first folder's
    (tmp_path / "after" / "synthetic-hard/scenarios/luna/reactive/a_00.json").unlink()
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "synthetic-hard: 1 runs compared, 0 identical; R CLS 100.00 -> 50.00"
    out = subprocess.run(script + ["--rerun-of-a"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "synthetic-hard: 2 runs compared, 1 identical; R CLS 100.00 -> 75.00"
    # a retrieval floor: the decisions that showed no example, per suite and per listed run
    record(tmp_path / "after", "b_00", 0.5, {"count": 8, "examples_shown": {"0": 5, "3": 3}})
    out = subprocess.run(script + ["--min-diff", "0.1"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].endswith("; decisions without an example 0 of 8 / 5 of 8")
    assert out[-1].endswith("fails: [] -> ['no_ego_at_fault_collisions']  no example: 0 -> 5 of 8 decisions")
