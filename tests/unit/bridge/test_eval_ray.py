"""``luna-bridge eval --executor ray``: the same jobs as the process pool on a real local Ray instance,
byte-identical result files on two scenarios, the progress bar, and resumption."""

from __future__ import annotations

from pathlib import Path

import pytest

from luna_bridge.cli import main
from luna_bridge.evaluate import EvalConfig, EvaluationError, ray_session, run_evaluation
from luna_bridge.scenarios.format import save_scenario
from tests.unit.bridge.test_eval import metric_hash, scenario


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("two")
    save_scenario(scenario("a_lead_near", 20.0), d / "a_lead_near.json")
    save_scenario(scenario("b_lead_far", 40.0), d / "b_lead_far.json")
    return d


def test_unknown_executor_is_refused(two: Path, tmp_path: Path) -> None:
    with pytest.raises(EvaluationError, match="unknown executor 'dask'"):
        run_evaluation(EvalConfig(str(two), ["idm"], out_dir=tmp_path / "x", executor="dask"), progress=False)


@pytest.mark.slow  # a local Ray instance starts in ~15-30 s and two spawned pool workers in ~15 s on 2 busy cores
def test_ray_executor_writes_the_process_pools_files_and_resumes(two: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    pool = tmp_path / "pool"
    run_evaluation(EvalConfig(str(two), ["pdm"], modes=(False, True), out_dir=pool, workers=2), progress=False)
    on_ray = tmp_path / "ray"
    cfg = EvalConfig(str(two), ["pdm"], modes=(False, True), out_dir=on_ray, workers=2, executor="ray")
    with ray_session(cfg):  # one local instance for the CLI run and the resumed run below
        assert main(["eval", "--suite", str(two), "--planner", "pdm", "--mode", "both", "--workers", "2",
                     "--executor", "ray", "--out", str(on_ray)]) == 0
        assert ray.is_initialized()  # the CLI used the running instance and left it running
        assert metric_hash(on_ray) == metric_hash(pool)  # 8 result files (2 planners x 2 modes x 2) and tables
        assert len(list(on_ray.glob("scenarios/**/*.json"))) == 8
        assert len(list(on_ray.glob("timings/**/*.json"))) == 8  # the jobs' other files come back too
        capsys.readouterr()

        (on_ray / "scenarios" / "pdm" / "reactive" / "b_lead_far.json").unlink()
        (on_ray / "scenarios" / "pdm" / "non_reactive" / "a_lead_near.json").write_text('{"torn')
        resumed = run_evaluation(cfg)  # with the progress bar
        assert resumed.skipped == 6 and resumed.failures == []
        assert metric_hash(on_ray) == metric_hash(pool)
        bar = capsys.readouterr().err
        assert "eval " in bar and "8/8" in bar  # the bar starts at the 6 resumed runs and ends complete
    assert not ray.is_initialized()  # the session stopped the instance it started
