"""luna-offline evaluate: metric functions with known answers, and a tiny end-to-end run on a real bank."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_core.student import DualHeadStudent, StudentConfig
from luna_core.types import ACTION_CODES
from luna_offline.evaluate import (METEOR_UNAVAILABLE, TextMetrics, evaluate, kl_divergence,
                                   majority_baseline, markdown_table, write_report)
from tests.unit.core.test_student_support import PROMPTS, distribution, memory_item

torch.set_num_threads(1)  # shared CI machine


def test_kl_divergence_matches_the_definition():
    p = distribution("CK", 0.7)
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    q = np.full(10, 0.1)
    assert kl_divergence(p, q) == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-12)
    one_hot = np.eye(10)[3]
    assert kl_divergence(one_hot, q) == pytest.approx(np.log(10.0), rel=1e-12)


def test_text_metrics_on_known_pairs():
    m = TextMetrics()
    same = m.score(["the lead vehicle brakes hard"], ["the lead vehicle brakes hard"])
    assert same["bleu1"] == pytest.approx(100.0) and same["bleu4"] == pytest.approx(100.0)
    assert same["rougeL"] == pytest.approx(100.0)
    other = m.score(["green light ahead"], ["the lead vehicle brakes hard"])
    assert other["bleu1"] == pytest.approx(0.0) and other["rougeL"] == pytest.approx(0.0)
    if m.wordnet is None:
        assert same["meteor"] is None and m.meteor_note == METEOR_UNAVAILABLE
    else:  # METEOR matches WordNet synonyms: 'car' ~ 'auto' (nltk matches synonyms after stemming)
        syn = m.score(["the car brakes"], ["the auto brakes"])["meteor"]
        exact_only = m.score(["the tree brakes"], ["the auto brakes"])["meteor"]
        assert same["meteor"] > 90 and syn > exact_only
    with pytest.raises(ValueError, match="hypotheses"):
        m.score(["a"], [])


def test_majority_baseline():
    train = [memory_item(i, top=t) for i, t in enumerate(["CK", "CK", "DK"])]
    held = [memory_item(10, top="CK"), memory_item(11, top="AK")]
    b = majority_baseline(train, held)
    mean = np.mean([it.distribution for it in train], axis=0)
    assert b["action"] == "CK" and b["accuracy"] == pytest.approx(0.5)
    assert b["kl"] == pytest.approx(np.mean([kl_divergence(it.distribution, mean) for it in held]))


def test_evaluate_end_to_end_writes_metrics_table_and_figure(tmp_path):
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many([memory_item(i, top=("CK", "DK")[i % 2]) for i in range(8)])
    torch.manual_seed(0)
    student = DualHeadStudent.from_base(StudentConfig(device="cpu", max_context_tokens=1024), PROMPTS)
    report = evaluate(student, str(tmp_path / "bank"), ks=[0, 1], limit=2, explain_limit=1,
                      heldout_fraction=0.5, zero_shot=True, max_new_tokens=6, progress=False)
    assert [r.k for r in report.results] == [0, 1] and report.heldout == 2
    for r in report.results:
        assert 0.0 <= r.accuracy <= 1.0 and r.kl > 0 and r.dpp_latency_median > 0
        assert r.n_explained == 1 and r.bleu1 is not None and r.explain_latency_median > 0
    assert report.results[1].prompt_tokens_median > report.results[0].prompt_tokens_median
    assert 0.0 <= report.zero_shot["accuracy"] <= 1.0 and report.zero_shot["kl"] > 0
    assert report.majority["action"] in ACTION_CODES
    write_report(report, tmp_path / "eval")
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["heldout"] == 2
    assert (tmp_path / "eval" / "fig7.png").stat().st_size > 5000
    table = markdown_table(report)
    assert "| 0 |" in table and "| 1 |" in table and "zero-shot base model" in table


def test_an_interrupted_evaluation_resumes_from_its_frame_journal(tmp_path):
    """Frames already in ``frames.jsonl`` are not evaluated again and give the same metrics; a torn last
    line (a killed run) is dropped; another evaluation's journal is refused."""
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many([memory_item(i, top=("CK", "DK")[i % 2]) for i in range(8)])
    torch.manual_seed(0)
    student = DualHeadStudent.from_base(StudentConfig(device="cpu", max_context_tokens=1024), PROMPTS)
    calls = []
    predict = student.predict
    student.predict = lambda query, examples, **kw: calls.append(len(examples)) or predict(query, examples, **kw)
    journal = tmp_path / "eval" / "frames.jsonl"
    run = dict(limit=2, explain_limit=0, heldout_fraction=0.5, zero_shot=False, progress=False, journal=journal)
    first = evaluate(student, str(tmp_path / "bank"), ks=[0], **run)
    assert calls == [0, 0]
    with journal.open("a") as f:
        f.write('{"k": 1, "id": "torn')  # killed while writing
    resumed = evaluate(student, str(tmp_path / "bank"), ks=[0, 1], **run)
    assert calls == [0, 0, 1, 1], "only the K = 1 frames were evaluated again"
    assert resumed.results[0].accuracy == first.results[0].accuracy and resumed.results[0].kl == first.results[0].kl
    assert len(journal.read_text().splitlines()) == 1 + 4
    with pytest.raises(ValueError, match="belongs to another evaluation"):
        evaluate(student, str(tmp_path / "bank"), ks=[0], **{**run, "limit": 3})
