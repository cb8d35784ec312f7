"""A chat client for any OpenAI-compatible endpoint (DeepSeek, vLLM, llama.cpp server, Ollama).

Retries with exponential backoff and jitter on timeouts, connection errors, rate limits and 5xx;
a semaphore bounds concurrent requests; an optional minimum interval enforces a request rate;
tokens and cost go to a ``UsageMeter`` with a hard cap. The API key is read from the environment
variable NAMED in the config, at construction, and is never logged, stored in the config or printed.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from luna_core.llm.base import (Completion, LLMConfigError, LLMRequestError, LLMUnavailable, Message,
                                UsageMeter)

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
_CHARS_PER_TOKEN_LOW = 2.5  # conservative (high) token estimate for the budget reservation


@dataclass(frozen=True)
class EndpointConfig:
    model: str
    base_url: str
    api_key_env: str | None = None  # NAME of the environment variable holding the key; None = no key
    timeout: float = 60.0  # s per request
    max_retries: int = 4
    backoff_base: float = 1.0  # s, doubled after every failed attempt
    backoff_max: float = 30.0
    concurrency: int = 4
    requests_per_minute: float | None = None
    top_k_field: str | None = "top_k"  # extra_body key for top-k (vLLM, llama.cpp); None: not sent
    price_prompt_per_1m: float = 0.0
    price_completion_per_1m: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_prompt_per_1m + completion_tokens * self.price_completion_per_1m) / 1e6


class OpenAIChatModel:
    def __init__(self, config: EndpointConfig, meter: UsageMeter | None = None) -> None:
        if config.concurrency < 1 or config.max_retries < 0 or config.timeout <= 0:
            raise LLMConfigError(f"invalid endpoint settings: concurrency={config.concurrency}, "
                                 f"max_retries={config.max_retries}, timeout={config.timeout}")
        api_key = "not-needed"  # local servers ignore it, the client requires a value
        if config.api_key_env:
            api_key = os.environ.get(config.api_key_env, "")
            if not api_key:
                raise LLMConfigError(f"the environment variable {config.api_key_env} (API key for "
                                     f"{config.base_url}) is not set")
        self.config = config
        self.name = config.model
        self.meter = meter or UsageMeter()
        # Imported here, not at module level: the SDK takes ~1.3 s to import, which every process that
        # merely imports luna_core.llm (the reflection client at each restart) would pay for nothing.
        import openai

        # The SDK's own retries are off: ours count attempts, back off with jitter and are testable.
        self._client = openai.OpenAI(base_url=config.base_url, api_key=api_key, timeout=config.timeout,
                                     max_retries=0)
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._rate_lock = threading.Lock()
        self._next_start = 0.0
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.config.model!r}, base_url={self.config.base_url!r})"

    def _wait_for_rate(self) -> None:
        if not self.config.requests_per_minute:
            return
        interval = 60.0 / self.config.requests_per_minute
        with self._rate_lock:
            now = time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + interval
        if start > now:
            time.sleep(start - now)

    def _backoff(self, attempt: int) -> float:
        delay = min(self.config.backoff_max, self.config.backoff_base * 2.0 ** attempt)
        return delay * (0.5 + 0.5 * self._rng.random())

    def chat(self, messages: Sequence[Message], temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = None, max_tokens: int = 256) -> Completion:
        cfg = self.config
        kwargs: dict[str, Any] = {"model": cfg.model, "messages": list(messages), "temperature": temperature,
                                  "max_tokens": max_tokens}
        if seed is not None:
            kwargs["seed"] = seed
        if top_k is not None and cfg.top_k_field:
            kwargs["extra_body"] = {cfg.top_k_field: top_k}
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        estimate = cfg.cost(int(prompt_chars / _CHARS_PER_TOKEN_LOW) + 16, max_tokens)
        reservation = self.meter.reserve(estimate)
        try:
            return self._call_with_retries(kwargs, reservation)
        except BaseException:  # nothing was charged: free the reservation, keep the error
            self.meter.release(reservation)
            raise

    def _call_with_retries(self, kwargs: dict[str, Any], reservation: float) -> Completion:
        import openai  # already imported by __init__: a dictionary look-up

        cfg = self.config
        last: Exception | None = None
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                delay = self._backoff(attempt - 1)
                log.warning("retrying %s in %.2f s after: %s", cfg.model, delay, last)
                time.sleep(delay)
            self._wait_for_rate()
            with self._slots:
                t0 = time.monotonic()
                try:
                    response = self._client.chat.completions.create(**kwargs)
                except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                    last = exc
                    continue
                except openai.APIStatusError as exc:
                    if exc.status_code in _RETRY_STATUS:
                        last = exc
                        continue
                    raise LLMRequestError(f"{cfg.base_url} rejected the request for {cfg.model}: "
                                          f"HTTP {exc.status_code}") from exc
                latency = time.monotonic() - t0
            if not response.choices:
                last = LLMUnavailable("the response has no choices")
                continue
            choice = response.choices[0]
            usage = response.usage
            pt = int(getattr(usage, "prompt_tokens", 0) or 0)
            ct = int(getattr(usage, "completion_tokens", 0) or 0)
            self.meter.settle(reservation, cfg.model, pt, ct, cfg.cost(pt, ct))
            return Completion(text=choice.message.content or "", prompt_tokens=pt, completion_tokens=ct,
                              latency=latency, finish_reason=choice.finish_reason or "stop",
                              model=cfg.model)
        raise LLMUnavailable(f"{cfg.base_url} ({cfg.model}) failed {cfg.max_retries + 1} attempts; "
                             f"last error: {type(last).__name__}: {last}")
