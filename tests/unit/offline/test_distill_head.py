"""Stage 1 of distillation (``--stage head``): cached h_{i*} of the frozen base and the DPP head trained on
them; resumes give identical results; the cached states are the run-time ``predict`` states."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_core.scene import (HEAD_SCENE_VALUES_DIM, SCENE_TIMING_DIM, SCENE_VECTOR_DIM, SCENE_VECTOR_EGO_ROAD_DIM,
                             item_head_values)
from luna_core.student import DualHeadStudent, SceneVectorError
from luna_core.student.head import DecisionHead
from luna_offline.distill import DistillError, DistillSettings, distill
from luna_offline.distill_head import (FEATURES, SHARD_ROWS, CachePart, HeadSettings, _write_shard,
                                       _with_extra_rows, bank_targets, best_epoch, feature_plan, is_validation,
                                       kl_and_accuracy, load_features, run_head_stage, split_validation,
                                       train_head)
from tests.unit.core.test_student_support import PROMPTS, memory_item
from tests.unit.offline.test_distill import TOPS, make_bank

torch.set_num_threads(1)


def rows(n: int, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.softmax(3 * x[:, :10], dim=-1)  # a learnable soft target
    return x, y


def head(d: int = 16) -> DecisionHead:
    torch.manual_seed(0)
    return DecisionHead(d, 32, 10)


def test_head_training_resumed_from_its_checkpoint_is_identical(tmp_path):
    settings = HeadSettings(head_epochs=4, head_batch=8)
    train, held = rows(40), rows(12, seed=1)
    straight = head()
    full = train_head(straight, train, held, settings, seed=3, state_dir=tmp_path / "a", progress=False)
    resumed = head()
    train_head(resumed, train, held, settings, seed=3, state_dir=tmp_path / "b", epochs=2, progress=False)
    again = head()  # a new process: fresh weights, everything comes from the checkpoint
    history = train_head(again, train, held, settings, seed=3, state_dir=tmp_path / "b", progress=False)
    assert history == full and [h["epoch"] for h in history] == [1, 2, 3, 4]
    for a, b in zip(straight.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert full[-1]["train_kl"] < full[0]["train_kl"]
    with pytest.raises(ValueError, match="other head settings"):
        train_head(head(), train, held, HeadSettings(head_epochs=5, head_batch=8, head_lr=0.1), 3,
                   tmp_path / "b", progress=False)


def test_feature_plan_draws_k_per_variant_and_evaluates_at_eval_k():
    plan = feature_plan(["a", "b", "c"], ["h"], variants=2, eval_k=3, seed=0, k_min=0, k_max=3)
    assert [i for i, _ in plan["train"]] == ["a", "b", "c", "a", "b", "c"]
    assert {k for _, k in plan["train"]} <= {0, 1, 2, 3} and plan["heldout"] == [("h", 3)]
    assert plan == feature_plan(["a", "b", "c"], ["h"], 2, 3, 0, 0, 3)


def test_cache_parts_split_the_shards_and_reject_bad_text():
    halves = [CachePart.parse("0/2"), CachePart.parse("1/2")]
    assert [[s for s in range(6) if h.owns(s)] for h in halves] == [[0, 2, 4], [1, 3, 5]]
    assert all(CachePart().owns(s) for s in range(6))
    for bad in ("2/2", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="--cache-part"):
            CachePart.parse(bad)


def test_a_cache_of_another_plan_is_refused_and_missing_shards_are_skipped(tmp_path):
    plan = [(f"s{n // 31}@{n % 31}", 0) for n in range(3 * SHARD_ROWS)]
    target = np.full(10, 0.1)
    for s in (0, 2):  # shard 1 not cached yet (another process, a later session)
        chunk = plan[s * SHARD_ROWS:(s + 1) * SHARD_ROWS]
        _write_shard(tmp_path, "train", s, [torch.full((4,), float(s))] * len(chunk), [target] * len(chunk), chunk)
    x, y, got = load_features(tmp_path, "train", plan)
    assert got == plan[:SHARD_ROWS] + plan[2 * SHARD_ROWS:] and x.dtype == torch.float32
    assert x.shape == (2 * SHARD_ROWS, 4) and set(x[:, 0].tolist()) == {0.0, 2.0}
    other = [(i, 1) for i, _ in plan]  # same items, another K draw
    with pytest.raises(ValueError, match="train-00000.safetensors holds rows of another plan"):
        load_features(tmp_path, "train", other)


def test_extra_caches_add_training_rows_and_refuse_rows_that_are_not_training_items(tmp_path):
    k0 = [("a@1", 0), ("b@1", 0)]
    for name in ("k0", "held", "wide"):
        (tmp_path / name).mkdir()
    _write_shard(tmp_path / "k0", "train", 0, [torch.ones(4)] * 2, [np.full(10, 0.1)] * 2, k0)
    _write_shard(tmp_path / "held", "train", 0, [torch.ones(4)], [np.full(10, 0.1)], [("h@1", 0)])
    _write_shard(tmp_path / "wide", "train", 0, [torch.ones(6)], [np.full(10, 0.1)], [("a@1", 0)])
    x, y = torch.zeros(3, 4), torch.full((3, 10), 0.1)
    ex, ey, erows = _with_extra_rows(x, y, [("c@1", 1)] * 3, [str(tmp_path / "k0")], {"a@1", "b@1", "c@1"})
    assert ex.shape == (5, 4) and ey.shape == (5, 10) and ex[3:].eq(1).all() and ex[:3].eq(0).all()
    assert erows == [("c@1", 1)] * 3 + k0  # the ids follow the rows (the validation split needs them)
    assert _with_extra_rows(x, y, [], [], {"a@1"})[0] is x
    with pytest.raises(DistillError, match="1 rows are not training items of this run .e.g. h@1"):
        _with_extra_rows(x, y, [], [str(tmp_path / "held")], {"a@1", "b@1"})
    with pytest.raises(DistillError, match="hidden size 6, this cache 4"):
        _with_extra_rows(x, y, [], [str(tmp_path / "wide")], {"a@1"})
    with pytest.raises(DistillError, match="no cached training rows"):
        _with_extra_rows(x, y, [], [str(tmp_path / "none")], {"a@1"})


def test_targets_from_a_relabelled_bank_replace_k0_targets_and_keep_only_k_rows_cached_from_it():
    items = {it.id: it for it in (memory_item(0, "AK"), memory_item(1, "DK"))}
    y = bank_targets([("m1", 0), ("m0", 0)], items)
    assert y.shape == (2, 10) and y.dtype == torch.float32
    assert torch.allclose(y[0], torch.tensor(items["m1"].distribution, dtype=torch.float32))
    assert int(y[1].argmax()) == 0  # AK, the relabelled item's top action
    old = {it.id: it for it in (memory_item(0, "CK"), memory_item(1, "DK"))}  # m0's label before the relabel
    old_targets = torch.tensor([old["m0"].distribution, old["m1"].distribution], dtype=torch.float32)
    with pytest.raises(DistillError, match="1 cached rows have K > 0 and another teacher's target .e.g. .'m0', 3"):
        bank_targets([("m0", 0), ("m0", 3), ("m1", 2)], items, cached=old_targets[[0, 0, 1]])  # m0's prompt: old
    with pytest.raises(DistillError, match="1 cached rows have K > 0"):
        bank_targets([("m1", 2)], items)  # no cached targets to tell which bank the prompt came from
    # A K > 0 row cached from this bank (its target is this bank's) is kept; K = 0 rows are relabelled.
    kept = bank_targets([("m0", 0), ("m1", 2)], items, cached=torch.stack([old_targets[0], y[0]]))
    assert torch.equal(kept, torch.stack([y[1], y[0]]))
    with pytest.raises(DistillError, match="not training items of the bank .e.g. 'gone'"):
        bank_targets([("gone", 0)], items)
    with pytest.raises(DistillError, match="1 cached rows are not held-out items"):
        bank_targets([("m0", 0)], {"m1": items["m1"]}, "held-out")  # a training row among the held-out


@pytest.mark.slow  # loads the real base model and runs ~12 short forward passes: ~45 s on two cores
def test_stage1_caches_run_time_states_and_resumes_without_recomputing(tmp_path):
    bank = make_bank(tmp_path / "bank", 10)
    out = tmp_path / "run"
    settings = DistillSettings(bank=bank, out=str(out), k_min=0, k_max=1, heldout_fraction=0.3, seed=0,
                               max_context_tokens=1024, device="cpu")
    hs = HeadSettings(head_epochs=3, head_batch=4, eval_k=1)
    final = run_head_stage(settings, hs, PROMPTS, progress=False)
    x, y, done = load_features(out / FEATURES, "train")
    _, _, held = load_features(out / FEATURES, "heldout")
    assert len(done) + len(held) == 10 and held and all(k == 1 for _, k in held)
    history = json.loads((out / "head_history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3] and np.isfinite(history[-1]["heldout_kl"])
    curve = json.loads((out / "data_curve.json").read_text())
    assert [c["fraction"] for c in curve["curve"]] == [0.125, 0.25, 0.5, 1.0]
    # The cached state is the one predict computes at run time: the saved student reproduces the head's
    # output on it.
    student = DualHeadStudent.from_pretrained(final, PROMPTS, device="cpu")
    j = next(n for n, (_, k) in enumerate(done) if k == 0)  # seed 0 draws K = 0 for some item
    item = next(memory_item(i) for i in range(10) if f"m{i}" == done[j][0])
    p, _ = student.predict(item.query, [])
    with torch.no_grad():
        h, _ = student._commitment_hidden(student.encoder.fit(item.query, []))
        q = torch.softmax(student.head(x[j:j + 1]), -1)[0].double().numpy()
    assert torch.allclose(x[j], h.float(), rtol=2e-3, atol=2e-3)  # the cache stores float16
    assert np.allclose(p, q / q.sum(), atol=2e-3)
    # A rerun with more epochs reuses the cache (shards untouched) and continues the head's history.
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / FEATURES).iterdir()}
    run_head_stage(settings, HeadSettings(head_epochs=5, head_batch=4, eval_k=1), PROMPTS, progress=False)
    assert [h["epoch"] for h in json.loads((out / "head_history.json").read_text())] == [1, 2, 3, 4, 5]
    assert {p.name: p.stat().st_mtime_ns for p in (out / FEATURES).iterdir()} == stamps
    with pytest.raises(ValueError, match="other head settings"):
        run_head_stage(settings, HeadSettings(head_epochs=6, head_batch=4, eval_k=1, head_lr=0.5), PROMPTS,
                       progress=False)
    # Two processes' parts fill the same cache as one process did.
    split = tmp_path / "split"
    for part in ("0/2", "1/2"):
        assert run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(split)}), hs, PROMPTS,
                              progress=False, features="only", part=CachePart.parse(part)) is None
    assert sorted(p.name for p in (split / FEATURES).iterdir()) == sorted(stamps)
    xs, ys, split_rows = load_features(split / FEATURES, "train")
    assert split_rows == done and torch.equal(ys, y) and torch.allclose(xs, x, atol=2e-3)
    # --cache-like computes exactly the shards another cache of the same plan holds: here its training shard,
    # not the held-out one it lacks; a cache of another plan (K drawn otherwise) is refused.
    (split / FEATURES / "heldout-00000.safetensors").unlink()
    like = tmp_path / "like"
    assert run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(like)}), hs, PROMPTS, progress=False,
                          features="only", like=split / FEATURES) is None
    assert sorted(p.name for p in (like / FEATURES).iterdir()) == sorted(p.name for p in (split / FEATURES).iterdir())
    other_k = DistillSettings(**{**settings.__dict__, "out": str(tmp_path / "like_k"), "k_min": 2, "k_max": 2})
    with pytest.raises(DistillError, match="--cache-like .* another plan"):
        run_head_stage(other_k, hs, PROMPTS, progress=False, features="only", like=split / FEATURES)
    # --features cached trains on what exists and computes nothing; with no training shard it says so.
    for shard in (split / FEATURES).glob("train-*"):
        shard.unlink()
    with pytest.raises(DistillError, match="holds no cached training rows"):
        run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(split)}), hs, PROMPTS, progress=False,
                       features="cached")
    assert not list((split / FEATURES).glob("train-*"))
    # --targets-from-bank on this cache (nothing recomputed): with the bank it was cached from, the K = 1 rows
    # are kept; with the same frames relabelled by another teacher, their prompts hold stale answers: refused.
    shutil.copytree(out / FEATURES, tmp_path / "relabel" / FEATURES)
    relabel_run = DistillSettings(**{**settings.__dict__, "out": str(tmp_path / "relabel")})
    assert run_head_stage(relabel_run, HeadSettings(head_epochs=2, head_batch=4, eval_k=1, targets_from_bank=True),
                          PROMPTS, progress=False, features="cached")
    relabelled = tmp_path / "bank_r"
    with MemoryBank.create(relabelled, SceneVectorEmbedder()) as bank_r:
        bank_r.append_many([memory_item(i, top=TOPS[(i + 1) % len(TOPS)]) for i in range(10)])
    shutil.copytree(out / FEATURES, tmp_path / "relabel2" / FEATURES)
    with pytest.raises(DistillError, match="have K > 0 and another teacher's target"):
        run_head_stage(DistillSettings(**{**relabel_run.__dict__, "bank": str(relabelled),
                                          "out": str(tmp_path / "relabel2")}),
                       HeadSettings(head_epochs=2, head_batch=4, eval_k=1, targets_from_bank=True), PROMPTS,
                       progress=False, features="cached")
    # The head beside the scene vector (--head-scene-vector) trains on the same cache (nothing recomputed):
    # the saved student needs xi_t and reads it, and its states are still the run-time ones.
    shutil.copytree(out / FEATURES, tmp_path / "fused" / FEATURES)
    fused = run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(tmp_path / "fused")}),
                           HeadSettings(head_epochs=3, head_batch=4, eval_k=1, scene_vector="all"), PROMPTS,
                           progress=False, features="cached")
    with_xi = DualHeadStudent.from_pretrained(fused, PROMPTS, device="cpu")
    assert with_xi.config.head_scene_dim == SCENE_VECTOR_DIM and with_xi.head.scene_scale.ne(1).any()
    with pytest.raises(SceneVectorError, match="pass scene_vector"):
        with_xi.predict(item.query, [])
    p, _ = with_xi.predict(item.query, [], scene_vector=item.scene_vector)
    with torch.no_grad():
        q = torch.softmax(with_xi.head(x[j:j + 1], torch.from_numpy(item.scene_vector)), -1)[0].double().numpy()
    assert np.allclose(p, q / q.sum(), atol=2e-3)
    other, _ = with_xi.predict(item.query, [], scene_vector=memory_item(9).scene_vector)
    assert not np.allclose(p, other)  # the head reads the vector, not only the prompt
    # "ego-road": the head reads xi_t's leading values only, so the recent decisions and the objects' slots
    # leave its output where it was and the ego-and-road values move it.
    shutil.copytree(out / FEATURES, tmp_path / "ego" / FEATURES)
    ego = DualHeadStudent.from_pretrained(
        run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(tmp_path / "ego")}),
                       HeadSettings(head_epochs=3, head_batch=4, eval_k=1, scene_vector="ego-road"), PROMPTS,
                       progress=False, features="cached"), PROMPTS, device="cpu")
    assert ego.config.head_scene_dim == SCENE_VECTOR_EGO_ROAD_DIM < SCENE_VECTOR_DIM
    v = np.asarray(item.scene_vector, dtype=np.float32)
    slots, own = v.copy(), v.copy()
    slots[SCENE_VECTOR_EGO_ROAD_DIM:] += 1.0
    own[:SCENE_VECTOR_EGO_ROAD_DIM] += 1.0
    base, _ = ego.predict(item.query, [], scene_vector=v)
    # (1e-6: the later calls reuse the prompt's KV cache, which rounds the last token's state apart)
    assert np.allclose(ego.predict(item.query, [], scene_vector=slots)[0], base, rtol=0, atol=1e-6)
    assert not np.allclose(ego.predict(item.query, [], scene_vector=own)[0], base, rtol=0, atol=1e-3)
    # "ego-road-timing": the same and the objects' timing, which follows xi_t in the head's scene values
    # (read back from each item's query in training); the slots and recent decisions still leave it unmoved.
    shutil.copytree(out / FEATURES, tmp_path / "timing" / FEATURES)
    timed = DualHeadStudent.from_pretrained(
        run_head_stage(DistillSettings(**{**settings.__dict__, "out": str(tmp_path / "timing")}),
                       HeadSettings(head_epochs=3, head_batch=4, eval_k=1, scene_vector="ego-road-timing"), PROMPTS,
                       progress=False, features="cached"), PROMPTS, device="cpu")
    assert timed.config.head_scene_dim == SCENE_VECTOR_EGO_ROAD_DIM + SCENE_TIMING_DIM
    values = item_head_values(item)
    with pytest.raises(SceneVectorError, match=f"expected {HEAD_SCENE_VALUES_DIM} finite values"):
        timed.predict(item.query, [], scene_vector=v)  # xi_t alone lacks the timing
    base, _ = timed.predict(item.query, [], scene_vector=values)
    slots, timing = values.copy(), values.copy()
    slots[SCENE_VECTOR_EGO_ROAD_DIM:SCENE_VECTOR_DIM] += 1.0
    timing[SCENE_VECTOR_DIM:] -= 0.5
    assert np.allclose(timed.predict(item.query, [], scene_vector=slots)[0], base, rtol=0, atol=1e-6)
    assert not np.allclose(timed.predict(item.query, [], scene_vector=timing)[0], base, rtol=0, atol=1e-3)
    # Stage 2 (--stage joint --init) continues from a stage-1 student (here the one that reads xi_t).
    joint = DistillSettings(bank=bank, out=str(tmp_path / "joint"), init=str(fused), max_steps=1, batch_size=1,
                            grad_accum=1, k_min=0, k_max=1, heldout_fraction=0.3, max_context_tokens=1024,
                            device="cpu")
    second = distill(joint, prompts=PROMPTS, progress=False)
    assert [h["step"] for h in json.loads((tmp_path / "joint" / "history.json").read_text())] == [1]
    assert DualHeadStudent.from_pretrained(second, PROMPTS, device="cpu").config.head_scene_dim == SCENE_VECTOR_DIM


def test_head_learning_rate_decays_linearly_over_head_epochs():
    from luna_offline.distill_head import head_lr_factor

    assert [round(head_lr_factor(e, 4, 0.1), 6) for e in range(4)] == [1.0, 0.7, 0.4, 0.1]
    assert head_lr_factor(3, 4, 1.0) == 1.0  # 1.0: the constant rate of the session-7 recipe
    with pytest.raises(ValueError, match="head_lr_final must be in"):
        HeadSettings(head_lr_final=0.0)
    # The schedule is applied: the same run at a constant rate ends with other weights.
    heads = []
    for final in (1.0, 0.2):
        heads.append(head())
        train_head(heads[-1], rows(40), rows(12, seed=1), HeadSettings(head_epochs=3, head_batch=8, head_lr=0.01,
                                                                       head_lr_final=final), seed=3, progress=False)
    first = [torch.equal(a, b) for a, b in zip(heads[0].state_dict().values(), heads[1].state_dict().values())]
    assert not all(first)


def test_validation_scenarios_stop_the_head_early_and_never_see_training():
    """Validation rows come from whole training scenarios other than the held-out split's choice; the head
    ends as it was at the epoch of the lowest validation KL, and a resumed run keeps the same one."""
    ids = [(f"s{i // 4}@{i % 4}", 1) for i in range(200)]  # 50 scenarios of 4 frames
    x, y = rows(200)
    (tx, _), (vx, _) = split_validation(x, y, ids, 0.2)
    val_groups = {i.split("@")[0] for i, _ in ids if is_validation(i, 0.2)}
    assert 0 < len(vx) < 200 and len(tx) + len(vx) == 200 and len(vx) == 4 * len(val_groups)
    assert not is_validation("s1@0", 0.0)
    settings = HeadSettings(head_epochs=12, head_batch=8, head_lr=0.05, head_lr_final=1.0)
    train, val, held = (x[:120], y[:120]), (x[120:160], y[120:160]), rows(12, seed=1)
    h = head()
    history = train_head(h, train, held, settings, seed=3, val=val, progress=False)
    kept = best_epoch(history)
    assert kept["val_kl"] == min(r["val_kl"] for r in history)
    assert kl_and_accuracy(h, *val)[0] == pytest.approx(kept["val_kl"], abs=1e-6)
    assert best_epoch([{"epoch": 1, "heldout_kl": 0.5}])["epoch"] == 1  # without validation: the last epoch
