"""The in-process transformers backend: runs a local causal LM (default: the packaged SmolLM2-135M-
Instruct, converted once to a cached HF folder by ``luna_core.model_cache``) with no network at all.

Calls are serialised by a lock (one model instance, one forward at a time); seeds make sampling
reproducible. A small prefix cache keeps the key/value states of recent prompts: the teacher's prompts
share long prefixes (the instruction text, the same voting query for all M voters, the voter's own
answer when it is completed by ``choose``), and on CPU the prompt prefill dominates the cost, so only
the part after the longest cached common prefix is computed. ``choose`` scores a fixed set of
continuations by their log-likelihood (constrained decoding), which the teacher uses as a recorded
fallback when a weak model's free text does not parse.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from luna_core.llm.base import Choice, Completion, LLMConfigError, Message, UsageMeter


_LOADED: dict[tuple[str, str], tuple[Any, Any, threading.Lock]] = {}
_LOAD_LOCK = threading.Lock()


def _load(path: Any, device: str) -> tuple[Any, Any, threading.Lock]:
    """Tokenizer, model and its call lock, loaded once per (folder, device) and process: every chat
    backend on the same weights (teacher agents, tests) shares one copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = (str(path), device)
    with _LOAD_LOCK:
        if key not in _LOADED:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
            _LOADED[key] = (tokenizer, model, threading.Lock())
        return _LOADED[key]


class TransformersChatModel:
    def __init__(self, model: str = "smollm2-135m-instruct", device: str | None = None,
                 num_threads: int | None = 2, meter: UsageMeter | None = None) -> None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        from luna_core.model_cache import resolve

        try:
            path = resolve(model)
        except FileNotFoundError as exc:
            raise LLMConfigError(str(exc)) from exc
        if num_threads:
            # On a shared, busy CPU one thread is often faster than two (no spin-waiting on a core
            # another process holds); measure before raising it.
            torch.set_num_threads(num_threads)
        self._torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.name = model
        self.meter = meter or UsageMeter()
        self.tokenizer, self.model, self._lock = _load(path, self.device)
        if self.tokenizer.chat_template is None:
            raise LLMConfigError(f"model {model!r} has no chat template; a chat backend needs one")
        self._prefixes: OrderedDict[bytes, tuple[Any, Any]] = OrderedDict()  # key -> (ids, cache)
        self.prefix_cache_size = 6
        self.prefix_tokens_reused = 0

    @staticmethod
    def _crop(cache: Any, length: int) -> Any:
        current = cache.get_seq_length()
        if current > length:
            cache.crop(length - current)
        return cache

    def _cached_prefix(self, ids: Any) -> Any | None:
        """A copy of the cached key/values covering the longest common prefix with ``ids`` (leaving
        at least one token to compute), or None."""
        best, best_len = None, 0
        flat = ids[0]
        for key, (pids, cache) in self._prefixes.items():
            n = min(len(pids), len(flat) - 1)
            if n <= best_len:
                continue
            diff = (pids[:n] != flat[:n]).nonzero()
            common = int(diff[0, 0]) if len(diff) else n
            if common > best_len:
                best, best_len = key, common
        if best is None or best_len < 16:
            return None
        self._prefixes.move_to_end(best)
        self.prefix_tokens_reused += best_len
        return self._crop(copy.deepcopy(self._prefixes[best][1]), best_len)

    def _remember(self, ids: Any, cache: Any) -> None:
        """Keep the key/values of ``ids`` (the cache may extend beyond them: it is cropped)."""
        key = ids[0].cpu().numpy().tobytes()
        self._prefixes[key] = (ids[0].clone(), self._crop(copy.deepcopy(cache), ids.shape[1]))
        self._prefixes.move_to_end(key)
        while len(self._prefixes) > self.prefix_cache_size:
            self._prefixes.popitem(last=False)

    def _encode(self, messages: Sequence[Message], assistant_prefix: str = ""):
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text + assistant_prefix, return_tensors="pt", add_special_tokens=False).input_ids
        return ids.to(self.device)

    def chat(self, messages: Sequence[Message], temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = None, max_tokens: int = 256) -> Completion:
        torch = self._torch
        t0 = time.monotonic()
        with self._lock, torch.inference_mode():
            ids = self._encode(messages)
            if seed is not None:
                torch.manual_seed(seed)
            sample = temperature > 0.0
            kwargs = {"do_sample": sample, "max_new_tokens": max_tokens,
                      "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id}
            if sample:
                kwargs.update(temperature=temperature, top_k=top_k or 0)
            else:  # greedy: clear sampling defaults from generation_config so none is applied
                kwargs.update(temperature=None, top_k=None, top_p=None)
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      past_key_values=self._cached_prefix(ids), return_dict_in_generate=True,
                                      **kwargs)
            self._remember(ids, out.past_key_values)
        new = out.sequences[0, ids.shape[1]:]
        eos = self.tokenizer.eos_token_id
        stopped = len(new) > 0 and int(new[-1]) == eos
        finish = "stop" if stopped or len(new) < max_tokens else "length"
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        pt, ct = int(ids.shape[1]), int(len(new))
        self.meter.record(self.name, pt, ct)
        return Completion(text, pt, ct, time.monotonic() - t0, finish, self.name)

    def choose(self, messages: Sequence[Message], choices: Sequence[str], assistant_prefix: str = "",
               temperature: float = 0.0, seed: int | None = None) -> Choice:
        """The choice with the highest total log-probability after ``assistant_prefix`` (temperature 0),
        or a sample from softmax(logprob / temperature)."""
        if not choices:
            raise ValueError("choose needs at least one choice")
        torch = self._torch
        t0 = time.monotonic()
        with self._lock, torch.inference_mode():
            ids = self._encode(messages, assistant_prefix)
            cached = self._cached_prefix(ids)
            start = 0 if cached is None else cached.get_seq_length()
            prompt_out = self.model(ids[:, start:], past_key_values=cached, use_cache=True)
            self._remember(ids, prompt_out.past_key_values)
            first_logp = torch.log_softmax(prompt_out.logits[0, -1].float(), -1)
            logprobs: dict[str, float] = {}
            for choice in choices:
                cids = self.tokenizer(choice, return_tensors="pt", add_special_tokens=False).input_ids
                cids = cids.to(self.device)
                total = float(first_logp[cids[0, 0]])
                if cids.shape[1] > 1:
                    cache = copy.deepcopy(prompt_out.past_key_values)  # the prompt is encoded once
                    out = self.model(cids[:, :-1], past_key_values=cache, use_cache=True)
                    lp = torch.log_softmax(out.logits[0].float(), -1)
                    total += float(lp.gather(1, cids[0, 1:, None]).sum())
                logprobs[choice] = total
        values = np.array([logprobs[c] for c in choices])
        if temperature > 0.0:
            z = (values - values.max()) / temperature
            p = np.exp(z) / np.exp(z).sum()
            pick = int(np.random.default_rng(seed).choice(len(choices), p=p))
        else:
            pick = int(np.argmax(values))
        self.meter.record(self.name, int(ids.shape[1]), 0)
        return Choice(choices[pick], logprobs, int(ids.shape[1]), time.monotonic() - t0, self.name)
