"""DualHeadStudent on the real SmolLM2-135M-Instruct base (loaded once per module)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from luna_core.student import (BaseModelMismatchError, ContextOverflowError, DualHeadStudent,
                               StudentConfig, StudentConfigError, StudentModelFileError)
from luna_core import model_cache
from luna_core.prompts import knowledge
from luna_core.student import files
from luna_core.student.context import PromptEncoder, chat_ids, named_objects, student_encoder, student_messages
from luna_core.types import ACTION_CODES
from tests.unit.core.test_student_support import PROMPTS, memory_item, query

torch.set_num_threads(1)  # the CI machine is shared: one thread avoids OpenMP spin under contention


@pytest.fixture(scope="module")
def student() -> DualHeadStudent:
    torch.manual_seed(0)
    s = DualHeadStudent.from_base(StudentConfig(device="cpu"), PROMPTS)
    # A non-zero adapter, so that saving and loading has something to lose.
    with torch.no_grad():
        for name, p in s.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    return s


def test_predict_is_a_distribution_over_the_ten_actions(student):
    p, lat = student.predict(query(), [memory_item(1)])
    assert p.shape == (10,)
    assert np.all(p > 0) and abs(p.sum() - 1.0) < 1e-9
    assert lat.examples_used == 1 and lat.prompt_tokens > 50 and lat.forward > 0


def test_commitment_position_is_the_last_token_of_the_generation_prompt(student):
    fitted = student.encoder.fit(query(), [])
    tail = student.tokenizer.decode(fitted.input_ids[-4:], skip_special_tokens=False)
    assert tail.endswith("<|im_start|>assistant\n")
    assert fitted.commit_index == len(fitted.input_ids) - 1
    # predict's head input is the decoder state at i* of the full prompt (no prefix cache here)
    with torch.inference_mode():
        h = student.decoder(input_ids=torch.tensor([fitted.input_ids])).last_hidden_state[0, fitted.commit_index]
        expected = student.dpp_probabilities(h).double().numpy()
    p, _ = student.predict(query(), [])
    np.testing.assert_allclose(p, expected, atol=1e-5)


def test_kv_cache_of_the_shared_prefix_gives_the_same_distribution(student):
    q, ex = query(3), [memory_item(2), memory_item(3)]
    other_scene, other_examples = query(1), [memory_item(4)]
    student.config.reuse_prefix_cache = False
    try:
        reference = {key: student.predict(*key_args)
                     for key, key_args in (("q", (q, ex)), ("scene", (other_scene, ex)),
                                           ("examples", (other_scene, other_examples)))}
    finally:
        student.config.reuse_prefix_cache = True
    assert all(lat.cached_prefix_tokens == 0 for _, lat in reference.values())
    ids = {"q": student.encoder.fit(q, ex).input_ids, "scene": student.encoder.fit(other_scene, ex).input_ids,
           "examples": student.encoder.fit(other_scene, other_examples).input_ids}
    p1, _ = student.predict(q, ex)
    p_again, lat_again = student.predict(q, ex)  # same prompt: everything but i* from the cache
    p_scene, lat_scene = student.predict(other_scene, ex)  # same examples, another scene
    p_examples, lat_examples = student.predict(other_scene, other_examples)  # other examples
    p_back, lat_back = student.predict(q, ex)
    assert lat_again.cached_prefix_tokens == len(ids["q"]) - 1
    shared_scene = next(i for i, (a, b) in enumerate(zip(ids["q"], ids["scene"])) if a != b)
    shared_examples = next(i for i, (a, b) in enumerate(zip(ids["scene"], ids["examples"])) if a != b)
    assert lat_scene.cached_prefix_tokens == shared_scene
    assert lat_examples.cached_prefix_tokens == shared_examples
    assert lat_back.cached_prefix_tokens == next(i for i, (a, b) in enumerate(zip(ids["examples"], ids["q"]))
                                                 if a != b)
    # the system message and both examples are reused when only the scene changes
    assert shared_scene > len(student.encoder.fit(q, ex[:1]).input_ids) > shared_examples > 20
    for p, key in ((p1, "q"), (p_again, "q"), (p_scene, "scene"), (p_examples, "examples"), (p_back, "q")):
        np.testing.assert_allclose(p, reference[key][0], atol=1e-5)
    assert np.abs(p_scene - p1).max() > 1e-6  # a different scene gives a different answer


def test_action_mask_zeroes_and_renormalises(student):
    mask = np.zeros(10, dtype=bool)
    mask[[ACTION_CODES.index("CK"), ACTION_CODES.index("DK")]] = True
    p_all, _ = student.predict(query(), [])
    p, _ = student.predict(query(), [], mask=mask)
    assert np.all(p[~mask] == 0.0) and abs(p.sum() - 1.0) < 1e-9
    ck, dk = ACTION_CODES.index("CK"), ACTION_CODES.index("DK")
    assert p[ck] / p[dk] == pytest.approx(p_all[ck] / p_all[dk], rel=1e-6)
    with pytest.raises(ValueError, match="action mask"):
        student.predict(query(), [], mask=np.zeros(10, dtype=bool))
    with pytest.raises(ValueError, match="action mask"):
        student.predict(query(), [], mask=np.ones(9, dtype=bool))


def test_empty_query_is_rejected(student):
    with pytest.raises(ValueError, match="empty"):
        student.predict("   ", [])


def test_context_policy_drops_examples_then_far_objects_then_fails(student):
    enc = student.encoder
    q = query(6)
    examples = [memory_item(i, n_objects=4) for i in range(3)]
    full = enc.fit(q, examples)
    no_examples = enc.fit(q, [])
    old = enc.max_tokens
    try:
        enc.max_tokens = len(no_examples.input_ids) + 5  # room for the query but for no example
        fitted = enc.fit(q, examples)
        assert (fitted.examples_used, fitted.objects_dropped) == (0, 0) and fitted.truncated
        enc.max_tokens = len(no_examples.input_ids) - 20  # the query itself must shrink
        fitted = enc.fit(q, examples)
        assert fitted.examples_used == 0 and fitted.objects_dropped >= 1
        assert "veh0" in fitted.query and "veh5" not in fitted.query  # the farthest object went first
        enc.max_tokens = 50  # even the system message does not fit
        with pytest.raises(ContextOverflowError, match="budget"):
            enc.fit(q, examples)
    finally:
        enc.max_tokens = old
    assert full.examples_used == 3 and not full.truncated


def _encoder(student, **prompt) -> PromptEncoder:
    """The encoder of ``student``'s tokenizer under a config with these prompt fields."""
    return student_encoder(student.tokenizer, PROMPTS, StudentConfig(**prompt))


def test_example_objects_keeps_the_nearest_objects_of_each_example_only(student):
    q = query(6)
    examples = [memory_item(i, n_objects=4) for i in range(3)]
    full = student.encoder.fit(q, examples)
    fitted = _encoder(student, example_objects=1).fit(q, examples)
    assert fitted.examples_used == 3 and not fitted.truncated
    assert len(fitted.input_ids) < len(full.input_ids) - 3 * 2 * 10, "three object lines less per example"
    example_queries = [m["content"] for m in fitted.messages[1:-1] if m["role"] == "user"]
    assert len(example_queries) == 3 and all("veh0" in t and "veh1" not in t for t in example_queries), \
        "each example keeps its nearest object"
    assert fitted.messages[-1] == full.messages[-1], "the current query keeps every object"
    assert student_messages(PROMPTS.md_messages, StudentConfig()) == PROMPTS.md_messages
    with pytest.raises(StudentConfigError, match="example_objects"):
        StudentConfig(example_objects=-1)


def test_an_example_keeps_the_objects_its_answer_names(student):
    q = query(2)
    item = memory_item(1, n_objects=4)
    item = replace(item, answer=f"{item.answer.strip()}\n- DK: Vehicle veh3 40 m ahead (same lane) at 5 m/s; clear.")
    assert named_objects(item.answer) == {"veh3"}
    example = _encoder(student, example_objects=1).fit(q, [item]).messages[1]["content"]
    assert "veh0" in example and "veh3" in example, "the nearest and the named object stay"
    assert "veh1" not in example and "veh2" not in example


def test_query_objects_keeps_the_nearest_objects_of_the_current_query(student):
    fitted = _encoder(student, query_objects=2).fit(query(6), [memory_item(1, n_objects=4)])
    current = fitted.messages[-1]["content"]
    assert "veh0" in current and "veh1" in current and "veh2" not in current
    assert all(f"veh{i}" in fitted.messages[1]["content"] for i in range(4)), "examples keep every object"
    with pytest.raises(StudentConfigError, match="query_objects"):
        StudentConfig(query_objects=-2)


def test_brief_form_states_the_same_traffic_state_in_fewer_tokens(student):
    q, examples = query(4), [memory_item(i, n_objects=3) for i in range(2)]
    compact = student.encoder.fit(q, examples)
    brief = _encoder(student, prompt_form="brief").fit(q, examples)
    assert knowledge.BRIEF_FORM in brief.messages[0]["content"], "the layout is stated once, in the system turn"
    current = brief.messages[-1]["content"]
    assert "Traffic light: None." not in current and "Navigation: None." not in current
    assert current.startswith("Road: ") and "\nEgo: " in current and "acceleration" not in current
    assert [ln for ln in current.split("\n") if ln.startswith("- ")] == \
        [ln for ln in compact.messages[-1]["content"].split("\n") if ln.startswith("- ")], "objects unchanged"
    assert [m["content"] for m in brief.messages if m["role"] == "assistant"] == \
        [m["content"] for m in compact.messages if m["role"] == "assistant"], "answers unchanged"
    system = len(chat_ids(student.tokenizer, brief.messages[:1]))
    compact_system = len(chat_ids(student.tokenizer, compact.messages[:1]))
    assert len(brief.input_ids) - system < len(compact.input_ids) - compact_system - 3 * 10, \
        "each of the three traffic states is shorter after the (cached) system turn"
    with pytest.raises(StudentConfigError, match="prompt_form"):
        StudentConfig(prompt_form="terse")


def test_rounded_form_is_the_brief_form_with_whole_numbers_and_the_steady_lines_first(student):
    q, examples = query(4), [memory_item(i, n_objects=3) for i in range(2)]
    brief = _encoder(student, prompt_form="brief").fit(q, examples)
    rounded = _encoder(student, prompt_form="rounded").fit(q, examples)
    assert rounded.messages[0]["content"].endswith(knowledge.ROUNDED_FORM)
    for short, whole in zip(brief.messages[1:], rounded.messages[1:], strict=True):
        if short["role"] == "assistant":
            assert whole == short, "answers unchanged"
            continue
        a_lines, b_lines = short["content"].split("\n"), whole["content"].split("\n")
        objects = list(zip([ln for ln in a_lines if ln.startswith("- ")], [ln for ln in b_lines if ln.startswith("- ")],
                           strict=True))
        assert objects and all("." not in b.split(": ", 1)[1].rstrip(".") for _, b in objects)
        for a, b in objects:  # each number is the brief one rounded, in the same place
            numbers = [re.findall(r"-?\d+(?:\.\d+)?", line.split(": ", 1)[1]) for line in (a, b)]
            assert all(abs(float(x) - float(y)) <= 0.5 for x, y in zip(*numbers, strict=True))
            assert a.split(": ", 1)[0] == b.split(": ", 1)[0], "the id, type and relation unchanged"
        others = sorted(ln for ln in a_lines if not ln.startswith("- "))
        assert others == sorted(ln for ln in b_lines if not ln.startswith("- ")), "the ego keeps its 0.1"
        ego = next(i for i, ln in enumerate(b_lines) if ln.startswith("Ego:"))
        assert any(ln.startswith(knowledge.ACTION_SET_TAG) for ln in b_lines[:ego]), "the action set before the ego"
        assert any(ln.startswith("Recent:") for ln in b_lines[:ego]) == any(ln.startswith("Recent:") for ln in a_lines)
    assert len(rounded.input_ids) < len(brief.input_ids) - 4 * 3, "fewer digits in the 3 traffic states"


def test_query_line_breakdown_adds_up_to_the_query_and_counts_digits(student):
    """benchmarks/prompt_lengths.py --query-lines: where a query's tokens go."""
    from tests.benchmark_scripts import load_benchmark

    lengths = load_benchmark("prompt_lengths")
    encoder = _encoder(student, prompt_form="brief")
    queries = [encoder.fit(query(n), []).messages[-1]["content"] for n in (1, 3)]
    rows = lengths.query_line_tokens(student.tokenizer, queries)
    kinds = {kind: (share, tokens, digits) for kind, share, tokens, digits in rows}
    whole = kinds.pop("whole query")
    assert rows[-1][0] == "whole query" and kinds["object lines"][0] == 100.0 and kinds["Ego"][2] > 0
    assert whole[1] == pytest.approx(sum(t for _, t, _ in kinds.values()))
    per_line = sum(len(student.tokenizer(ln, add_special_tokens=False)["input_ids"])
                   for q in queries for ln in q.split("\n")) / 2
    assert whole[1] == pytest.approx(per_line) and 0 < whole[2] < whole[1]
    assert kinds["object lines"][1] > kinds["Ego"][1], "two object lines a query (the mean) outweigh the ego line"


def test_explain_starts_with_the_ranked_codes_and_can_be_stopped(student):
    e = student.explain(query(), [memory_item(1)], ["CK", "DK"], max_new_tokens=4)
    assert e.text.startswith("Recommended decisions: CK,DK\n")
    assert e.text.startswith(e.prefix) and e.generated_tokens <= 4
    assert e.stop_reason in ("eos", "max_tokens")
    stop = threading.Event()
    stop.set()
    e = student.explain(query(), [], ["AK"], stop=stop)
    assert (e.stop_reason, e.generated_tokens, e.text) == ("stop_requested", 0, e.prefix)
    e = student.explain(query(), [], ["AK"], max_time=0.0)
    assert e.stop_reason == "max_time"
    with pytest.raises(ValueError):
        student.explain(query(), [], ["XX"])


def test_explanation_read_in_chunks_equals_one_pass(student):
    args = (query(2), [memory_item(1)], ["CK", "DK"])
    old = student.config.explanation_prefill_chunk
    try:
        student.config.explanation_prefill_chunk = 4096  # the whole prompt in one step
        whole = student.explain(*args, max_new_tokens=6)
        student.config.explanation_prefill_chunk = 16
        chunked = student.explain(*args, max_new_tokens=6)
    finally:
        student.config.explanation_prefill_chunk = old
    assert whole.prompt_tokens > 100 and chunked.generated_tokens == whole.generated_tokens >= 1
    assert chunked.text == whole.text


def test_predict_while_explaining_gives_the_idle_answer(student):
    idle, _ = student.predict(query(2), [])
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        e=student.explain(query(3), [memory_item(4)], ["CK"], max_new_tokens=12)))
    worker.start()
    busy, _ = student.predict(query(2), [])
    worker.join(timeout=120)
    assert not worker.is_alive() and result["e"].generated_tokens >= 1
    np.testing.assert_allclose(busy, idle, atol=1e-6)


def test_save_and_load_round_trip_and_bad_files(student, tmp_path):
    q, ex = query(2), [memory_item(5)]
    p, _ = student.predict(q, ex)
    out = student.save_pretrained(tmp_path / "student")
    assert sorted(x.name for x in out.iterdir()) == sorted(
        [files.CONFIG_FILE, files.META_FILE, files.ADAPTER_FILE, files.HEAD_FILE])
    loaded = DualHeadStudent.from_pretrained(out, PROMPTS, device="cpu")
    p2, _ = loaded.predict(q, ex)
    np.testing.assert_allclose(p2, p, atol=1e-6)
    fast = DualHeadStudent.from_pretrained(out, PROMPTS, device="cpu", autocast="bfloat16")
    p3, _ = fast.predict(q, ex)
    assert fast.lm.dtype == torch.float32 and not np.array_equal(p3, p), "the products ran in bfloat16"
    assert np.abs(p3 - p).max() < 0.05 and abs(p3.sum() - 1.0) < 1e-6

    head = (out / files.HEAD_FILE).read_bytes()
    (out / files.HEAD_FILE).write_bytes(head[:-7] + b"garbage")
    with pytest.raises(StudentModelFileError, match="corrupt"):
        DualHeadStudent.from_pretrained(out, PROMPTS)
    (out / files.HEAD_FILE).unlink()
    with pytest.raises(StudentModelFileError, match="missing"):
        DualHeadStudent.from_pretrained(out, PROMPTS)
    (out / files.HEAD_FILE).write_bytes(head)

    meta = json.loads((out / files.META_FILE).read_text())
    base = model_cache.resolve(student.config.base_model)
    assert meta["base_model_hash"] == files.base_model_hash(base)
    meta["base_model_hash"] = files.base_model_hash(base, legacy=True)  # a meta written before session 17
    (out / files.META_FILE).write_text(json.dumps(meta))
    np.testing.assert_allclose(DualHeadStudent.from_pretrained(out, PROMPTS).predict(q, ex)[0], p, atol=1e-6)
    meta["base_model_hash"] = "0" * 64  # as if trained on another base
    (out / files.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(BaseModelMismatchError, match="hash"):
        DualHeadStudent.from_pretrained(out, PROMPTS)
    (out / files.META_FILE).write_text("{not json")
    with pytest.raises(StudentModelFileError, match="JSON"):
        DualHeadStudent.from_pretrained(out, PROMPTS)
    with pytest.raises(StudentModelFileError, match="not a directory"):
        DualHeadStudent.from_pretrained(tmp_path / "nowhere", PROMPTS)


def test_base_model_hash_ignores_the_writers_version_only(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"weights")
    config = {"hidden_size": 576, "transformers_version": "5.23.0"}
    (base / "config.json").write_text(json.dumps(config))
    h, legacy = files.base_model_hash(base), files.base_model_hash(base, legacy=True)
    (base / "config.json").write_text(json.dumps({**config, "transformers_version": "5.17.0"}, indent=2))
    assert files.base_model_hash(base) == h  # another writer, the same model
    assert files.base_model_hash(base, legacy=True) != legacy
    (base / "config.json").write_text(json.dumps({**config, "hidden_size": 512}))
    assert files.base_model_hash(base) != h
    (base / "config.json").write_text("[1, 2]")
    with pytest.raises(StudentModelFileError, match="not a JSON object"):
        files.base_model_hash(base)


def test_config_validation_names_the_field():
    with pytest.raises(StudentConfigError, match="lora_r"):
        StudentConfig(lora_r=0)
    with pytest.raises(StudentConfigError, match="device"):
        StudentConfig(device="tpu")
    with pytest.raises(StudentConfigError, match="explanation_max_yield"):
        StudentConfig(explanation_max_yield=float("nan"))
    with pytest.raises(StudentConfigError, match="explanation_prefill_chunk"):
        StudentConfig(explanation_prefill_chunk=0)
    with pytest.raises(StudentConfigError, match="autocast"):
        StudentConfig(autocast="int8")
    with pytest.raises(StudentConfigError, match="unknown StudentConfig keys"):
        StudentConfig.from_dict({"lora_rank": 8})
    assert StudentConfig.from_dict(StudentConfig(lora_r=8).to_dict()).lora_r == 8


def test_losses_are_finite_and_differentiable(student):
    ids, commit, used = student.encode_training_sample(query(), [memory_item(1)], memory_item(9).answer)
    assert used == 1 and commit < len(ids) - 1 and ids[-1] == student.tokenizer.eos_token_id
    x = torch.tensor([ids])
    target = torch.tensor(memory_item(9).distribution, dtype=torch.float32)[None]
    student.train()
    try:
        out = student.losses(x, torch.ones_like(x), torch.tensor([commit]), target, alpha=0.7)
        out["total"].backward()
    finally:
        student.eval()
        student.zero_grad(set_to_none=True)
    assert torch.isfinite(out["total"]) and out["kl"] > 0 and out["lm"] > 0
    assert float(out["total"]) == pytest.approx(float(out["lm"] + 0.7 * out["kl"]), rel=1e-5)
