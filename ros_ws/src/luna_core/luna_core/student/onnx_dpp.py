"""The DPP pass as an ONNX graph, run with ONNX Runtime (CUDA provider when present, else CPU).

Graph: input_ids (1, T) -> decoder with LoRA -> hidden state at the last position (i*) -> head ->
softmax -> probabilities (1, 10); T is dynamic. A head that reads the scene vector takes it as a second
input, scene_vector (1, head_scene_dim). Tokenisation and the context-length policy stay in
Python (``PromptEncoder``), identical to ``DualHeadStudent.predict``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from luna_core import model_cache
from luna_core.student import files
from luna_core.student.config import StudentConfig
from luna_core.student.context import student_encoder
from luna_core.student.errors import StudentModelFileError
from luna_core.student.model import (DualHeadStudent, PredictLatency, StudentPrompts, checked_mask,
                                     default_prompts, scene_tensor)
from luna_core.types import MemoryItem, mask_and_renormalise

ONNX_FILE = "dpp.onnx"
OPSET = 18


class _DppGraph(nn.Module):
    """What the exported graph computes: pi_hat at the last prompt token."""

    def __init__(self, student: DualHeadStudent) -> None:
        super().__init__()
        self.decoder = student.decoder
        self.head = student.head

    def forward(self, input_ids: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        # An explicit all-ones mask keeps transformers off its packed-sequence detection (aten::diff,
        # which has no ONNX symbolic); batch 1 has no padding, so the graph stays the same model.
        mask = torch.ones_like(input_ids)
        hidden = self.decoder(input_ids=input_ids, attention_mask=mask,
                              use_cache=False).last_hidden_state[:, -1]
        return torch.softmax(self.head(hidden.float(), scene), dim=-1)


def export_dpp_onnx(student: DualHeadStudent, path: str | Path) -> Path:
    """Export the DPP pass (torch.onnx.export, TorchScript exporter, opset 18); written atomically."""
    if student.device.type != "cpu" or student.config.quantization != "none":
        raise ValueError("export the ONNX graph from an unquantised student on the CPU "
                         "(DualHeadStudent.from_pretrained(dir, device='cpu'))")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    graph = _DppGraph(student).eval()
    dummy_query = "[Traffic state]\nx\n[End of traffic state]\nAction set: CK"  # any Q_md: T is dynamic
    inputs: tuple[torch.Tensor, ...] = (torch.tensor([student.encoder.fit(dummy_query, []).input_ids]),)
    names = ["input_ids"]
    if student.config.head_scene_dim:
        inputs, names = (*inputs, torch.zeros(1, student.config.head_scene_dim)), [*names, "scene_vector"]
    with torch.inference_mode():
        torch.onnx.export(graph, inputs, str(tmp), dynamo=False, opset_version=OPSET,
                          input_names=names, output_names=["probabilities"],
                          dynamic_axes={"input_ids": {1: "sequence"}})
    tmp.replace(path)
    return path


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    # onnxruntime-gpu lists the CUDA provider even without a GPU; ask torch whether one is there.
    if "CUDAExecutionProvider" in available and torch.cuda.is_available():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxDecisionPredictor:
    """``predict`` with ONNX Runtime: same prompts, same policy, same output as the torch student."""

    def __init__(self, onnx_path: str | Path, tokenizer, prompts: StudentPrompts, config: StudentConfig,
                 providers: Sequence[str] | None = None, threads: int | None = None) -> None:
        import onnxruntime as ort

        onnx_path = Path(onnx_path)
        if not onnx_path.is_file():
            raise StudentModelFileError(f"{onnx_path}: missing (export it with export_dpp_onnx)")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(onnx_path), options,
                                                providers=list(providers or default_providers()))
        except Exception as exc:  # onnxruntime raises its own exception types for bad files
            raise StudentModelFileError(f"{onnx_path}: not a loadable ONNX graph ({exc})") from exc
        self.encoder = student_encoder(tokenizer, prompts, config)
        self.config = config

    @classmethod
    def from_student_dir(cls, directory: str | Path, onnx_path: str | Path | None = None,
                         prompts: StudentPrompts | None = None, providers: Sequence[str] | None = None,
                         threads: int | None = None) -> "OnnxDecisionPredictor":
        """The graph ``<dir>/dpp.onnx`` (or ``onnx_path``) with the tokenizer of the student's base."""
        from transformers import AutoTokenizer

        directory = Path(directory)
        config = StudentConfig.load(directory / files.CONFIG_FILE)
        tokenizer = AutoTokenizer.from_pretrained(model_cache.resolve(config.base_model))
        return cls(onnx_path or directory / ONNX_FILE, tokenizer, prompts or default_prompts(), config,
                   providers, threads)

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def predict(self, scene_query: str, retrieved: Sequence[MemoryItem] = (),
                mask: np.ndarray | None = None, scene_vector: np.ndarray | None = None
                ) -> tuple[np.ndarray, PredictLatency]:
        mask = checked_mask(mask)
        scene = scene_tensor(self.config, scene_vector, torch.device("cpu"))
        t0 = time.perf_counter()
        fitted = self.encoder.fit(scene_query, retrieved)
        t1 = time.perf_counter()
        feed = {"input_ids": np.asarray([fitted.input_ids], dtype=np.int64)}
        if scene is not None:
            feed["scene_vector"] = scene.numpy()[None]
        probs = self.session.run(["probabilities"], feed)[0][0].astype(np.float64)
        t2 = time.perf_counter()
        probs = probs / probs.sum()
        if mask is not None:
            probs = mask_and_renormalise(probs, mask)
        return probs, PredictLatency(total=time.perf_counter() - t0, encode=t1 - t0, forward=t2 - t1,
                                     prompt_tokens=len(fitted.input_ids), cached_prefix_tokens=0,
                                     examples_used=fitted.examples_used,
                                     objects_dropped=fitted.objects_dropped)
