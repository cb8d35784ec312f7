"""benchmarks/score_cached_heads.py: a saved head scored on cached h_{i*} against the cached targets, or against a
relabelled bank's labels of the same items (``--targets-from-bank``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_offline.distill_head import _write_shard
from tests.benchmark_scripts import load_benchmark
from tests.unit.core.test_student_support import memory_item
from tests.unit.offline.test_heads_by_speed import D_MODEL, always, one_hot, save_student


def test_a_head_is_scored_against_the_cache_or_against_a_relabelled_banks_labels(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    features = tmp_path / "features"
    features.mkdir()
    # Cached with the old teacher's labels (CK for both items); the relabelled bank says AK and DK.
    _write_shard(features, "heldout", 0, [torch.zeros(D_MODEL)] * 2, [one_hot("CK"), one_hot("CK")],
                 [("m0", 0), ("m1", 0)])
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many([memory_item(0, "AK"), memory_item(1, "DK")])
    student = save_student(tmp_path / "ak", always("AK"))
    script = load_benchmark("score_cached_heads")

    def accuracy(*extra: str) -> str:
        assert script.main(["--student", str(student), "--features", str(features), *extra]) == 0
        return capsys.readouterr().out.splitlines()[-1].split(" | ")[3]

    assert accuracy() == "0.0"  # the cache's CK labels
    assert accuracy("--bank", str(tmp_path / "bank"), "--targets-from-bank") == "50.0"  # AK right on m0 only
    with pytest.raises(SystemExit):  # the labels come from a bank, so one must be named
        script.main(["--student", str(student), "--features", str(features), "--targets-from-bank"])


def test_by_type_scores_each_scenario_type_of_the_held_out_frames(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    features = tmp_path / "features"
    features.mkdir()
    rows = [("train_stopping_with_lead_06@0005.00", 3), ("train_stopping_with_lead_07@0001.50", 3),
            ("train_starting_right_turn_00@0000.00", 3)]
    _write_shard(features, "heldout", 0, [torch.zeros(D_MODEL)] * 3, [one_hot("AK"), one_hot("SK"), one_hot("AK")],
                 rows)
    student = save_student(tmp_path / "ak", always("AK"))
    script = load_benchmark("score_cached_heads")
    assert script.scenario_type(rows[0][0]) == "stopping_with_lead"
    assert script.main(["--student", str(student), "--features", str(features), "--by-type"]) == 0
    table = {line.split(" | ")[0].strip("| "): line.split(" | ")[1].split(", ")
             for line in capsys.readouterr().out.splitlines() if line.startswith("| st")}
    assert table["stopping_with_lead"][:2] == ["2", "50.0"]  # AK right on one of its two frames
    assert table["starting_right_turn"][:2] == ["1", "100.0"]
