"""The exported ONNX DPP graph against the torch student (real SmolLM2 base, onnxruntime CPU provider), with
a head that reads the scene vector beside h_i* as the bundled student's does (a second graph input)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core.scene import SCENE_VECTOR_DIM
from luna_core.student import DualHeadStudent, SceneVectorError, StudentConfig, StudentModelFileError
from luna_core.student.onnx_dpp import ONNX_FILE, OnnxDecisionPredictor, export_dpp_onnx
from tests.unit.core.test_student_support import PROMPTS, memory_item, query

torch.set_num_threads(1)  # the CI machine is shared: one thread avoids OpenMP spin under contention


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(1)
    student = DualHeadStudent.from_base(StudentConfig(device="cpu", head_scene_dim=SCENE_VECTOR_DIM), PROMPTS)
    student.head.set_scene_normalisation(torch.stack([torch.from_numpy(memory_item(i).scene_vector)
                                                      for i in range(6)]))
    with torch.no_grad():
        for name, p in student.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)  # the graph must carry the adapters, so make them matter
    directory = student.save_pretrained(tmp_path_factory.mktemp("onnx") / "student")
    export_dpp_onnx(student, directory / ONNX_FILE)
    return student, directory


@pytest.mark.slow  # export + three prompt lengths in both runtimes: ~20-30 s on two cores
def test_onnx_matches_torch_at_several_prompt_lengths(exported):
    student, directory = exported
    onnx = OnnxDecisionPredictor.from_student_dir(directory, prompts=PROMPTS, threads=1)
    assert onnx.providers == ["CPUExecutionProvider"]  # no GPU here; CUDA is used when present
    lengths = set()
    for n, q, ex in ((1, query(1), []), (3, query(3), [memory_item(1)]),
                     (2, query(2), [memory_item(2), memory_item(3)])):
        xi = memory_item(n).scene_vector
        p_torch, lat_t = student.predict(q, ex, scene_vector=xi)
        p_onnx, lat_o = onnx.predict(q, ex, scene_vector=xi)
        assert lat_t.prompt_tokens == lat_o.prompt_tokens
        lengths.add(lat_o.prompt_tokens)
        np.testing.assert_allclose(p_onnx, p_torch, atol=1e-5)
        assert abs(p_onnx.sum() - 1.0) < 1e-9
    assert len(lengths) == 3  # dynamic sequence length


def test_onnx_applies_the_mask_and_rejects_a_bad_file(exported, tmp_path):
    student, directory = exported
    onnx = OnnxDecisionPredictor.from_student_dir(directory, prompts=PROMPTS, threads=1)
    mask = np.array([c.endswith("K") for c in ("AK", "AL", "AR", "CK", "CL", "CR", "DK", "DL", "DR", "SK")])
    p, _ = onnx.predict(query(1), [], mask=mask, scene_vector=memory_item(1).scene_vector)
    assert np.all(p[~mask] == 0.0) and abs(p.sum() - 1.0) < 1e-9
    with pytest.raises(SceneVectorError, match="pass scene_vector"):
        onnx.predict(query(1), [])
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx graph")
    with pytest.raises(StudentModelFileError, match="bad.onnx"):
        OnnxDecisionPredictor(bad, student.tokenizer, PROMPTS, student.config)
    with pytest.raises(StudentModelFileError, match="missing"):
        OnnxDecisionPredictor(tmp_path / "none.onnx", student.tokenizer, PROMPTS, student.config)
