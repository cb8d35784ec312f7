"""LoRA adapters merged into the base weights without peft: the student's inference load path.

A LoRA adapter on a linear layer computes ``W x + s * B (A x)`` with ``s = lora_alpha / lora_r`` (dropout
is off at inference), which equals ``(W + s * B @ A) x``. Folding the product into ``W`` once at load
time has two effects (issue 17, docs/benchmarks.md "Restart after kill -9 under `luna up`"):

* no ``import peft`` (it pulls in bitsandbytes and transformers' model code: ~10 s on a loaded machine,
  paid at every restart of the decision process);
* each forward pass is one matmul per adapted layer instead of three (no LoRA side branches).

The adapter file is the one ``DualHeadStudent.save_pretrained`` writes (peft's state-dict keys, adapter
name removed): ``base_model.model.<module>.lora_A.weight`` (r, in) and ``...lora_B.weight`` (out, r).
Training keeps peft (``DualHeadStudent.from_pretrained(..., for_training=True)``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from luna_core.student.errors import StudentModelFileError

#: What peft prefixes every key of a causal LM's adapter state dict with.
PEFT_PREFIX = "base_model.model."
_PARTS = ("lora_A", "lora_B")


@dataclass
class MergedAdapter:
    """The adapter factors merged into a model, kept (they are small) to save or disable the adapter."""

    state: dict[str, torch.Tensor]  # the adapter file's tensors as read (CPU), keys as in the file
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A, B) on the model's device
    scaling: float


def adapted_linears(lm: nn.Module, targets: Sequence[str]) -> dict[str, nn.Linear]:
    """The linear layers peft adapts for ``target_modules=targets``: names equal to or ending in
    ``.<target>`` (peft's rule for a list of names)."""
    return {name: m for name, m in lm.named_modules()
            if isinstance(m, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)}


def _split_key(key: str) -> tuple[str, str] | None:
    """``base_model.model.<module>.lora_A.weight`` -> (module, "lora_A"); None for any other key."""
    for part in _PARTS:
        suffix = f".{part}.weight"
        if key.startswith(PEFT_PREFIX) and key.endswith(suffix):
            return key[len(PEFT_PREFIX):-len(suffix)], part
    return None


def _add_product(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
    """``w += scaling * B @ A`` in place: one fused BLAS call for float32 weights (a separate product,
    sum and copy took 10-40x longer on the loaded 2-core machine: ~1 s for the 120 layers of the
    bundled student), else the product in float32 and one rounding to the weight dtype."""
    if w.dtype == torch.float32:
        w.addmm_(b.float(), a.float(), alpha=scaling)
    else:
        w.copy_((w.float() + (b.float() @ a.float()) * scaling).to(w.dtype))


def merge_lora(lm: nn.Module, adapter: dict[str, torch.Tensor], targets: Sequence[str], r: int,
               alpha: float, where: Path) -> MergedAdapter:
    """Add ``(alpha / r) * B @ A`` to the weight of every adapted linear of ``lm``, in place.

    Raises ``StudentModelFileError`` naming ``where`` (the adapter file) when the adapter does not fit:
    a key that is not a LoRA factor of an adapted layer, a layer without both factors, or a shape
    that does not match the layer and the rank. Nothing is changed unless everything fits.
    """
    layers = adapted_linears(lm, targets)
    found: dict[str, dict[str, torch.Tensor]] = {}
    unexpected: list[str] = []
    for key, value in adapter.items():
        split = _split_key(key)
        if split is None or split[0] not in layers:
            unexpected.append(key)
            continue
        found.setdefault(split[0], {})[split[1]] = value
    missing = [f"{name}.{part}" for name in layers for part in _PARTS if part not in found.get(name, {})]
    if missing or unexpected:
        raise StudentModelFileError(f"{where}: adapter does not fit the model (missing {missing[:3]}, "
                                    f"unexpected {unexpected[:3]})")
    scaling = float(alpha) / float(r)
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, layer in layers.items():
        a, b = found[name]["lora_A"], found[name]["lora_B"]
        if tuple(a.shape) != (r, layer.in_features) or tuple(b.shape) != (layer.out_features, r):
            raise StudentModelFileError(
                f"{where}: {name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the layer "
                f"({layer.out_features} x {layer.in_features}) with rank {r}")
        factors[name] = (a.to(layer.weight.device), b.to(layer.weight.device))
    with torch.no_grad():
        for name, (a, b) in factors.items():
            _add_product(layers[name].weight, a, b, scaling)
    return MergedAdapter(state={k: v.detach().to("cpu") for k, v in adapter.items()}, factors=factors,
                         scaling=scaling)


@contextmanager
def unmerged(lm: nn.Module, merged: MergedAdapter) -> Iterator[None]:
    """The base model inside the block: the merged weights are set aside and ``W - s * B @ A`` used
    (the base weights to within one rounding of the weight dtype), then restored exactly."""
    modules = dict(lm.named_modules())
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, (a, b) in merged.factors.items():
                w = modules[name].weight
                saved[name] = w.detach().clone()
                _add_product(w, a, b, -merged.scaling)
        yield
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                modules[name].weight.copy_(w)
