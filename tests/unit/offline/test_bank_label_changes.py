"""benchmarks/bank_label_changes.py: top-action changes between two real banks of the same frames."""

from __future__ import annotations

import subprocess
import sys

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from tests.benchmark_scripts import REPO, load_benchmark
from tests.unit.core.test_student_support import memory_item


def _bank(path, tops: list[str]) -> str:
    with MemoryBank.create(path, SceneVectorEmbedder()) as bank:
        bank.append_many([memory_item(i, top=t) for i, t in enumerate(tops)])
    return str(path)


def test_changes_are_counted_per_pair_and_banks_of_other_frames_are_refused(tmp_path):
    before = _bank(tmp_path / "before", ["CK", "CK", "CK", "DK"])
    after = _bank(tmp_path / "after", ["AK", "AK", "CK", "AK"])
    assert load_benchmark("bank_label_changes").top_actions(after) == {"m0": "AK", "m1": "AK", "m2": "CK",
                                                                        "m3": "AK"}
    script = [sys.executable, str(REPO / "benchmarks" / "bank_label_changes.py")]
    out = subprocess.run([*script, before, after], capture_output=True, text=True, check=True).stdout
    assert "4 items in both, 1 keep their top action, 3 change" in out
    assert "| CK -> AK | 2 | 66.7 |" in out and "| DK -> AK | 1 | 33.3 |" in out
    with MemoryBank.create(tmp_path / "other", SceneVectorEmbedder()) as bank:
        bank.append_many([memory_item(7)])
    bad = subprocess.run([*script, before, str(tmp_path / "other")], capture_output=True, text=True)
    assert bad.returncode != 0 and "share no item ids" in bad.stderr
