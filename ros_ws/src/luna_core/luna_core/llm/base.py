"""The chat-model interface shared by every backend, its errors, and token / cost accounting."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

Message = dict[str, str]


@dataclass
class Completion:
    """One generated answer."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency: float  # s, wall clock of the request (0 for a cache hit)
    finish_reason: str = "stop"  # "stop" | "length" (hit max_tokens: the text may be truncated)
    model: str = ""
    cached: bool = False


@dataclass
class Choice:
    """A constrained answer: one of a fixed set of strings, chosen by the model's likelihood."""

    text: str
    logprobs: dict[str, float]  # total log-probability of each allowed string after the prompt
    prompt_tokens: int
    latency: float
    model: str = ""
    cached: bool = False


class LLMError(RuntimeError):
    """A model call failed (after retries where they apply)."""


class LLMConfigError(LLMError):
    """The backend is misconfigured (missing key variable, unknown model path...)."""


class LLMUnavailable(LLMError):
    """The endpoint did not answer successfully within the allowed retries / timeouts."""


class LLMRequestError(LLMError):
    """The endpoint rejected the request (4xx other than rate limits); retrying will not help."""


class BudgetExceeded(LLMError):
    """A request would push the spending over the configured hard cap."""


class UnsupportedCapability(LLMError):
    """The backend cannot do what was asked (e.g. constrained choice over an OpenAI endpoint)."""


@runtime_checkable
class ChatModel(Protocol):
    """Every backend: OpenAI-compatible endpoints and the in-process transformers model."""

    name: str

    def chat(self, messages: Sequence[Message], temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = None, max_tokens: int = 256) -> Completion:
        ...


@runtime_checkable
class ChoiceModel(Protocol):
    """Backends that can score a fixed set of continuations (constrained decoding)."""

    name: str

    def choose(self, messages: Sequence[Message], choices: Sequence[str], assistant_prefix: str = "",
               temperature: float = 0.0, seed: int | None = None) -> Choice:
        ...


@dataclass
class _ModelUsage:
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


@dataclass
class UsageMeter:
    """Thread-safe token and cost accounting with an optional hard spending cap.

    Before a paid request the backend reserves its worst-case cost (``reserve``); the request is
    refused with ``BudgetExceeded`` if spent + reserved + estimate would pass the cap, so concurrent
    requests cannot overshoot it. ``settle`` replaces the reservation by the actual cost.
    """

    spending_cap: float | None = None  # in the currency of the configured prices
    per_model: dict[str, _ModelUsage] = field(default_factory=dict)
    _reserved: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reserve(self, estimate: float) -> float:
        with self._lock:
            if self.spending_cap is not None and self.cost + self._reserved + estimate > self.spending_cap:
                raise BudgetExceeded(f"spending cap {self.spending_cap:.4f} reached: spent {self.cost:.4f}, "
                                     f"in flight {self._reserved:.4f}, next request up to {estimate:.4f}")
            self._reserved += estimate
            return estimate

    def settle(self, reservation: float, model: str, prompt_tokens: int, completion_tokens: int,
               cost: float) -> None:
        with self._lock:
            self._reserved = max(self._reserved - reservation, 0.0)
            u = self.per_model.setdefault(model, _ModelUsage())
            u.requests += 1
            u.prompt_tokens += prompt_tokens
            u.completion_tokens += completion_tokens
            u.cost += cost

    def release(self, reservation: float) -> None:
        """Drop a reservation whose request failed (nothing was charged)."""
        with self._lock:
            self._reserved = max(self._reserved - reservation, 0.0)

    def record(self, model: str, prompt_tokens: int, completion_tokens: int, cost: float = 0.0) -> None:
        self.settle(0.0, model, prompt_tokens, completion_tokens, cost)

    def record_cache_hit(self, model: str) -> None:
        with self._lock:
            self.per_model.setdefault(model, _ModelUsage()).cache_hits += 1

    @property
    def cost(self) -> float:
        return sum(u.cost for u in self.per_model.values())

    @property
    def prompt_tokens(self) -> int:
        return sum(u.prompt_tokens for u in self.per_model.values())

    @property
    def completion_tokens(self) -> int:
        return sum(u.completion_tokens for u in self.per_model.values())

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {"cost": round(self.cost, 6), "spending_cap": self.spending_cap,
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                    "models": {m: vars(u).copy() for m, u in self.per_model.items()}}
