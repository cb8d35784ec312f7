"""The inference load path of the student: the LoRA adapter merged into the base weights without peft.

Checked on the bundled student (models/student, SmolLM2-135M-Instruct base) against the peft-loaded
student (the form distillation trains): same probabilities, no peft module in the merged model and
none imported, the same adapter written back, the base model recoverable for zero-shot baselines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from luna_core.student import DualHeadStudent, StudentConfigError, StudentModelFileError
from luna_core.student import files
from luna_core.student.lora import merge_lora
from luna_core.student.model import scene_tensor
from tests.unit.core.test_student_support import PROMPTS, memory_item, query

torch.set_num_threads(1)  # the CI machine is shared: one thread avoids OpenMP spin under contention

REPO = Path(__file__).resolve().parents[3]
BUNDLED = REPO / "models" / "student"
XI = memory_item(0).scene_vector  # a scene vector for a head that reads one (ignored by a head on h_i* alone)


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory) -> Path:
    """The bundled student with a non-zero LoRA B (the bundled stage-1 student's adapters are still at
    their initialisation, B = 0, where merging would be a no-op and the checks below empty)."""
    student = DualHeadStudent.from_pretrained(BUNDLED, PROMPTS, device="cpu", for_training=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in student.lm.named_parameters():
            if "lora_B" in name:
                param.copy_(0.02 * torch.randn(param.shape, generator=g))
    return student.save_pretrained(tmp_path_factory.mktemp("student") / "student")


@pytest.fixture(scope="module")
def merged(trained_adapter) -> DualHeadStudent:
    return DualHeadStudent.from_pretrained(trained_adapter, PROMPTS, device="cpu")


@pytest.fixture(scope="module")
def with_peft(trained_adapter) -> DualHeadStudent:
    return DualHeadStudent.from_pretrained(trained_adapter, PROMPTS, device="cpu", for_training=True)


def test_merged_student_predicts_what_the_peft_student_predicts(merged, with_peft):
    assert merged.merged is not None and with_peft.merged is None
    assert not any("lora" in name for name, _ in merged.lm.named_modules()), "LoRA side branches left"
    assert any("lora_A" in name for name, _ in with_peft.lm.named_modules())
    for i, examples in enumerate(([], [memory_item(1)], [memory_item(2), memory_item(3)])):
        q = query(n_objects=1 + i, speed=5.0 + 3.0 * i)
        p_merged, _ = merged.predict(q, examples, scene_vector=XI)
        p_peft, _ = with_peft.predict(q, examples, scene_vector=XI)
        np.testing.assert_allclose(p_merged, p_peft, atol=1e-5, rtol=0.0)
    # the adapter is not a no-op: without it the distribution differs (else the check above is empty)
    with torch.inference_mode(), merged.adapter_disabled():
        h = merged.decoder(input_ids=torch.tensor([merged.encoder.fit(q, examples).input_ids]))
        xi = scene_tensor(merged.config, XI, merged.device)
        p_base = merged.dpp_probabilities(h.last_hidden_state[0, -1], xi).double().numpy()
    assert np.abs(p_base / p_base.sum() - p_merged).max() > 1e-3


@torch.inference_mode()
def test_adapter_disabled_gives_the_base_model_and_restores_the_merged_weights(merged, with_peft):
    ids = torch.tensor([merged.encoder.fit(query(), []).input_ids])
    before = {n: p.clone() for n, p in merged.lm.named_parameters() if "self_attn" in n}
    with merged.adapter_disabled():
        base_merged = merged.lm(input_ids=ids).logits[0, -1]
    with with_peft.adapter_disabled():
        base_peft = with_peft.lm(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(base_merged, base_peft, atol=1e-4, rtol=0.0)
    for n, p in merged.lm.named_parameters():
        if n in before:
            assert torch.equal(p, before[n]), f"{n} was not restored exactly"


def test_inference_load_imports_no_peft():
    code = ("import json, sys, torch\ntorch.set_num_threads(1)\n"
            "from luna_core.student import DualHeadStudent\n"
            "from tests.unit.core.test_student_support import PROMPTS, memory_item, query\n"
            f"s = DualHeadStudent.from_pretrained({str(BUNDLED)!r}, PROMPTS, device='cpu')\n"
            "p, _ = s.predict(query(), [], scene_vector=memory_item(0).scene_vector)\n"
            "print(json.dumps([float(p.sum()), [m for m in ('peft', 'bitsandbytes') if m in sys.modules]]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    total, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert abs(total - 1.0) < 1e-9
    assert loaded == [], f"the inference load path imported {loaded}"


def test_merged_student_saves_the_adapter_it_read(merged, trained_adapter, tmp_path):
    out = merged.save_pretrained(tmp_path / "copy")
    written = load_file(str(out / files.ADAPTER_FILE))
    original = load_file(str(trained_adapter / files.ADAPTER_FILE))
    assert written.keys() == original.keys()
    assert all(torch.equal(written[k], original[k]) for k in original)
    again = DualHeadStudent.from_pretrained(out, PROMPTS, device="cpu")
    q = query(3)
    np.testing.assert_array_equal(again.predict(q, [], scene_vector=XI)[0], merged.predict(q, [], scene_vector=XI)[0])


def test_merged_student_refuses_training(merged):
    with pytest.raises(StudentConfigError, match="for_training=True"):
        merged.train()
    merged.eval()  # eval stays allowed


def test_adapter_that_does_not_fit_is_named_and_leaves_the_weights_unchanged(merged, tmp_path):
    adapter = load_file(str(BUNDLED / files.ADAPTER_FILE))
    cfg = merged.config
    layer = next(k for k in adapter if k.endswith("q_proj.lora_A.weight"))
    weights = {n: p.clone() for n, p in merged.lm.named_parameters()}
    where = tmp_path / "adapter.safetensors"
    missing = {k: v for k, v in adapter.items() if k != layer}
    with pytest.raises(StudentModelFileError, match=r"adapter\.safetensors.*missing \['model\.layers"):
        merge_lora(merged.lm, missing, cfg.lora_targets, cfg.lora_r, cfg.lora_alpha, where)
    extra = dict(adapter, **{"base_model.model.lm_head.lora_A.weight": adapter[layer]})
    with pytest.raises(StudentModelFileError, match="unexpected"):
        merge_lora(merged.lm, extra, cfg.lora_targets, cfg.lora_r, cfg.lora_alpha, where)
    wrong_rank = dict(adapter, **{layer: adapter[layer][:-1]})
    with pytest.raises(StudentModelFileError, match="do not fit the layer"):
        merge_lora(merged.lm, wrong_rank, cfg.lora_targets, cfg.lora_r, cfg.lora_alpha, where)
    for n, p in merged.lm.named_parameters():
        assert torch.equal(p, weights[n]), f"{n} changed by a failed merge"
    # the same refusal through from_pretrained, for a saved student whose adapter lost a factor
    folder = merged.save_pretrained(tmp_path / "broken")
    save_file(missing, str(folder / files.ADAPTER_FILE))
    meta = json.loads((folder / files.META_FILE).read_text())
    meta["files"][files.ADAPTER_FILE] = files.file_sha256(folder / files.ADAPTER_FILE)
    (folder / files.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(StudentModelFileError, match="adapter does not fit"):
        DualHeadStudent.from_pretrained(folder, PROMPTS, device="cpu")
