"""luna-offline baselines on a real memory bank: the numbers come from the command, held out by scenario."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_offline.baselines import gbt_predict, knn_predict, score
from luna_offline.cli import main
from luna_offline.distill import split_group
from tests.unit.core.test_student_support import memory_item

TOPS = ("AK", "CK", "DK", "SK")


def items(n_scenarios: int = 30, frames: int = 4):
    """Frames ``<scenario>@<t>`` whose teacher top action follows the ego speed band (learnable)."""
    out = []
    for s in range(n_scenarios):
        for f in range(frames):
            i = s * frames + f
            item = memory_item(i, top=TOPS[(i // 3) % len(TOPS)])
            out.append(replace(item, id=f"scn{s:02d}@{f * 0.5:07.2f}"))
    return out


def test_baselines_command_writes_the_table_with_no_scenario_on_both_sides(tmp_path):
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many(items())
    assert main(["baselines", "--bank", str(tmp_path / "bank"), "--out", str(tmp_path / "out"),
                 "--heldout-fraction", "0.3"]) == 0
    report = json.loads((tmp_path / "out" / "baselines.json").read_text())
    assert report["shared_scenarios"] == [] and report["heldout_scenarios"] > 0
    assert report["train_items"] + report["heldout_items"] == 120
    by_name = {r["name"]: r for r in report["results"]}
    assert set(by_name) == {"majority", "gbt", "gbt+timing", "knn"}
    for r in by_name.values():
        assert 0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["kl"]) and r["kl"] >= 0.0
    # the top action is a function of the speed in the scene vector: trees learn it, the majority cannot
    assert by_name["gbt"]["accuracy"] > by_name["majority"]["accuracy"]
    assert by_name["gbt+timing"]["accuracy"] > by_name["majority"]["accuracy"]  # the timing keeps xi_t in front
    assert "| gbt |" in (tmp_path / "out" / "baselines.md").read_text()
    labels = report["labels"]
    assert labels["items"] == 120 and sum(a["top"] for a in labels["actions"].values()) == 120
    assert labels["actions"]["AK"]["top"] == 30 and labels["actions"]["AL"]["top"] == 0  # 4 tops, 30 each
    assert 0.0 < labels["mean_entropy"] < np.log(10)
    # --heldout-limit scores the seeded subset that distill --heldout-limit / evaluate --limit use
    assert main(["baselines", "--bank", str(tmp_path / "bank"), "--out", str(tmp_path / "some"),
                 "--heldout-fraction", "0.3", "--heldout-limit", "7"]) == 0
    some = json.loads((tmp_path / "some" / "baselines.json").read_text())
    assert some["heldout_items"] == 7 and {r["n"] for r in some["results"]} == {7}
    assert some["labels"] == labels and some["train_items"] == report["train_items"]


def test_soft_labels_and_knn_never_use_the_items_own_scenario():
    data = items(12, 3)
    train = [it for it in data if not it.id.startswith("scn00")]
    held = [it for it in data if it.id.startswith("scn00")]
    for it in data:
        it.embedding = np.asarray(it.scene_vector, dtype=np.float32) / np.linalg.norm(it.scene_vector)
    p = gbt_predict(train, held)
    assert p.shape == (3, 10) and np.allclose(p.sum(axis=1), 1.0)
    # kNN over the training items plus the held-out scenario itself: its own frames are never neighbours
    q = knn_predict(train + held, held, k=5)
    alone = knn_predict(train, held, k=5)
    assert np.allclose(q, alone) and {split_group(it.id) for it in held} == {"scn00"}
    with pytest.raises(ValueError, match="no held-out items"):
        score("x", [], np.zeros((0, 10)), 0.0)
