"""The reflection system (LUNA-AD Sec. III-E2, Eq. 29) and its durable outbox.

A reflection request pairs a failure zeta_t with the explanation A_md of the decision executed at the
time. ``ReflectionSystem.reflect`` builds Q_refl from the original Q_md (without retrieved context),
A_md and zeta_t (P_refl), asks the reflection LLM, validates the answer strictly (the original format,
actions only from the original action set, 'normal' only without a collision) and, for a revised
answer, appends the reflection memory item <Q_md, e, -, A_refl> to the bank (no distribution label).

``Outbox`` keeps requests durable until they are answered: a request acknowledged by ``put`` survives
a crash or a restart and is retried with exponential backoff while the endpoint is unreachable.
It is a journal (the memory bank's crash-safe framing) of ``put`` and ``done`` records.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from luna_core.llm.base import LLMConfigError, LLMError
from luna_core.memory.bank import InvalidItemError
from luna_core.memory.journal import Journal
from luna_core.prompts.knowledge import NORMAL_ANSWER, RANKED_TAG
from luna_core.prompts.parsers import (MalformedModelOutput, ReflectionAnswer, action_set_of, format_ranked_answer,
                                       parse_reflection)
from luna_core.types import DecisionExplanation, FailureEvent, MemoryItem, ReflectionResult


@dataclass
class ReflectionRequest:
    """Everything Eq. 29 needs, in a JSON-safe form."""

    id: str
    query: str  # Q_md without retrieval context
    answer: str  # A_md, the explanation of the executed decision
    failure_stamp: float
    issued_decision: str
    colliding_ids: list[str]
    stall: bool
    created: float = field(default_factory=time.time)

    @classmethod
    def from_events(cls, explanation: DecisionExplanation, failure: FailureEvent) -> "ReflectionRequest":
        return cls(id=uuid.uuid4().hex, query=explanation.query, answer=explanation.text,
                   failure_stamp=failure.stamp, issued_decision=failure.issued_decision,
                   colliding_ids=list(failure.colliding_ids), stall=failure.stall)

    @property
    def failure(self) -> FailureEvent:
        return FailureEvent(self.failure_stamp, self.issued_decision, 0.0, list(self.colliding_ids), self.stall)


@dataclass
class PendingRequest:
    request: ReflectionRequest
    attempts: int = 0
    next_attempt: float = 0.0  # time.monotonic() before which it is not retried
    last_error: str = ""  # why the last attempt failed (for diagnostics)


class Outbox:
    """Durable FIFO of reflection requests (one writer process)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory)
        self.path.mkdir(parents=True, exist_ok=True)
        journal = self.path / "outbox.jsonl"
        self._lock = threading.Lock()
        self._pending: dict[str, PendingRequest] = {}
        journal.touch(exist_ok=True)
        self._journal = Journal(journal)  # truncates a torn final record (a put never acknowledged)
        for record in self._journal.recovered.records:
            if record.get("op") == "put":
                req = ReflectionRequest(**record["request"])
                self._pending[req.id] = PendingRequest(req)
            elif record.get("op") == "done":
                self._pending.pop(record.get("id"), None)

    def put(self, request: ReflectionRequest) -> None:
        """Durably enqueue (returns after fsync)."""
        with self._lock:
            self._journal.append({"op": "put", "request": asdict(request)})
            self._pending[request.id] = PendingRequest(request)

    def done(self, request_id: str, result: dict[str, Any]) -> None:
        with self._lock:
            self._journal.append({"op": "done", "id": request_id, "result": result})
            self._pending.pop(request_id, None)

    def due(self) -> list[PendingRequest]:
        """Pending requests whose backoff has elapsed, oldest first."""
        now = time.monotonic()
        with self._lock:
            return sorted((p for p in self._pending.values() if p.next_attempt <= now),
                          key=lambda p: p.request.created)

    def retry_later(self, request_id: str, base: float, maximum: float, error: str = "") -> float:
        """Back off exponentially; returns the delay (s). ``error`` says why (kept for diagnostics)."""
        with self._lock:
            p = self._pending[request_id]
            p.attempts += 1
            p.last_error = error
            delay = min(maximum, base * 2 ** (p.attempts - 1))
            p.next_attempt = time.monotonic() + delay
            return delay

    def oldest_age(self) -> float:
        """Seconds since the oldest pending request was created (0 when empty)."""
        with self._lock:
            oldest = min((p.request.created for p in self._pending.values()), default=None)
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        self._journal.close()


class ReflectionUnavailable(RuntimeError):
    """The reflection LLM could not be reached: keep the request and retry later."""


@dataclass(frozen=True)
class ReflectionConfig:
    temperature: float = 0.0
    max_tokens: int = 512
    max_invalid_answers: int = 3  # malformed answers before a request is given up (recorded as an error)


class ReflectionSystem:
    def __init__(self, llm, prompts, bank, config: ReflectionConfig = ReflectionConfig()) -> None:
        self.llm = llm
        self.prompts = prompts
        self.bank = bank  # a writable MemoryBank
        self.config = config

    def reflect(self, request: ReflectionRequest, attempt: int = 0) -> ReflectionResult:
        """One reflection. Raises ReflectionUnavailable when the endpoint fails (retry later) and
        MalformedModelOutput when the answer is invalid."""
        failure = request.failure
        messages = self.prompts.refl_messages(request.query, request.answer, failure)
        try:
            completion = self.llm.chat(messages, temperature=self.config.temperature, seed=attempt,
                                       max_tokens=self.config.max_tokens)
        except LLMConfigError:
            raise
        except LLMError as exc:
            raise ReflectionUnavailable(str(exc)) from exc
        try:
            answer = parse_reflection(completion.text, request.query, collision=failure.collision)
        except MalformedModelOutput:
            if not callable(getattr(self.llm, "choose", None)):
                raise
            answer = self._constrained_answer(messages, request)
        if answer.normal:
            return ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp, normal=True,
                                    memory_version=int(self.bank.version))
        item = self.bank.append(MemoryItem(id=f"refl-{request.id}", query=request.query, answer=answer.text,
                                           distribution=None, source="reflection", created=time.time()))
        return ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp, normal=False,
                                revised_answer=answer.text, memory_item_id=item.id,
                                memory_version=int(self.bank.version))

    def _constrained_answer(self, messages, request: ReflectionRequest) -> ReflectionAnswer:
        """For small in-process models whose free text fails validation: the same decision asked as
        constrained choices (normal or revise; the revised top action from the original action set),
        with a rationale stating the observed failure. The result passes the same strict parser."""
        failure = request.failure
        allowed = action_set_of(request.query)
        if not failure.collision:
            verdict = self.llm.choose(messages, [NORMAL_ANSWER, RANKED_TAG])
            if verdict.text == NORMAL_ANSWER:
                return parse_reflection(NORMAL_ANSWER, request.query, collision=False)
        choices = [c for c in allowed if c != failure.issued_decision] or allowed
        top = self.llm.choose(messages, choices, assistant_prefix=f"{RANKED_TAG} ").text
        reason = self.prompts.failure_text(failure)
        text = format_ranked_answer([top], {top: f"{reason} {top} is preferred over "
                                                 f"{failure.issued_decision or 'the executed decision'} here."})
        return parse_reflection(text, request.query, collision=failure.collision)

    def process(self, outbox: Outbox, pending: PendingRequest, backoff_base: float = 1.0,
                backoff_max: float = 60.0) -> ReflectionResult | None:
        """Try one pending request: a result (recorded as done), or None if it stays queued."""
        request = pending.request
        try:
            result = self.reflect(request, attempt=pending.attempts)
        except ReflectionUnavailable as exc:
            outbox.retry_later(request.id, backoff_base, backoff_max, f"endpoint unavailable: {exc}")
            return None
        except MalformedModelOutput as exc:
            if pending.attempts + 1 < self.config.max_invalid_answers:
                outbox.retry_later(request.id, 0.0, 0.0, f"invalid answer: {exc}")
                return None
            result = ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp, normal=False,
                                      memory_version=int(self.bank.version), error=f"invalid reflection: {exc}")
        except InvalidItemError as exc:  # e.g. a scene-vector bank: reflection items carry only text
            result = ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp, normal=False,
                                      memory_version=int(self.bank.version), error=f"memory update refused: {exc}")
        outbox.done(request.id, {"normal": result.normal, "memory_item_id": result.memory_item_id,
                                 "error": result.error})
        return result
