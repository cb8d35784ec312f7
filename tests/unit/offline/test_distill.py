"""luna-offline distill on a real memory bank (faiss, scene-vector embedder) and the real SmolLM2 base."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_core.student import DualHeadStudent
from luna_offline.distill import (DistillError, DistillSettings, distill, is_heldout, retrieve_examples,
                                  sample_order, split_group, split_items, subset)
from tests.unit.core.test_student_support import PROMPTS, memory_item

torch.set_num_threads(1)  # shared CI machine

TOPS = ("AK", "CK", "DK", "SK")


def make_bank(path, n: int) -> str:
    with MemoryBank.create(path, SceneVectorEmbedder()) as bank:
        # The teacher's top action follows the ego speed, so there is something to learn.
        bank.append_many([memory_item(i, top=TOPS[i % len(TOPS)]) for i in range(n)])
    return str(path)


def test_split_order_and_retrieval_exclude_the_sample_and_held_out_items(tmp_path):
    bank_path = make_bank(tmp_path / "bank", 12)
    bank = MemoryBank.open(bank_path)
    try:
        train, held = split_items(list(bank), 0.3)
        assert len(train) + len(held) == 12 and held
        assert all(is_heldout(it.id, 0.3) for it in held) and not any(is_heldout(it.id, 0.3) for it in train)
        exclude = {it.id for it in held}
        for item in train:
            got = retrieve_examples(bank, item, 3, exclude)
            assert len(got) == 3 and item.id not in {g.id for g in got} and not exclude & {g.id for g in got}
        assert retrieve_examples(bank, train[0], 0, exclude) == []
    finally:
        bank.close()
    order = sample_order(5, 2, seed=3, k_min=0, k_max=3)
    assert len(order) == 10 and sorted(i for i, _ in order[:5]) == list(range(5))
    assert {k for _, k in order} <= {0, 1, 2, 3} and order == sample_order(5, 2, 3, 0, 3)


def test_held_out_split_keeps_the_frames_of_one_scenario_together():
    assert split_group("train_cut_in_03@0012.50") == "train_cut_in_03" and split_group("m7") == "m7"
    # on-policy (DAgger) frames of a scenario fall on its side of the split too
    assert split_group("train_cut_in_03@0012.50~luna") == "train_cut_in_03"
    assert split_group("train_cut_in_03@0012.50~luna~reactive") == "train_cut_in_03"
    ids = [f"scn{s}@{t:07.2f}" for s in range(40) for t in (0.0, 2.0, 4.0)]
    held = {i.split("@")[0] for i in ids if is_heldout(i, 0.2)}
    assert held and len(held) < 40  # some scenarios, not all
    for s in range(40):  # every frame of a scenario falls on the same side
        assert len({is_heldout(f"scn{s}@{t:07.2f}", 0.2) for t in (0.0, 2.0, 4.0)}) == 1
    assert not any(is_heldout(i, 0.0) for i in ids)


def test_limit_draws_a_seeded_subset_across_the_bank():
    items = [memory_item(i) for i in range(20)]
    some = subset(items, 5, seed=0)
    assert len(some) == 5 and [it.id for it in some] == [it.id for it in subset(items, 5, seed=0)]
    assert some != items[:5] and max(int(it.id[1:]) for it in some) >= 5  # not just the first items
    assert [int(it.id[1:]) for it in some] == sorted(int(it.id[1:]) for it in some)  # bank order kept
    assert subset(items, 0, 0) == items and subset(items, 50, 0) == items


@pytest.mark.slow  # three short runs, each loading the base model: ~30 s on two cores
def test_distill_writes_student_curves_and_resumes(tmp_path):
    bank_path = make_bank(tmp_path / "bank", 6)
    out = tmp_path / "run"
    settings = DistillSettings(bank=bank_path, out=str(out), max_steps=2, batch_size=2, grad_accum=1,
                               k_min=0, k_max=1, heldout_fraction=0.0, checkpoint_every=1, lr=1e-3,
                               max_context_tokens=1024, device="cpu")
    final = distill(settings, prompts=PROMPTS, progress=False)
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history] == [1, 2]
    assert all(np.isfinite(h["lm"]) and h["kl"] > 0 for h in history)
    assert (out / "loss_curves.png").stat().st_size > 1000
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert (state["step"], state["samples_seen"]) == (2, 4)
    student = DualHeadStudent.from_pretrained(final, PROMPTS, device="cpu")
    p, _ = student.predict(memory_item(0).query, [])
    assert abs(p.sum() - 1.0) < 1e-9

    settings.max_steps = 3  # resume: one more step, history continues
    distill(settings, prompts=PROMPTS, progress=False)
    assert [h["step"] for h in json.loads((out / "history.json").read_text())] == [1, 2, 3]

    settings.alpha = 0.1
    with pytest.raises(DistillError, match="alpha"):
        distill(settings, prompts=PROMPTS, progress=False)
    settings.alpha = DistillSettings.alpha

    # A checkpoint written before the prompt settings existed ran with their defaults: it resumes.
    state_file = out / "checkpoint" / "trainer_state.json"
    saved = json.loads(state_file.read_text())
    for key in ("query_objects", "prompt_form"):
        del saved["settings"][key]
    state_file.write_text(json.dumps(saved))
    settings.max_steps, settings.epochs = 4, 2  # one epoch of the 6 items is 3 steps
    distill(settings, prompts=PROMPTS, progress=False)
    assert [h["step"] for h in json.loads((out / "history.json").read_text())] == [1, 2, 3, 4]
    settings.prompt_form = "brief"
    with pytest.raises(DistillError, match="prompt_form"):
        distill(settings, prompts=PROMPTS, progress=False)


def test_bad_settings_and_an_empty_bank_are_refused(tmp_path):
    with pytest.raises(DistillError, match="k_min"):
        DistillSettings(bank="b", out="o", k_min=3, k_max=1).validate()
    with MemoryBank.create(tmp_path / "empty", SceneVectorEmbedder()):
        pass
    with pytest.raises(DistillError, match="no teacher items"):
        distill(DistillSettings(bank=str(tmp_path / "empty"), out=str(tmp_path / "o"), device="cpu"),
                prompts=PROMPTS, progress=False)


@pytest.mark.slow
def test_kl_to_the_teacher_falls_on_a_small_synthetic_set(tmp_path):
    """8 items whose teacher distribution depends on the scene: the KL loss of Eq. 17 must fall (6 steps at
    K = 0, the shortest prompts: the slowest test of the suite at 12 steps with K <= 1, ~170 s)."""
    bank_path = make_bank(tmp_path / "bank", 8)
    settings = DistillSettings(bank=bank_path, out=str(tmp_path / "run"), epochs=3, batch_size=4,
                               grad_accum=1, k_min=0, k_max=0, heldout_fraction=0.0, lr=1e-3,
                               warmup_steps=1, checkpoint_every=100, max_context_tokens=1024, device="cpu")
    distill(settings, prompts=PROMPTS, progress=False)
    kl = [h["kl"] for h in json.loads((tmp_path / "run" / "history.json").read_text())]
    assert len(kl) == 6
    assert np.mean(kl[-2:]) < np.mean(kl[:2]), kl


@pytest.mark.slow  # one base-model load and two short steps: ~15 s on two cores
def test_max_time_stops_between_optimizer_steps_and_saves_the_student(tmp_path):
    bank_path = make_bank(tmp_path / "bank", 8)
    settings = DistillSettings(bank=bank_path, out=str(tmp_path / "run"), batch_size=1, grad_accum=2,
                               k_min=0, k_max=0, heldout_fraction=0.0, max_time=0.01, checkpoint_every=100,
                               max_context_tokens=1024, device="cpu")
    final = distill(settings, prompts=PROMPTS, progress=False)
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    # Over budget after the first micro-batch already, but the step completes its accumulation.
    assert [h["step"] for h in history] == [1]
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["samples_seen"] == 2 and state["step"] == 1
    assert (final / "adapter.safetensors").stat().st_size > 0
