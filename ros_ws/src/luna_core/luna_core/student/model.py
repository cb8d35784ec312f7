"""The dual-head student (LUNA-AD Sec. III-C, Fig. 3): a causal LM with LoRA adapters plus the DPP head.

- ``predict`` (Eq. 16): one forward pass of the decoder over the prompt, no generation; the head reads
  the hidden state at the decision commitment position i* (last prompt token after the generation
  prompt) and returns pi_hat over the 10 actions (optionally masked and renormalised).
- ``explain`` (Eq. 25-28): the probability-ranked action codes as the answer prefix Delta A_md, then
  greedy generation; interruptible (stop flag, time budget) and yielding to ``predict`` between
  tokens, so one shared instance keeps the periodic decision on time while text is generated.
- ``losses`` (Eq. 15-18): L_LM over the sequence + alpha * KL(pi || pi_hat) for distillation.

Two forms of the LoRA adapters: peft's modules (``from_base``, ``from_pretrained(for_training=True)``:
trainable, used by distillation), or, for inference (``from_pretrained`` by default), the adapter merged
into the base weights by ``luna_core.student.lora`` without importing peft (issue 17: ``import peft``
alone took ~10 s of the decision process's restart; a merged forward pass also skips the side branches).
"""

from __future__ import annotations

import contextlib
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from luna_core import model_cache
from luna_core.student import files
from luna_core.student.config import StudentConfig
from luna_core.student.context import FittedPrompt, Message, student_encoder
from luna_core.student.errors import (BaseModelMismatchError, SceneVectorError, StudentConfigError,
                                      StudentModelFileError)
from luna_core.student.head import DecisionHead, HeadEnsemble
from luna_core.student.lora import MergedAdapter, merge_lora, unmerged
from luna_core.types import NUM_ACTIONS, MemoryItem, mask_and_renormalise


class StudentPrompts(Protocol):
    """What the student needs from the prompt manager (``luna_core.prompts.PromptManager``)."""

    def md_messages(self, query: str, examples: Sequence[MemoryItem] = ()) -> list[Message]: ...

    def explanation_prefix(self, ranked_codes: Sequence[str]) -> str: ...


@dataclass
class PredictLatency:
    """Where the time of one ``predict`` call went (seconds) and what the prompt looked like."""

    total: float
    encode: float
    forward: float
    prompt_tokens: int
    cached_prefix_tokens: int
    examples_used: int
    objects_dropped: int


@dataclass
class Explanation:
    """A_md = Delta A_md || A_md^- (Eq. 28) and how generation ended."""

    text: str
    prefix: str
    generated_tokens: int
    latency: float
    stop_reason: str  # "eos" | "max_tokens" | "stop_requested" | "max_time"
    prompt_tokens: int
    examples_used: int


def resolve_device(config: StudentConfig) -> torch.device:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise StudentConfigError("StudentConfig.device: 'cuda' requested but CUDA is not available")
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def resolve_dtype(config: StudentConfig, device: torch.device) -> torch.dtype:
    if config.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, config.dtype)


def checked_mask(mask: np.ndarray | None) -> np.ndarray | None:
    """An action mask as (10,) booleans with at least one allowed action, or a ValueError."""
    if mask is None:
        return None
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (NUM_ACTIONS,) or not mask.any():
        raise ValueError(f"action mask must be {NUM_ACTIONS} booleans with at least one True, "
                         f"got {mask.tolist()}")
    return mask


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of two token sequences, at most ``limit``."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return max(n, 0)


def decision_head(config: StudentConfig, d_model: int) -> DecisionHead | HeadEnsemble:
    """The head ``config`` describes (an ensemble where ``head_members`` lists its heads); a head that reads
    scene values must read one of this luna_core's parts (``luna_core.scene.HEAD_SCENE_PARTS``, told apart by
    their lengths; ``scene_tensor``)."""
    from luna_core.scene import HEAD_SCENE_PARTS

    lengths = (0, *(len(p) for p in HEAD_SCENE_PARTS.values()))
    for name, dims in (("head_scene_dim", [config.head_scene_dim]), ("head_members", config.head_members)):
        for dim in dims:
            if dim not in lengths:
                parts = ", ".join(f"{len(p)} in {n!r}" for n, p in HEAD_SCENE_PARTS.items())
                raise StudentConfigError(f"StudentConfig.{name}: a head was trained on {dim} scene values; "
                                         f"luna_core.scene's parts have {parts} (another descriptor layout)")
    if config.head_members:
        return HeadEnsemble(d_model, config.head_hidden, config.num_actions, config.head_members)
    return DecisionHead(d_model, config.head_hidden, config.num_actions, config.head_scene_dim)


def load_head_weights(head: DecisionHead | HeadEnsemble, path: Path, device: str = "cpu") -> None:
    """Load a checked head file into ``head``; ``StudentModelFileError`` naming the file when it cannot be read or
    does not fit."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path), device=device)
    except (SafetensorError, OSError) as exc:
        raise StudentModelFileError(f"{path}: unreadable safetensors ({exc})") from exc
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise StudentModelFileError(f"{path}: head does not fit the model ({exc})") from exc


def load_decision_head(directory: str | Path) -> DecisionHead | HeadEnsemble:
    """The decision head of a saved student alone, on the CPU in eval mode, without its base model (scoring
    heads on cached h_{i*}: ``benchmarks/score_cached_heads.py``); its file checked against the meta."""
    directory = Path(directory)
    config = StudentConfig.load(directory / files.CONFIG_FILE)
    meta = files.read_meta(directory)
    path = files.check_file(directory, files.HEAD_FILE, meta)
    if "d_model" not in meta:
        raise StudentModelFileError(f"{directory / files.META_FILE}: no 'd_model' entry")
    head = decision_head(config, int(meta["d_model"]))
    load_head_weights(head, path)
    return head.eval()


def scene_tensor(config: StudentConfig, scene_vector: np.ndarray | None, device: torch.device
                 ) -> torch.Tensor | None:
    """The head's float32 input: its part (``luna_core.scene.head_scene_part``) of ``scene_vector``, which is
    ``luna_core.scene.head_scene_values`` (xi_t and the objects' timing), or xi_t alone
    (``luna_core.scene.scene_vector``) for a part within it; None for a head on h_i* alone.
    ``SceneVectorError`` where the head needs values and got none, too few, or non-finite ones."""
    from luna_core.scene import HEAD_SCENE_VALUES_DIM, SCENE_VECTOR_DIM, head_scene_part

    if not config.head_scene_dim:
        return None
    part = head_scene_part(config.head_scene_dim)
    if scene_vector is None:
        raise SceneVectorError(f"this student's decision head reads {config.head_scene_dim} scene values "
                               f"(luna_core.scene.head_scene_values): pass scene_vector")
    v = np.asarray(scene_vector, dtype=np.float32).reshape(-1)
    lengths = (SCENE_VECTOR_DIM, HEAD_SCENE_VALUES_DIM) if max(part) < SCENE_VECTOR_DIM else (HEAD_SCENE_VALUES_DIM,)
    if v.shape[0] not in lengths or not np.all(np.isfinite(v)):
        raise SceneVectorError(f"scene_vector: expected {' or '.join(map(str, lengths))} finite values, "
                               f"got {v.shape[0]}" + ("" if np.all(np.isfinite(v)) else " with NaN or inf"))
    return torch.from_numpy(v[list(part)]).to(device)


def default_prompts() -> StudentPrompts:
    from luna_core.prompts import PromptManager  # the project's prompt manager (P_md, Eq. 13, 26)

    return PromptManager()


def _load_base(config: StudentConfig, folder: Path) -> tuple[nn.Module, object, torch.device]:
    """(base causal LM on its device, tokenizer, device), with the context and LoRA targets checked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(config)
    dtype = resolve_dtype(config, device)
    kwargs: dict = {"dtype": dtype}
    if config.quantization == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": str(device)}
    lm = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    positions = getattr(lm.config, "max_position_embeddings", None)
    if positions is not None and config.max_context_tokens > positions:
        raise StudentConfigError(f"StudentConfig.max_context_tokens: {config.max_context_tokens} is more than "
                                 f"the {positions} positions of the base model {folder}")
    if config.quantization == "none":
        lm.to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    missing = [t for t in config.lora_targets
               if not any(name.endswith("." + t) for name, _ in lm.named_modules())]
    if missing:
        raise StudentConfigError(f"StudentConfig.lora_targets: {missing} not found in {folder}")
    return lm, tokenizer, device


def _load_peft_adapter(lm: nn.Module, adapter: dict[str, torch.Tensor], where: Path) -> None:
    """Load a saved adapter into peft's LoRA modules (the trainable form)."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(lm, adapter)
    lora_missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if lora_missing or getattr(result, "unexpected_keys", []):
        raise StudentModelFileError(
            f"{where}: adapter does not fit the model (missing {lora_missing[:3]}, unexpected "
            f"{list(getattr(result, 'unexpected_keys', []))[:3]})")


class DualHeadStudent(nn.Module):
    """pi_hat and A_md from one fine-tuned language model (see the module docstring)."""

    def __init__(self, config: StudentConfig, lm: nn.Module, tokenizer, head: DecisionHead,
                 base_hash: str, prompts: StudentPrompts, device: torch.device,
                 merged: MergedAdapter | None = None) -> None:
        super().__init__()
        self.config = config
        # peft model (LoRA on config.lora_targets), or, with ``merged``, the base causal LM whose weights
        # hold the adapter (inference only).
        self.lm = lm
        self.merged = merged
        self.head = head
        self.tokenizer = tokenizer
        self.base_hash = base_hash
        self.prompts = prompts
        self.device = device
        self.encoder = student_encoder(tokenizer, prompts, config)
        # One model, two callers (periodic predict, event-triggered explain): a lock serialises
        # forward passes and explain waits between tokens while a predict call is pending.
        self._lock = threading.Lock()
        self._pending = threading.Condition()
        self._pending_predicts = 0
        self._cached_ids: tuple[int, ...] = ()  # the tokens whose keys and values _kv_cache holds
        self._kv_cache = None

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_base(cls, config: StudentConfig | None = None,
                  prompts: StudentPrompts | None = None) -> "DualHeadStudent":
        """A new student: the base model with freshly initialised LoRA adapters and head."""
        config = config or StudentConfig()
        folder = model_cache.resolve(config.base_model)
        return cls._build(config, prompts or default_prompts(), folder, files.base_model_hash(folder))

    @classmethod
    def _build(cls, config: StudentConfig, prompts: StudentPrompts, folder: Path,
               base_hash: str) -> "DualHeadStudent":
        """The base model with fresh peft LoRA adapters (trainable) and a fresh head."""
        from peft import LoraConfig, get_peft_model

        lm, tokenizer, device = _load_base(config, folder)
        lm = get_peft_model(lm, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                           lora_dropout=config.lora_dropout,
                                           target_modules=list(config.lora_targets),
                                           task_type="CAUSAL_LM"))
        head = decision_head(config, lm.config.hidden_size).to(device)
        student = cls(config, lm, tokenizer, head, base_hash, prompts, device)
        student.eval()
        return student

    @classmethod
    def from_pretrained(cls, directory: str | Path, prompts: StudentPrompts | None = None,
                        device: str | None = None, base_model: str | None = None,
                        max_context_tokens: int | None = None,
                        for_training: bool = False, dtype: str | None = None,
                        autocast: str | None = None) -> "DualHeadStudent":
        """Load a saved student; the base model must be the one it was trained on (hash check).

        ``device`` overrides the saved device; ``base_model`` overrides where the base is found (e.g. a
        local folder on a vehicle): its hash must still match; ``max_context_tokens`` overrides the
        prompt budget (a latency budget on a slow computer); ``dtype`` the base's weights and
        ``autocast`` the dtype of its matrix products (``StudentConfig.autocast``). By default the adapter is merged into the
        base weights without peft (inference: the decision node, the bridge, evaluation); with
        ``for_training`` (distillation), or on an nf4-quantised base (4-bit weights cannot take the
        sum), it is loaded into peft's LoRA modules.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = Path(directory)
        if not directory.is_dir():
            raise StudentModelFileError(f"{directory}: not a directory")
        config = StudentConfig.load(directory / files.CONFIG_FILE)
        if device is not None:
            config.device = device
        if base_model is not None:
            config.base_model = base_model
        if max_context_tokens is not None:
            config.max_context_tokens = max_context_tokens
        if dtype is not None:
            config.dtype = dtype
        if autocast is not None:
            config.autocast = autocast
        config.validate()
        meta = files.read_meta(directory)
        adapter_path = files.check_file(directory, files.ADAPTER_FILE, meta)
        head_path = files.check_file(directory, files.HEAD_FILE, meta)
        folder = model_cache.resolve(config.base_model)
        base_hash = files.base_model_hash(folder)
        if meta["base_model_hash"] not in (base_hash, files.base_model_hash(folder, legacy=True)):
            raise BaseModelMismatchError(
                f"{directory} was trained on a base model with hash {meta['base_model_hash'][:16]}..., but "
                f"{config.base_model!r} ({folder}) has hash {base_hash[:16]}...")
        prompts = prompts or default_prompts()
        merge = not for_training and config.quantization == "none"
        if merge:
            lm, tokenizer, dev = _load_base(config, folder)
            lm.requires_grad_(False)  # inference only: nothing here is trained
            head_module = decision_head(config, lm.config.hidden_size).to(dev)
            student = cls(config, lm, tokenizer, head_module, base_hash, prompts, dev)
        else:
            student = cls._build(config, prompts, folder, base_hash)
        try:
            adapter = load_file(str(adapter_path), device=str(student.device))
        except (SafetensorError, OSError) as exc:
            raise StudentModelFileError(f"{adapter_path}: unreadable safetensors ({exc})") from exc
        if merge:
            student.merged = merge_lora(student.lm, adapter, config.lora_targets, config.lora_r,
                                        config.lora_alpha, adapter_path)
        else:
            _load_peft_adapter(student.lm, adapter, adapter_path)
        load_head_weights(student.head, head_path, str(student.device))
        student.eval()
        return student

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write config, adapter and head (safetensors) atomically: a crash leaves the old copy intact."""
        from safetensors.torch import save_file

        directory = Path(directory)
        tmp = files.staging_dir(directory)
        if self.merged is not None:  # the adapter as it was read: merging does not change it
            adapter = {k: v.contiguous() for k, v in self.merged.state.items()}
        else:
            from peft import get_peft_model_state_dict

            adapter = {k: v.detach().to("cpu").contiguous()
                       for k, v in get_peft_model_state_dict(self.lm).items()}
        head = {k: v.detach().to("cpu").contiguous() for k, v in self.head.state_dict().items()}
        save_file(adapter, str(tmp / files.ADAPTER_FILE))
        save_file(head, str(tmp / files.HEAD_FILE))
        self.config.save(tmp / files.CONFIG_FILE)
        files.write_meta(tmp, self.base_hash, self.config.base_model, int(self.lm.config.hidden_size))
        return files.replace_dir(tmp, directory)

    # ---- model parts ---------------------------------------------------------------------------
    @property
    def base_lm(self) -> nn.Module:
        """The causal LM under the adapters: peft's base model, or the merged model itself."""
        return self.lm if self.merged is not None else self.lm.get_base_model()

    @property
    def decoder(self) -> nn.Module:
        """The transformer body (with LoRA) without the LM head: hidden states only."""
        return self.base_lm.get_decoder()

    @property
    def lm_head(self) -> nn.Module:
        return self.base_lm.get_output_embeddings()

    @contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """``self.lm`` is the base model inside the block (zero-shot baselines): peft's
        ``disable_adapter``, or for a merged student the base weights recovered from the merged ones
        (to within one rounding of the weight dtype; the merged weights come back exactly)."""
        if self.merged is None:
            with self.lm.disable_adapter():
                yield
            return
        with self._lock, unmerged(self.lm, self.merged):
            self._kv_cache, self._cached_ids = None, ()  # computed with the adapter
            yield

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def train(self, mode: bool = True) -> "DualHeadStudent":
        if mode and self.merged is not None:
            raise StudentConfigError("this student was loaded for inference (adapter merged into the base "
                                     "weights): load it with from_pretrained(..., for_training=True) to train")
        # Weights may change while training: the cached prefix would be stale.
        self._kv_cache, self._cached_ids = None, ()
        return super().train(mode)

    def dpp_probabilities(self, hidden: torch.Tensor, scene: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 16: softmax of the head logits; the head runs in float32 whatever the base dtype. ``scene``:
        xi_t for a head that reads it (``scene_tensor``)."""
        return torch.softmax(self.head(hidden.float(), scene), dim=-1)

    # ---- training (Eq. 15-18) ------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, commit_index: torch.Tensor,
                target: torch.Tensor, alpha: float, scene: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The training pass (``losses``); through ``forward`` so DDP / accelerate wrappers sync grads."""
        return self.losses(input_ids, attention_mask, commit_index, target, alpha, scene)

    def losses(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, commit_index: torch.Tensor,
               target: torch.Tensor, alpha: float, scene: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """L_total = L_LM + alpha * KL(pi || pi_hat) on a right-padded batch.

        ``commit_index`` (B,) is i* of each sample, ``target`` (B, 10) the teacher distribution pi,
        ``scene`` (B, head_scene_dim) the scene vectors for a head that reads them.
        L_LM is next-token cross-entropy over every non-padding token of the sequence (Eq. 15).
        """
        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm_head(hidden[:, :-1]).float()
        labels = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, -100)
        lm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        h_star = hidden[torch.arange(hidden.shape[0], device=hidden.device), commit_index]
        log_q = torch.log_softmax(self.head(h_star.float(), scene), dim=-1)
        kl = F.kl_div(log_q, target.float(), reduction="batchmean")  # sum_a pi log(pi / pi_hat)
        return {"total": lm + alpha * kl, "lm": lm.detach(), "kl": kl.detach()}

    def encode_training_sample(self, query: str, examples: Sequence[MemoryItem],
                               answer: str) -> tuple[list[int], int, int]:
        """(token ids of prompt || answer || end-of-turn, i*, examples used) within the window."""
        answer_ids = self.encoder.answer_ids(answer)
        fitted = self.encoder.fit(query, examples, reserve=len(answer_ids))
        return fitted.input_ids + answer_ids, fitted.commit_index, fitted.examples_used

    # ---- inference -----------------------------------------------------------------------------
    @contextmanager
    def _decision_priority(self) -> Iterator[None]:
        with self._pending:
            self._pending_predicts += 1
        try:
            with self._lock:
                yield
        finally:
            with self._pending:
                self._pending_predicts -= 1
                self._pending.notify_all()

    def _autocast(self):
        """The base's forward passes under torch autocast (``StudentConfig.autocast``), or as they are."""
        if self.config.autocast == "none":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.config.autocast))

    def _commitment_hidden(self, fitted: FittedPrompt) -> tuple[torch.Tensor, int]:
        """h_{i*} of the prompt and how many leading tokens came from the KV cache.

        With ``reuse_prefix_cache`` the KV cache of the previous prompt is kept and cut back to the
        longest token prefix the new prompt shares with it: always the system message, and also the
        retrieved examples while retrieval returns the same items (``HeuristicConfig.retrieval_margin``
        keeps them across nearby scenes), and the first lines of the traffic state.
        Causal attention makes the kept keys and values exactly those of a full pass over the prefix.
        """
        ids = fitted.input_ids
        if not self.config.reuse_prefix_cache:
            x = torch.tensor([ids], device=self.device)
            with self._autocast():
                return self.decoder(input_ids=x, use_cache=False).last_hidden_state[0, -1], 0
        # At least the last token is computed: its hidden state is h_{i*}.
        shared = common_prefix_length(self._cached_ids, ids, len(ids) - 1)
        cache = self._kv_cache if shared > 0 else None
        if cache is not None and cache.get_seq_length() > shared:
            cache.crop(shared - cache.get_seq_length())
        self._kv_cache, self._cached_ids = None, ()  # until the pass below completes
        rest = torch.tensor([ids[shared:]], device=self.device)
        with self._autocast():
            out = self.decoder(input_ids=rest, past_key_values=cache, use_cache=True)
        self._kv_cache, self._cached_ids = out.past_key_values, tuple(ids)
        return out.last_hidden_state[0, -1], shared

    @torch.inference_mode()
    def predict(self, scene_query: str, retrieved: Sequence[MemoryItem] = (),
                mask: np.ndarray | None = None, scene_vector: np.ndarray | None = None
                ) -> tuple[np.ndarray, PredictLatency]:
        """pi_hat(.|xi_t) (10,) from one forward pass; masked actions get 0 and the rest renormalise.
        ``scene_vector``: ``luna_core.scene.scene_vector`` of the scene, needed where the head reads it
        (``StudentConfig.head_scene_dim``), ignored otherwise."""
        mask = checked_mask(mask)
        scene = scene_tensor(self.config, scene_vector, self.device)
        t0 = time.perf_counter()
        fitted = self.encoder.fit(scene_query, retrieved)
        t1 = time.perf_counter()
        with self._decision_priority():
            hidden, cached = self._commitment_hidden(fitted)
            probs = self.dpp_probabilities(hidden, scene).to("cpu", torch.float64).numpy()
        t2 = time.perf_counter()
        probs = probs / probs.sum()  # exact in float64 for consumers that check the sum
        if mask is not None:
            probs = mask_and_renormalise(probs, mask)
        latency = PredictLatency(total=time.perf_counter() - t0, encode=t1 - t0, forward=t2 - t1,
                                 prompt_tokens=len(fitted.input_ids), cached_prefix_tokens=cached,
                                 examples_used=fitted.examples_used, objects_dropped=fitted.objects_dropped)
        return probs, latency

    @torch.inference_mode()
    def explain(self, scene_query: str, retrieved: Sequence[MemoryItem], ranked_codes: Sequence[str],
                max_new_tokens: int | None = None, stop: threading.Event | None = None,
                max_time: float | None = None) -> Explanation:
        """Eq. 25-28: Delta A_md from the ranked codes, then greedy generation of the rest.

        Stops at the end-of-turn token, after ``max_new_tokens``, when ``stop`` is set, or after
        ``max_time`` seconds. The prompt is read in chunks of ``explanation_prefill_chunk`` tokens and the
        answer one token per step; before each step it waits while a ``predict`` call is pending, so a
        decision waits at most one step (one chunk), never a whole prompt. So that back-to-back
        decisions cannot starve it, a step waits at most ``explanation_max_yield`` seconds.
        """
        t0 = time.perf_counter()
        max_new = self.config.explanation_max_new_tokens if max_new_tokens is None else max_new_tokens
        chunk = self.config.explanation_prefill_chunk
        prefix_text = self.prompts.explanation_prefix(list(ranked_codes))
        prefix_ids = list(self.tokenizer(prefix_text, add_special_tokens=False)["input_ids"])
        fitted = self.encoder.fit(scene_query, retrieved, reserve=len(prefix_ids) + max_new)
        feed = fitted.input_ids + prefix_ids  # tokens not yet read by the model
        eos = self.tokenizer.eos_token_id
        generated: list[int] = []
        reason = "max_tokens"
        past = None
        while len(generated) < max_new:
            if stop is not None and stop.is_set():
                reason = "stop_requested"
                break
            if max_time is not None and time.perf_counter() - t0 > max_time:
                reason = "max_time"
                break
            with self._pending:
                self._pending.wait_for(lambda: self._pending_predicts == 0,
                                       timeout=self.config.explanation_max_yield)
            with self._lock, self._autocast():
                out = self.lm(input_ids=torch.tensor([feed[:chunk]], device=self.device), past_key_values=past,
                              use_cache=True, logits_to_keep=1)
            past, feed = out.past_key_values, feed[chunk:]
            if feed:
                continue  # still reading the prompt
            token = int(out.logits[0, -1].argmax())
            if token == eos:
                reason = "eos"
                break
            generated.append(token)
            feed = [token]
        text = prefix_text + self.tokenizer.decode(generated, skip_special_tokens=True)
        return Explanation(text=text, prefix=prefix_text, generated_tokens=len(generated),
                           latency=time.perf_counter() - t0, stop_reason=reason,
                           prompt_tokens=len(fitted.input_ids) + len(prefix_ids),
                           examples_used=fitted.examples_used)
