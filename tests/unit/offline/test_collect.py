"""``luna-offline collect`` end to end with the in-process SmolLM2-135M-Instruct as every agent, a real
MiniLM memory bank, resumption, the response cache, the spending cap and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from luna_core.llm import CachingChatModel, TransformersChatModel, UsageMeter
from luna_core.memory import MemoryBank, MiniLMEmbedder, SceneVectorEmbedder
from luna_core.prompts import EXPLANATION_TAG, allowed_actions, parse_ranked_answer
from luna_core.scene import SCENE_VECTOR_DIM
from luna_core.teacher import ActionOutcome, LLMVoterPool, ScoredVoterPool, Teacher, TeacherConfig
from luna_core.types import ACTION_CODES, validate_distribution
from luna_offline.collect import EXIT_BUDGET, RECORDS, collect, recorded_frames
from luna_offline.frames import scenario_frames, write_frames
from tests.unit.core.test_teacher import FakeScorer
from tests.unit.offline.test_frames import junction_scenario

# Small M and short outputs keep the run short; SmolLM2's short answers rarely parse, so the
# constrained fallback and the template rationale do the rest, and both are recorded.
SMALL = TeacherConfig(num_voters=2, top_k=20, vote_max_tokens=12, confidence_max_tokens=8, summary_max_tokens=24)


@pytest.fixture(scope="module")
def frames():
    every = list(scenario_frames(junction_scenario(), rate=2.0))
    return [every[0], every[4]]  # a normal multi-lane frame and a near-junction frame


@pytest.fixture(scope="module")
def smollm():
    return TransformersChatModel("smollm2-135m-instruct", num_threads=1)


@pytest.mark.slow  # ~40 s of CPU on 2 cores: model load, ~5k prompt tokens, MiniLM
def test_collect_two_frames_with_smollm2_as_every_agent(frames, smollm, tmp_path):
    meter = UsageMeter()
    smollm.meter = meter
    cached = CachingChatModel(smollm, tmp_path / "cache")
    teacher = Teacher(LLMVoterPool(cached, config=SMALL), cached, config=SMALL)
    with MemoryBank.create(tmp_path / "bank", MiniLMEmbedder()) as bank:
        summary = collect(frames, teacher, bank, tmp_path / "run", meter=meter, cache=cached, progress=False)
        assert (summary.ok, summary.failed) == (2, 0)
        assert meter.prompt_tokens > 0 and summary.usage["completion_tokens"] > 0
        items = {item.id: item for item in bank.items}
        assert set(items) == {f.id for f in frames}
        for frame in frames:
            item = items[frame.id]
            p = validate_distribution(item.distribution)  # 10 actions, finite, sums to 1
            assert p.shape == (len(ACTION_CODES),)
            allowed = allowed_actions(frame.scene)
            assert all(p[i] == 0.0 for i, c in enumerate(ACTION_CODES) if c not in allowed)
            answer = parse_ranked_answer(item.answer, allowed)  # rationale present, in the strict format
            assert all(len(answer.explanations[c]) > 20 for c in answer.ranked)
            assert EXPLANATION_TAG in item.answer
            assert item.embedding.shape == (384,) and np.linalg.norm(item.embedding) == pytest.approx(1.0, abs=1e-4)
            assert item.scene_vector.shape == (SCENE_VECTOR_DIM,)
            best, score = bank.retrieve(item.query, k=1)[0]
            assert best.id == frame.id and score == pytest.approx(1.0, abs=1e-4)
    records = [json.loads(line) for line in (tmp_path / "run" / RECORDS).read_text().splitlines()]
    assert [r["frame"] for r in records] == [f.id for f in frames]
    for r in records:
        assert r["ok"] and len(r["ballots"]) + r["dropped_voters"] == 2
        # Every fallback is visible: a constrained vote comes with the recorded parse failure.
        for b in r["ballots"]:
            assert b["vote_source"] in ("parsed", "constrained")
            stages = {(f["stage"], f["voter"]) for f in r["failures"]}
            assert (b["vote_source"] == "constrained") == (("vote", b["voter"]) in stages)
            assert (b["confidence_source"] == "constrained_expectation") == (("confidence", b["voter"]) in stages)
        assert (r["rationale_source"] == "template") == any(f["stage"] == "summary" for f in r["failures"])
    assert summary.constrained_votes == sum(b["vote_source"] == "constrained" for r in records for b in r["ballots"])

    # Resume: nothing is redone.
    calls = meter.summary()["models"]["smollm2-135m-instruct"]["requests"]
    with MemoryBank.open(tmp_path / "bank", writable=True) as bank:
        again = collect(frames, teacher, bank, tmp_path / "run", meter=meter, cache=cached, progress=False)
        assert (again.skipped_done, again.ok, len(bank)) == (2, 0, 2)
    assert meter.summary()["models"]["smollm2-135m-instruct"]["requests"] == calls

    # A fresh run over the same cache costs no model call and reproduces the items exactly.
    hits = cached.hits
    with MemoryBank.create(tmp_path / "bank2", MiniLMEmbedder()) as bank2:
        rerun = collect(frames, teacher, bank2, tmp_path / "run2", meter=meter, cache=cached, progress=False)
        assert rerun.ok == 2 and cached.hits > hits
        assert meter.summary()["models"]["smollm2-135m-instruct"]["requests"] == calls
        for item in bank2.items:
            assert item.answer == items[item.id].answer
            assert np.array_equal(item.distribution, items[item.id].distribution)


def test_collect_resumes_after_an_interruption_with_fake_scorer(frames, tmp_path):
    """A crash between the bank append and the record, and a torn last record line, lose nothing and
    repeat nothing."""
    scorer = FakeScorer({"CK": ActionOutcome(0.9, reason="no collision")})
    teacher = Teacher(ScoredVoterPool(scorer, TeacherConfig(num_voters=3)))
    run = tmp_path / "run"
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        first = collect(frames[:1], teacher, bank, run, progress=False)
        assert first.ok == 1
        (run / RECORDS).write_text((run / RECORDS).read_text() + '{"frame": "torn')  # crash mid-line
        assert recorded_frames(run, retry_failed=False) == {frames[0].id} == {it.id for it in bank.items}
        second = collect(frames, teacher, bank, run, concurrency=2, progress=False)
        assert (second.skipped_done, second.ok) == (1, 1) and len(bank) == 2
    assert len(scorer.calls) == 2  # each frame scored once


def test_frames_under_ids_the_bank_already_holds_are_reported_not_silently_skipped_with_fake_scorer(
        frames, tmp_path, capsys):
    """A second collection of other states under the same ids (e.g. on-policy frames of the same scenarios by
    another student) into a bank that holds the first: each skipped frame is counted and the command names
    the way out (``frames --tag``); the same frames under their own ids are collected."""
    from dataclasses import replace

    teacher = Teacher(ScoredVoterPool(FakeScorer({"CK": ActionOutcome(0.9, reason="no collision")}),
                                      TeacherConfig(num_voters=3)))
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        assert collect(frames, teacher, bank, tmp_path / "first", progress=False).ok == 2
        capsys.readouterr()
        clash = collect(frames, teacher, bank, tmp_path / "second", progress=False)
        assert (clash.ok, clash.skipped_done, clash.skipped_in_bank) == (0, 2, 2)
        assert "--tag" in capsys.readouterr().err and "ids already in the bank" in clash.table()
        resumed = collect(frames, teacher, bank, tmp_path / "first", progress=False)  # its own records: no clash
        assert (resumed.skipped_done, resumed.skipped_in_bank) == (2, 0) and "--tag" not in capsys.readouterr().err
        tagged = [replace(f, id=f"{f.id}~it2") for f in frames]
        assert collect(tagged, teacher, bank, tmp_path / "second", progress=False).ok == 2 and len(bank) == 4


def test_collect_command_with_fake_scorer_and_the_spending_cap_exit(frames, tmp_path):
    """The CLI with simulation-grounded voters (``--scorer``) into a scene-vector bank; and the budget
    exit path: a cap that refuses the first paid request before anything is sent."""
    from luna_offline.cli import main

    path = tmp_path / "frames.jsonl"
    write_frames(frames, path)
    args = ["collect", "--frames", str(path), "--bank", str(tmp_path / "bank"), "--run", str(tmp_path / "run"),
            "--embedder", "scene-vector", "--voters", "4", "--scorer", "tests.unit.offline.test_collect:cruise_scorer"]
    assert main(args) == 0
    with MemoryBank.open(tmp_path / "bank") as bank:
        assert len(bank) == 2 and all(item.distribution[ACTION_CODES.index("CK")] == 1.0 for item in bank.items)
    # Capped run against an unreachable paid endpoint: refused before any request, exit code 3.
    capped = ["collect", "--frames", str(path), "--bank", str(tmp_path / "bank3"), "--run", str(tmp_path / "run3"),
              "--embedder", "scene-vector", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1",
              "--model", "paid", "--price-prompt", "1000", "--spending-cap", "0.01", "--voters", "1"]
    assert main(capped) == EXIT_BUDGET
    summary = json.loads((tmp_path / "run3" / "summary.json").read_text())
    assert summary["stopped"].startswith("spending cap reached") and summary["ok"] == 0


def cruise_scorer():
    """Factory for ``--scorer``: every frame's best rollout is cruising in the lane."""
    return FakeScorer({"CK": ActionOutcome(0.8, reason="no collision, 20.0 m progress")})


class FakeBrokenVoters:
    """A voter pool that crashes on one frame (a bug in plugged-in code) and works on the others."""

    def __init__(self, broken_time: float) -> None:
        self.broken_time = broken_time
        self.inner = ScoredVoterPool(cruise_scorer(), TeacherConfig(num_voters=2))

    def cast(self, scene, query_av, allowed, context, seed):
        if context["time"] == self.broken_time:
            raise RuntimeError("plug-in bug")
        return self.inner.cast(scene, query_av, allowed, context, seed)


def test_collect_records_a_crashing_frame_and_continues_with_fake_voters(frames, tmp_path):
    teacher = Teacher(FakeBrokenVoters(frames[0].time))
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        summary = collect(frames, teacher, bank, tmp_path / "run", progress=False)
        assert (summary.ok, summary.failed) == (1, 1) and [i.id for i in bank.items] == [frames[1].id]
    records = [json.loads(line) for line in (tmp_path / "run" / RECORDS).read_text().splitlines()]
    assert records[0] == {"frame": frames[0].id, "scenario": frames[0].scenario, "time": frames[0].time,
                          "ok": False, "reason": "RuntimeError: plug-in bug"}
    # Failed frames are retried on request, not otherwise.
    assert recorded_frames(tmp_path / "run", retry_failed=True) == {frames[1].id}
    assert recorded_frames(tmp_path / "run", retry_failed=False) == {frames[0].id, frames[1].id}


def test_collect_records_an_item_the_bank_refuses_with_fake_scorer(frames, tmp_path):
    """A scene-vector bank of another dimension refuses the items: each frame is recorded as failed
    with the bank's reason, nothing is half-written, and the run finishes."""
    teacher = Teacher(ScoredVoterPool(cruise_scorer(), TeacherConfig(num_voters=2)))
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder(dim=5)) as bank:
        summary = collect(frames, teacher, bank, tmp_path / "run", progress=False)
        assert (summary.ok, summary.failed, len(bank)) == (0, 2, 0)
    records = [json.loads(line) for line in (tmp_path / "run" / RECORDS).read_text().splitlines()]
    assert all(not r["ok"] and r["reason"].startswith("memory bank refused the item") for r in records)
