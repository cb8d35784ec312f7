"""benchmarks/nuplan_crosscheck.py's verdict (issue 17): any disagreement makes it exit non-zero; --help works
without the devkit."""

from __future__ import annotations

import subprocess
import sys

from tests.benchmark_scripts import REPO, load_benchmark


def test_a_disagreeing_metric_or_tracking_run_gives_a_non_zero_exit_status() -> None:
    v = load_benchmark("crosscheck_verdict")
    assert v.metric_disagreement("collision:front", "no_ego_at_fault_collisions", 1.0, 0.995) is None
    wrong = v.metric_disagreement("speed:partial", "speed_limit_compliance", 0.285, 0.041)
    assert wrong is not None and "speed_limit_compliance on speed:partial" in str(wrong)
    assert v.tracking_disagreements("circle", 4.2e-12, 4.7e-13, 6.5e-13) == []
    off = v.tracking_disagreements("circle", 0.3, 4.7e-13, float("nan"))
    assert [d.what for d in off] == ["tracking circle: max position (m) difference",
                                     "tracking circle: max speed (m/s) difference"]
    assert v.exit_status([]) == 0
    assert v.exit_status([wrong]) == 1
    assert v.exit_status(off) == 1


def test_help_works_without_the_devkit() -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "nuplan_crosscheck.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "exit status 0 when every value" in " ".join(out.stdout.split())
    missing = subprocess.run([sys.executable, str(REPO / "benchmarks" / "nuplan_crosscheck.py")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "devkit not importable" in missing.stderr  # the project venv has no devkit
