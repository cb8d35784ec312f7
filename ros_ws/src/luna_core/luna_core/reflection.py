"""The reflection system (LUNA-AD Sec. III-E2, Eq. 29), grounded in hindsight, and its durable outbox.

A reflection request pairs a failure zeta_t with the explanation A_md of the decision executed at the
time and the hindsight observation of that decision (``luna_core.hindsight``: the state at its stamp
and what was perceived in the seconds after). ``ReflectionSystem.reflect``:

1. runs the hindsight check: every action of the original action set rolled out from that state
   against what happened, with the teacher's rollouts and scores; it names the best action that
   neither collides nor stalls, or finds that no revision is due;
2. without a revision due, writes nothing: 'normal' after a stall or a blocked ego (the situation held
   it, or the decision was as good as any), "no grounded revision" after a collision (no decision
   would have done better; the paper allows 'normal' only without a collision);
3. with a revision due, the revised answer A_refl is the grounded one (the best action first, the
   teacher's rationale and one sentence on what happened in hindsight); if a reflection LLM is
   configured (an OpenAI-compatible endpoint, e.g. DeepSeek-R1 as in the paper), Q_refl (P_refl: the
   original Q_md without retrieved context, A_md, zeta_t, plus the hindsight outcomes) asks it to write
   the revision; its answer is validated strictly (the original format, actions from the original
   action set, each named correctly) and must agree with the hindsight check (the best action first,
   nothing unsafe listed), else it is rejected;
4. appends the reflection memory item <Q_md, e, -, A_refl> to the bank (no distribution label).

Nothing is written without a hindsight check, so nothing that collides in hindsight is ever written;
``audit_reflections`` checks that again for every reflection item of a bank from the outbox journal.

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
from typing import Any, Sequence

from luna_core.hindsight import (HindsightConfig, HindsightError, HindsightObservation, HindsightVerdict,
                                 hindsight_check)
from luna_core.llm.base import LLMConfigError, LLMError
from luna_core.memory.bank import InvalidItemError
from luna_core.memory.journal import Journal, scan
from luna_core.prompts.knowledge import RANKED_TAG
from luna_core.prompts.parsers import MalformedModelOutput, action_set_of, parse_ranked_answer, parse_reflection
from luna_core.scene import scene_vector
from luna_core.types import DecisionDistribution, DecisionExplanation, FailureEvent, MemoryItem, ReflectionResult


@dataclass
class ReflectionRequest:
    """Everything Eq. 29 and the hindsight check need, in a JSON-safe form."""

    id: str
    query: str  # Q_md without retrieval context
    answer: str  # A_md, the explanation of the executed decision
    failure_stamp: float
    issued_decision: str
    colliding_ids: list[str]
    stall: bool
    created: float = field(default_factory=time.time)
    decision_stamp: float = 0.0
    blocked_by: str = ""
    collision_kinds: dict[str, str] = field(default_factory=dict)
    near_misses: dict[str, float] = field(default_factory=dict)  # object id -> least projected TTC (s)
    explanation_latency: float = 0.0  # s the explanation took
    observation: dict[str, Any] | None = None  # HindsightObservation.to_dict() of the executed decision
    # The decisions before it (latest first), each {"decision_stamp", "issued_decision", "query",
    # "observation"}: after a collision no decision could avoid any more, the latest of them from which
    # one could have is revised instead (LeapVAD's reflection picks the frame with the best chance).
    earlier: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_events(cls, explanation: DecisionExplanation, failure: FailureEvent,
                    observation: HindsightObservation | None = None,
                    earlier: Sequence[tuple[DecisionDistribution, HindsightObservation]] = ()) -> "ReflectionRequest":
        return cls(id=uuid.uuid4().hex, query=explanation.query, answer=explanation.text,
                   failure_stamp=failure.stamp, issued_decision=failure.issued_decision,
                   colliding_ids=list(failure.colliding_ids), stall=failure.stall,
                   decision_stamp=failure.decision_stamp, blocked_by=failure.blocked_by,
                   collision_kinds=dict(failure.collision_kinds), near_misses=dict(failure.near_misses),
                   explanation_latency=explanation.latency,
                   observation=observation.to_dict() if observation is not None else None,
                   earlier=[{"decision_stamp": d.stamp, "issued_decision": d.top_action, "query": d.query,
                             "observation": o.to_dict()} for d, o in earlier])

    @property
    def failure(self) -> FailureEvent:
        return FailureEvent(self.failure_stamp, self.issued_decision, self.decision_stamp, list(self.colliding_ids),
                            self.stall, self.blocked_by, dict(self.collision_kinds), dict(self.near_misses))


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
    hindsight: HindsightConfig = field(default_factory=HindsightConfig)


@dataclass
class Grounding:
    """The decision a reflection revises and its hindsight verdict (the failed decision's, or an earlier
    one's after a collision that could not be avoided any more)."""

    verdict: HindsightVerdict
    query: str  # that decision's Q_md (the memory item's query)
    answer: str  # its answer as given (A_md of the failed decision; the executed code of an earlier one)
    decision_stamp: float

    def summary(self, request: ReflectionRequest) -> str:
        earlier = abs(self.decision_stamp - request.decision_stamp) > 1e-6
        return (f"from the decision at {self.decision_stamp:.1f} s, "
                f"{request.decision_stamp - self.decision_stamp:.1f} s before the failed one: " if earlier else "") \
            + self.verdict.summary()


class ReflectionSystem:
    """Hindsight check, then (optionally) the reflection LLM, then the memory update (module docstring).

    ``llm`` is a chat model (an OpenAI-compatible endpoint) or None: the grounded revision is then
    written as it is.
    """

    def __init__(self, llm, prompts, bank, config: ReflectionConfig = ReflectionConfig()) -> None:
        self.llm = llm
        self.prompts = prompts
        self.bank = bank  # a writable MemoryBank
        self.config = config

    def _result(self, request: ReflectionRequest, **fields: Any) -> ReflectionResult:
        return ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp,
                                memory_version=int(self.bank.version), **{"normal": False, **fields})

    def _check(self, query: str, executed: str, observation: dict[str, Any] | None) -> HindsightVerdict:
        if observation is None:
            raise HindsightError("the request carries no hindsight observation")
        try:
            allowed = action_set_of(query)
        except MalformedModelOutput as exc:
            raise HindsightError(f"the request's query states no action set: {exc.reason}") from exc
        return hindsight_check(HindsightObservation.from_dict(observation), allowed, executed, self.config.hindsight)

    def grounding(self, request: ReflectionRequest) -> Grounding:
        """The hindsight check behind the request: of its executed decision; after a collision or a near
        miss that no decision could avoid from there any more (the executed action collides in hindsight
        and no revision is due), of the latest earlier decision that has a revision due. Raises
        ``HindsightError`` when the request carries no usable observation."""
        verdict = self._check(request.query, request.issued_decision, request.observation)
        grounding = Grounding(verdict, request.query, request.answer, request.decision_stamp)
        executed = verdict.outcomes.get(request.issued_decision)
        if verdict.revise or not request.failure.conflict or executed is None or not executed.collision:
            return grounding
        for before in request.earlier:
            try:
                earlier = self._check(before["query"], before["issued_decision"], before["observation"])
            except (HindsightError, KeyError):
                continue
            if earlier.revise:
                return Grounding(earlier, before["query"], f"{RANKED_TAG} {before['issued_decision']}",
                                 float(before["decision_stamp"]))
        return grounding

    def reflect(self, request: ReflectionRequest, attempt: int = 0) -> ReflectionResult:
        """One reflection. Raises ReflectionUnavailable when the endpoint fails (retry later) and
        MalformedModelOutput when the LLM's answer is invalid or contradicts the hindsight check."""
        try:
            grounding = self.grounding(request)
        except HindsightError as exc:  # nothing is written unchecked
            return self._result(request, error=f"no hindsight check: {exc}")
        verdict = grounding.verdict
        if not verdict.revise:
            # 'normal' when the executed decision was safe in hindsight and as good as any (a stall the
            # situation explains, a blocked ego, a near miss no decision would have avoided better). After
            # a collision, or where nothing was safe, 'normal' is not an answer: no grounded revision.
            normal = not request.failure.collision and verdict.executed in verdict.safe
            return self._result(request, normal=normal, hindsight=verdict.summary())
        text = verdict.answer() if self.llm is None else self._llm_answer(request, grounding, attempt)
        # The scene of the revised decision keys the item in a scene-vector bank (retrieval by xi_t).
        scene = verdict.scene
        item = self.bank.append(MemoryItem(id=f"refl-{request.id}", query=grounding.query, answer=text,
                                           distribution=None, source="reflection", created=time.time(),
                                           scene_vector=scene_vector(scene) if scene is not None else None))
        return self._result(request, revised_answer=text, memory_item_id=item.id, hindsight=grounding.summary(request))

    def _llm_answer(self, request: ReflectionRequest, grounding: Grounding, attempt: int) -> str:
        """Q_refl (Eq. 29a) with the hindsight outcomes, answered by the reflection LLM (Eq. 29b); the
        answer is parsed strictly and must agree with the hindsight check."""
        failure, verdict = request.failure, grounding.verdict
        messages = self.prompts.refl_messages(grounding.query, grounding.answer, failure, verdict.facts(), verdict.best)
        try:
            completion = self.llm.chat(messages, temperature=self.config.temperature, seed=attempt,
                                       max_tokens=self.config.max_tokens)
        except LLMConfigError:
            raise
        except LLMError as exc:
            raise ReflectionUnavailable(str(exc)) from exc
        answer = parse_reflection(completion.text, grounding.query, collision=failure.collision)
        disagreement = verdict.disagreement(answer.ranked) if not answer.normal else \
            f"the answer is 'normal'; hindsight names {verdict.best}"
        if disagreement:
            raise MalformedModelOutput("reflection", "hindsight", disagreement, completion.text)
        return answer.text

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
        except InvalidItemError as exc:  # e.g. a scene-vector bank and a request recorded without its scene
            result = ReflectionResult(stamp=time.time(), failure_stamp=request.failure_stamp, normal=False,
                                      memory_version=int(self.bank.version), error=f"memory update refused: {exc}")
        outbox.done(request.id, {"normal": result.normal, "memory_item_id": result.memory_item_id,
                                 "error": result.error, "hindsight": result.hindsight})
        return result


# --------------------------------------------------------------------------------------------------
# Audit: nothing in the bank collides in hindsight
# --------------------------------------------------------------------------------------------------


def outbox_summary(outbox_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What an outbox journal holds: requests by failure kind, their outcomes (written, 'normal', no
    grounded revision, rejected, pending) and the explanations' latencies (for run summaries)."""
    journal = Path(outbox_dir) / "outbox.jsonl"
    records = scan(journal).records if journal.exists() else []
    puts = [r["request"] for r in records if r.get("op") == "put"]
    done = {r["id"]: r.get("result", {}) for r in records if r.get("op") == "done"}
    results = [done[p["id"]] for p in puts if p["id"] in done]
    latencies = [float(p.get("explanation_latency", 0.0)) for p in puts]
    return {
        "requests": len(puts),
        "collisions": sum(1 for p in puts if p.get("colliding_ids")),
        "near_misses": sum(1 for p in puts if p.get("near_misses")),
        "stalls": sum(1 for p in puts if p.get("stall")),
        "blocked": sum(1 for p in puts if p.get("blocked_by")),
        "without_hindsight_observation": sum(1 for p in puts if p.get("observation") is None),
        "written": sum(1 for r in results if r.get("memory_item_id")),
        "normal": sum(1 for r in results if r.get("normal")),
        "no_grounded_revision": sum(1 for r in results if not r.get("normal") and not r.get("memory_item_id")
                                    and not r.get("error")),
        "rejected": sum(1 for r in results if r.get("error")),
        "pending": len(puts) - len(results),
        "explanation_latency_mean_s": sum(latencies) / len(latencies) if latencies else None,
        "explanation_latency_max_s": max(latencies) if latencies else None,
    }


@dataclass
class AuditFinding:
    item_id: str
    problem: str


def audit_reflections(bank, outbox_dir: str | os.PathLike[str],
                      config: HindsightConfig | None = None) -> tuple[int, list[AuditFinding]]:
    """Check every reflection item of ``bank`` against the hindsight check of its request in the outbox
    journal at ``outbox_dir``: the request must exist and carry an observation, and no action the
    item ranks may be unsafe in hindsight (collide, fail to execute as asked, stall). Returns the
    number of reflection items checked and the findings (empty: the bank is clean)."""
    journal = Path(outbox_dir) / "outbox.jsonl"
    requests = {}
    if journal.exists():
        for record in scan(journal).records:
            if record.get("op") == "put":
                requests[f"refl-{record['request']['id']}"] = ReflectionRequest(**record["request"])
    system = ReflectionSystem(None, None, bank, ReflectionConfig(hindsight=config or HindsightConfig()))
    items = [item for item in bank if item.source == "reflection"]
    findings = []
    for item in items:
        request = requests.get(item.id)
        if request is None:
            findings.append(AuditFinding(item.id, "no reflection request in the outbox journal"))
            continue
        try:
            verdict = system.grounding(request).verdict
            ranked = parse_ranked_answer(item.answer, action_set_of(item.query), kind="reflection").ranked
        except (HindsightError, MalformedModelOutput) as exc:
            findings.append(AuditFinding(item.id, str(exc)))
            continue
        unsafe = [f"{code} {verdict.unsafe[code]}" for code in ranked if code in verdict.unsafe]
        if unsafe:
            findings.append(AuditFinding(item.id, "unsafe in hindsight: " + "; ".join(unsafe)))
    return len(items), findings
