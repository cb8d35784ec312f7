"""``luna-bridge eval`` end to end on a small directory suite: real simulator, real planners, real files.

Two good 2-s scenarios (a lead vehicle on a straight two-lane road) and four bad files (not JSON; a
NaN in the ego state; a missing field; a lane successor that names an unknown lane). Checks the Table-III summary, the failure list, resume, determinism of the
metric files (hash, also across worker processes) and the CLI.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from luna_core.lanes import make_lane
from luna_core.types import EgoState, LaneGraph, ObjectClass, Route

from luna_bridge.cli import main
from luna_bridge.evaluate import EvalConfig, EvaluationError, Job, ScenarioRef, _finished, run_evaluation
from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario
from luna_bridge.scenarios.format import save_scenario
from luna_bridge.stack_planner import StackSettings

DURATION = 2.0


def scenario(name: str, lead_gap: float) -> Scenario:
    g = LaneGraph()
    xs = np.linspace(-50.0, 200.0, 26)
    g.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 4.0, 15.0, road_id="r0", left_neighbor="left"))
    g.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 4.0)]), 4.0, 15.0, road_id="r0",
                    right_neighbor="right"))
    t = np.arange(-20, int(DURATION / SIM_DT) + 1) * SIM_DT
    expert = AgentTrack("ego", ObjectClass.VEHICLE, 5.176, 2.297, t, 8.0 * t, np.zeros_like(t), np.zeros_like(t),
                        np.full_like(t, 8.0), np.zeros_like(t))
    ta = t[t >= 0]
    lead = AgentTrack("lead", ObjectClass.VEHICLE, 4.5, 2.0, ta, lead_gap + 6.0 * ta, np.zeros_like(ta),
                      np.zeros_like(ta), np.full_like(ta, 6.0), np.zeros_like(ta))
    return Scenario(name, "following_lane_with_lead", g, Route(0.0, ["r0"]), EgoState(0.0, 0.0, 0.0, 0.0, 8.0),
                    expert, [lead], duration=DURATION)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("suite")
    save_scenario(scenario("a_lead_near", 20.0), d / "a_lead_near.json")
    save_scenario(scenario("b_lead_far", 40.0), d / "b_lead_far.json")
    (d / "c_broken.json").write_text("{ this is not json", encoding="utf-8")
    bad = json.loads((d / "a_lead_near.json").read_text(encoding="utf-8"))
    bad["name"] = "d_nan_state"
    bad["ego_initial"]["velocity"] = "NaN"
    (d / "d_nan_state.json").write_text(json.dumps(bad), encoding="utf-8")
    missing = json.loads((d / "a_lead_near.json").read_text(encoding="utf-8"))
    del missing["expert"]
    (d / "e_missing_expert.json").write_text(json.dumps(missing), encoding="utf-8")
    unknown = json.loads((d / "a_lead_near.json").read_text(encoding="utf-8"))
    unknown["lane_graph"]["lanes"][0]["successors"] = ["no_such_lane"]
    (d / "f_unknown_lane.json").write_text(json.dumps(unknown), encoding="utf-8")
    return d


def metric_hash(out: Path) -> str:
    h = hashlib.sha256()
    files = sorted(out.glob("scenarios/**/*.json")) + [out / n for n in ("per_scenario.csv", "per_metric.csv",
                                                                      "summary.csv")]
    for f in files:
        h.update(str(f.relative_to(out)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_eval_table_failures_and_resume(suite: Path, tmp_path: Path) -> None:
    cfg = EvalConfig(str(suite), ["idm"], modes=(False, True), out_dir=tmp_path / "out")
    s = run_evaluation(cfg, progress=False)
    assert s.scenario_count == 6 and s.runs == 24 and s.skipped == 0
    assert [row["planner"] for row in s.table] == ["log-replay", "idm"]  # the expert row always first
    expert = s.table[0]
    assert expert["NR-n"] == 6 and expert["R-n"] == 6
    assert expert["NR-SR"] == pytest.approx(100.0 / 3)  # two good scenarios succeed, four bad files score 0
    failed = {(f["scenario"], f["status"]) for f in s.failures}
    bad = ("c_broken", "d_nan_state", "e_missing_expert", "f_unknown_lane")
    assert failed == {(b, "load_error") for b in bad}
    assert len(s.failures) == 16  # 4 files x 2 planners x 2 modes, none dropped
    errors = {f["scenario"]: f["error"] for f in s.failures}
    for name in bad:  # every error names the file
        assert f"{name}.json" in errors[name]
    assert "expert" in errors["e_missing_expert"] and "no_such_lane" in errors["f_unknown_lane"]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| planner | NR-CLS | NR-SR | R-CLS | R-SR |" in md and "c_broken" in md and "Wall time" in md
    rows = (tmp_path / "out" / "per_scenario.csv").read_text().splitlines()
    assert len(rows) == 1 + 24
    assert rows[0].endswith(",collisions,at_fault_collisions,error")  # every contact beside the at-fault ones
    result = json.loads((tmp_path / "out" / "scenarios" / "idm" / "reactive" / "a_lead_near.json").read_text())
    assert result["status"] == "ok" and len(result["metrics"]["time_to_collision_within_bound"]["time_series"]) == 21

    again = run_evaluation(cfg, progress=False)
    assert again.skipped == 24
    (tmp_path / "out" / "scenarios" / "idm" / "reactive" / "b_lead_far.json").unlink()
    (tmp_path / "out" / "scenarios" / "idm" / "non_reactive" / "a_lead_near.json").write_text('{"torn')
    resumed = run_evaluation(cfg, progress=False)
    assert resumed.skipped == 22
    assert metric_hash(tmp_path / "out") == metric_hash(tmp_path / "out")  # sanity of the helper
    assert resumed.table == s.table


@pytest.mark.slow  # ~20 s on a loaded 2-core machine: two PDM runs, one through 2 spawned workers
def test_eval_metric_files_are_byte_identical_across_runs_and_workers(suite: Path, tmp_path: Path) -> None:
    one = run_evaluation(EvalConfig(str(suite), ["pdm"], out_dir=tmp_path / "one", limit=2), progress=False)
    two = run_evaluation(EvalConfig(str(suite), ["pdm"], out_dir=tmp_path / "two", limit=2, workers=2),
                         progress=False)
    assert one.failures == [] and two.failures == []
    assert metric_hash(tmp_path / "one") == metric_hash(tmp_path / "two")
    assert one.table[1]["NR-CLS"] > 0.0


def test_eval_refuses_unknown_planner_and_wrong_count(suite: Path, tmp_path: Path) -> None:
    with pytest.raises(EvaluationError, match="unknown planner"):
        run_evaluation(EvalConfig(str(suite), ["nope"], out_dir=tmp_path / "x"), progress=False)
    with pytest.raises(EvaluationError, match="has 6 scenarios, expected 5"):
        run_evaluation(EvalConfig(str(suite), ["idm"], out_dir=tmp_path / "x", expect_count=5), progress=False)
    with pytest.raises(EvaluationError, match=r"no scenario\(s\) \['z_nope'\]"):
        run_evaluation(EvalConfig(str(suite), ["idm"], out_dir=tmp_path / "x", only=("b_lead_far", "z_nope")),
                       progress=False)


def test_eval_only_named_scenarios(suite: Path, tmp_path: Path) -> None:
    summary = run_evaluation(EvalConfig(str(suite), ["idm"], out_dir=tmp_path / "only", only=("b_lead_far",)),
                             progress=False)
    assert summary.scenario_count == 1
    assert [p.stem for p in (tmp_path / "only" / "scenarios" / "idm" / "non_reactive").glob("*.json")] == ["b_lead_far"]
    assert main(["eval", "--set", "standard", "--only", "b_lead_far", "--planner", "idm"]) == 2  # one suite only
    # With --every, names pick from that subset (a_lead_near, c_broken, e_...): none is dropped silently.
    with pytest.raises(EvaluationError, match=r"\['b_lead_far'\] of suite .* --every 2 subset"):
        run_evaluation(EvalConfig(str(suite), ["idm"], out_dir=tmp_path / "x", every=2,
                                  only=("a_lead_near", "b_lead_far")), progress=False)
    both = run_evaluation(EvalConfig(str(suite), ["idm"], out_dir=tmp_path / "every", every=2,
                                     only=("a_lead_near", "c_broken")), progress=False)
    assert both.scenario_count == 2


def test_cli_eval(suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    code = main(["eval", "--suite", str(suite), "--planner", "idm", "--mode", "non-reactive", "--limit", "2",
                 "--out", str(out), "--render"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| log-replay |" in printed and "| idm |" in printed
    assert (out / "renders" / "idm" / "non_reactive" / "a_lead_near.png").stat().st_size > 1000
    assert (out / "renders" / "idm" / "non_reactive" / "a_lead_near.gif").read_bytes()[:3] == b"GIF"
    assert main(["eval", "--suite", str(suite), "--planner", "idm", "--expect-count", "3", "--out", str(out)]) == 2


def test_cli_eval_diffusion_es_and_bad_stack_settings(suite: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "des"
    code = main(["eval", "--suite", str(suite), "--planner", "diffusion-es", "--mode", "non-reactive", "--limit", "1",
                 "--replan-every", "5", "--population", "8", "--iterations", "0", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| diffusion-es |" in printed
    assert "Diffusion-ES planners: deterministic search (population 8 per action, 0 renoise-denoise" in printed
    result = json.loads((out / "scenarios/diffusion-es/non_reactive/a_lead_near.json").read_text())
    assert result["status"] == "ok" and result["planner_failures"] == 0 and result["stack"]["population"] == 8
    assert main(["eval", "--suite", str(suite), "--planner", "luna", "--population", "2", "--out", str(out)]) == 2
    assert "population >= 4" in capsys.readouterr().err


def test_planner_rates_expert_at_10hz_cycle_statistics_and_timings(suite: Path, tmp_path: Path) -> None:
    """``pdm@10hz`` replans every step beside ``pdm`` at the evaluation's 0.5 s; the expert always runs at
    10 Hz; PDM reports its cycles by mode; each run's wall and CPU time go to timings/, not to the
    metric files."""
    cfg = EvalConfig(suite=str(suite), planners=["pdm", "pdm@10hz"], out_dir=tmp_path, replan_every=5, limit=2)
    summary = run_evaluation(cfg, progress=False)
    assert [e["planner"] for e in summary.table] == ["log-replay", "pdm", "pdm@10hz"]
    runs = {p: json.loads((tmp_path / "scenarios" / p / "non_reactive" / "a_lead_near.json").read_text())
            for p in ("log-replay", "pdm", "pdm@10hz")}
    assert runs["log-replay"]["replan_every"] == 1 and runs["pdm@10hz"]["replan_every"] == 1
    assert runs["pdm"]["replan_every"] == 5
    steps = runs["pdm"]["steps"]
    assert runs["pdm"]["planner_cycles"]["cycles"] == (steps - 2) // 5 + 1
    assert runs["pdm@10hz"]["planner_cycles"]["cycles"] == steps - 1
    assert runs["pdm"]["planner_cycles"]["modes"] == {"proposal": runs["pdm"]["planner_cycles"]["cycles"]}
    timing = json.loads((tmp_path / "timings" / "pdm" / "non_reactive" / "a_lead_near.json").read_text())
    assert timing["cpu_s"] > 0.0 and timing["simulated_s"] == pytest.approx(DURATION, abs=0.11)
    assert "cpu_s" not in runs["pdm"]
    assert "| pdm@10hz |" in (tmp_path / "summary.md").read_text()
    with pytest.raises(EvaluationError, match="rate after '@'"):
        run_evaluation(EvalConfig(suite=str(suite), planners=["pdm@3hz"], out_dir=tmp_path / "bad"), progress=False)


def test_named_evaluation_sets_fix_the_suites_and_their_counts() -> None:
    from luna_bridge.evaluate import EVALUATION_SETS

    standard = EVALUATION_SETS["standard"]
    assert [(s, every) for s, every, _ in standard] == [("synthetic-hard", 5), ("synthetic-random", 5),
                                                        ("commonroad", 1)]
    assert sum(-(-count // every) for _, every, count in standard) == 28 + 28 + 27


@pytest.mark.parametrize("field, then", [("safety_first", False), ("blocked_lateral_to_keep", False)])
def test_a_result_file_that_predates_a_setting_is_taken_for_the_behaviour_before_it(tmp_path: Path, field: str,
                                                                                     then: bool) -> None:
    # Before session 43 every run used the paper's Eq. 22; before session 51 a blocked lane change was dropped.
    ref = ScenarioRef("s0", "s0.json", "synthetic")
    job = Job(ref, "luna", False, str(tmp_path), replan_every=5, stack=StackSettings())
    job.result_path.parent.mkdir(parents=True)
    old = asdict(StackSettings())
    del old[field]  # written before the field existed
    job.result_path.write_text(json.dumps({"replan_every": 5, "stack": old}), encoding="utf-8")
    assert not _finished(job)
    assert _finished(replace(job, stack=replace(StackSettings(), **{field: then})))
