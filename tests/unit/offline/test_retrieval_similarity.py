"""benchmarks/retrieval_similarity.py: how near a suite's frames are to a scene-vector bank's items, against the
bank's own held-out scenarios."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_offline.distill import split_items
from luna_offline.frames import Frame, write_frames
from tests import samples
from tests.benchmark_scripts import load_benchmark
from tests.unit.core.test_student_support import memory_item, scene


def test_nearest_similarities_are_the_k_best_cosines_best_first() -> None:
    script = load_benchmark("retrieval_similarity")
    items = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    got = script.nearest_similarities(np.array([[1.0, 0.0], [0.0, 1.0]]), items, 2)
    assert np.allclose(got, [[1.0, 0.6], [1.0, 0.8]])


def test_a_frame_far_from_every_item_counts_below_the_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = [replace(memory_item(i), id=f"s{i // 2}@{i % 2}") for i in range(16)]  # 8 scenarios, 2 frames each
    train, held = split_items(items, 0.5)
    assert train and held  # the reference row needs both sides of the split
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many(items)
    near, far = scene(1, speed=5.0), samples.scene()  # near: item 0's own scene
    frames = [Frame(id=f"f{i}", scenario="f", time=float(i), scene=s, origin={}) for i, s in enumerate((near, far))]
    write_frames(frames, tmp_path / "frames.jsonl")
    script = load_benchmark("retrieval_similarity")
    assert script.main(["--bank", str(tmp_path / "bank"), "--frames", f"suite={tmp_path / 'frames.jsonl'}",
                        "--floors", "0.99999", "--heldout-fraction", "0.5", "--k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    reference = next(line for line in lines if line.startswith("| the bank's held-out"))
    assert f"| {len(held)} |" in reference
    cells = next(line for line in lines if line.startswith("| suite (all items)")).split(" | ")
    assert cells[1] == "2" and cells[4] == "50.0"  # the far frame has no item this near, the near one has
