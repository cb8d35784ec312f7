"""``luna-offline collect``: run the analytical system (teacher) over frames into a memory bank.

    luna-offline collect --frames frames.jsonl --bank models/bank --run runs/collect1 \\
        --backend openai --base-url https://api.deepseek.com --model deepseek-chat \\
        --api-key-env DEEPSEEK_API_KEY --price-prompt 0.27 --price-completion 1.10 --spending-cap 5

* Resumable: every finished frame is durable before the next one is counted (the memory item is
  appended and fsync'ed by the bank, then the frame's record is appended and fsync'ed to
  ``<run>/records.jsonl``); a rerun skips frames found in either, so nothing is repeated.
* Concurrent: ``--concurrency`` frames are in flight at once; the bank and the records have one
  writer, this process. LLM teachers run their frames in threads (the work is waiting on the
  endpoint, whose client also bounds its own concurrent requests); simulation-grounded teachers
  (``--scorer``) are CPU-bound and run in worker processes (``--executor process``, the default
  there with ``--concurrency`` > 1) or on Ray workers (``--executor ray [--ray-address ADDR]``,
  for many machines); each worker gets one copy of the teacher and keeps its scenario cache.
* Progress bar with ETA (tqdm), and a token / cost summary; ``--spending-cap`` is a hard cap (each
  request reserves its worst-case cost first), reaching it stops the run cleanly (exit code 3) and a
  rerun with a higher cap continues where it stopped.
* Every model answer is cached on disk by a hash of (model, messages, sampling parameters, seed);
  seeds derive from the frame id, so a rerun of the same frames costs nothing and gives the same items.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

from luna_core.llm import BudgetExceeded, CachingChatModel, EndpointConfig, OpenAIChatModel, UsageMeter
from luna_core.memory import InvalidItemError
from luna_core.scene import scene_vector
from luna_core.teacher import (LLMVoterPool, ScoredVoterPool, Teacher, TeacherConfig, TeacherResult,
                               derive_seed)
from luna_offline.frames import Frame, read_frames

RECORDS = "records.jsonl"
SUMMARY = "summary.json"
EXIT_BUDGET = 3


class CollectError(RuntimeError):
    """The run cannot start or continue (bad run directory, unreadable records...)."""


@dataclass
class CollectSummary:
    frames_total: int = 0
    skipped_done: int = 0
    skipped_in_bank: int = 0  # of skipped_done: ids already items of the bank that this run never recorded
    ok: int = 0
    failed: int = 0
    voters_dropped: int = 0
    constrained_votes: int = 0
    constrained_confidences: int = 0
    template_rationales: int = 0
    parse_failures: int = 0
    stopped: str = ""  # why the run stopped early ("" = all frames processed)
    wall_time: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, int] = field(default_factory=dict)

    def table(self) -> str:
        rows = [("frames (total / already done)", f"{self.frames_total} / {self.skipped_done}"),
                ("of those, ids already in the bank, not from this run", self.skipped_in_bank),
                ("frames ok / failed", f"{self.ok} / {self.failed}"),
                ("voters dropped", self.voters_dropped),
                ("votes / confidences by constrained decoding", f"{self.constrained_votes} / "
                                                                f"{self.constrained_confidences}"),
                ("template rationales", self.template_rationales),
                ("recorded parse / endpoint failures", self.parse_failures),
                ("prompt / completion tokens", f"{self.usage.get('prompt_tokens', 0)} / "
                                               f"{self.usage.get('completion_tokens', 0)}"),
                ("cost (cap)", f"{self.usage.get('cost', 0.0):.4f} ({self.usage.get('spending_cap')})"),
                ("cache hits / misses", f"{self.cache.get('hits', 0)} / {self.cache.get('misses', 0)}"),
                ("wall time (s)", f"{self.wall_time:.1f}")]
        if self.stopped:
            rows.append(("stopped", self.stopped))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def read_records(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The records of a run, in order; a torn line (a crash mid-write: not acknowledged) is skipped and
    said. Raises ValueError naming file and line for a readable record without a frame id."""
    path = run_dir / RECORDS
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                print(f"[collect] ignoring unreadable record {path}:{n}", file=sys.stderr)
                continue
            if not isinstance(rec, dict) or "frame" not in rec:
                raise ValueError(f"{path}:{n}: not a collect record (no 'frame' field)")
            yield rec


def recorded_frames(run_dir: Path, retry_failed: bool) -> set[str]:
    """Frame ids this run's records list as done (ok, or failed unless retrying)."""
    return {rec["frame"] for rec in read_records(run_dir) if rec.get("ok") or not retry_failed}


def _append_record(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _tally(summary: CollectSummary, result: TeacherResult) -> None:
    summary.ok += result.ok
    summary.failed += not result.ok
    summary.voters_dropped += result.voting.dropped_voters
    summary.constrained_votes += sum(b.vote_source == "constrained" for b in result.voting.ballots)
    summary.constrained_confidences += sum(b.confidence_source == "constrained_expectation"
                                           for b in result.voting.ballots)
    summary.template_rationales += result.ok and result.rationale_source == "template"
    summary.parse_failures += len(result.failures)


# --------------------------------------------------------------------------------------------------
# Frame runners: where teacher.run executes (threads, worker processes, Ray workers)
# --------------------------------------------------------------------------------------------------


def run_frame(teacher: Teacher, frame: Frame, seed: int) -> TeacherResult:
    """The teacher on one frame; the context tells a scorer where the frame comes from."""
    return teacher.run(frame.scene, {**frame.origin, "time": frame.time, "frame": frame.id},
                       seed=derive_seed(seed, frame.id))


class FrameRunner(Protocol):
    """Runs frames somewhere and hands back ``concurrent.futures.Future``s of their results."""

    def submit(self, frame: Frame) -> Future:
        ...

    def shutdown(self) -> None:
        ...


class ThreadRunner:
    """Frames in threads of this process (LLM teachers: the work waits on the endpoint)."""

    def __init__(self, teacher: Teacher, seed: int, workers: int) -> None:
        self.teacher, self.seed = teacher, seed
        self.pool = ThreadPoolExecutor(max(workers, 1), thread_name_prefix="collect")

    def submit(self, frame: Frame) -> Future:
        return self.pool.submit(run_frame, self.teacher, frame, self.seed)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


_WORKER_TEACHER: Teacher | None = None  # the teacher of this worker process


def _init_worker(teacher: Teacher) -> None:
    global _WORKER_TEACHER
    _WORKER_TEACHER = teacher


def _run_in_worker(frame: Frame, seed: int) -> TeacherResult:
    assert _WORKER_TEACHER is not None, "worker process started without its teacher"
    return run_frame(_WORKER_TEACHER, frame, seed)


class ProcessRunner:
    """Frames in ``workers`` processes (multiprocessing, spawned: this process may hold torch
    threads that a fork would copy in a locked state); the teacher is sent once per worker."""

    def __init__(self, teacher: Teacher, seed: int, workers: int) -> None:
        import multiprocessing

        self.seed = seed
        self.pool = ProcessPoolExecutor(max(workers, 1), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_worker, initargs=(teacher,))

    def submit(self, frame: Frame) -> Future:
        return self.pool.submit(_run_in_worker, frame, self.seed)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class _RayWorker:
    """One Ray actor: a teacher copy (and its scorer's scenario cache) that runs frames."""

    def __init__(self, teacher: Teacher) -> None:
        self.teacher = teacher

    def run(self, frame: Frame, seed: int) -> TeacherResult:
        return run_frame(self.teacher, frame, seed)


class RayRunner:
    """Frames on ``workers`` Ray actors of a cluster (``address``) or of a local Ray instance
    started here (then stopped by ``shutdown``); each frame goes to the least busy actor."""

    def __init__(self, teacher: Teacher, seed: int, workers: int, address: str | None = None) -> None:
        import ray

        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=address, num_cpus=None if address else max(workers, 1), include_dashboard=False,
                     log_to_driver=False)
        actor = ray.remote(num_cpus=1)(_RayWorker)
        shared = ray.put(teacher)
        self.actors = [actor.remote(shared) for _ in range(max(workers, 1))]
        self.busy = [0] * len(self.actors)
        self.seed = seed

    def submit(self, frame: Frame) -> Future:
        k = min(range(len(self.actors)), key=self.busy.__getitem__)
        self.busy[k] += 1
        future = self.actors[k].run.remote(frame, self.seed).future()
        future.add_done_callback(lambda _f, k=k: self.busy.__setitem__(k, self.busy[k] - 1))
        return future

    def shutdown(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        if self.started:
            self.ray.shutdown()


def collect(frames: Sequence[Frame], teacher: Teacher, bank: Any, run_dir: str | Path, *,
            seed: int = 0, concurrency: int = 1, retry_failed: bool = False, meter: UsageMeter | None = None,
            cache: CachingChatModel | None = None, progress: bool = True,
            runner: FrameRunner | None = None) -> CollectSummary:
    """Run ``teacher`` on every frame not yet done; append items to ``bank`` (an open, writable
    ``MemoryBank``) and records to ``run_dir``. Stops cleanly on ``BudgetExceeded`` or Ctrl-C.

    Frames run in ``runner`` (default: ``concurrency`` threads); at most ``concurrency`` are in
    flight. Results come back to this process, the only writer of the bank and the records."""
    from tqdm import tqdm

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    records = run_dir / RECORDS
    # Frames needing no work: recorded by this run (ok, or failed unless retrying) or already in the bank.
    recorded = recorded_frames(run_dir, retry_failed)
    in_bank = {item.id for item in bank.items}
    todo = [f for f in frames if f.id not in recorded and f.id not in in_bank]
    # A resumed run lists its frames in the records (all but those in flight at a crash); an id clash does
    # not, e.g. a second on-policy collection of the same scenarios by another student, lost silently before.
    clashes = [f.id for f in frames if f.id in in_bank and f.id not in recorded]
    summary = CollectSummary(frames_total=len(frames), skipped_done=len(frames) - len(todo),
                             skipped_in_bank=len(clashes))
    if clashes:
        print(f"[collect] {len(clashes)} of {len(frames)} frames skipped: the bank already holds items with their "
              f"ids (e.g. {clashes[0]}) and {records} does not list them; if they are other states under the same "
              "ids, give their collection its own ids (`luna-offline frames --on-policy ... --tag NAME`)",
              file=sys.stderr)

    bar = tqdm(total=len(todo), desc="collect", unit="frame", disable=not progress)
    pool = runner or ThreadRunner(teacher, seed, concurrency)
    pending: dict[Future, Frame] = {}
    queue = list(todo)
    try:
        while queue or pending:
            while queue and len(pending) < max(concurrency, 1) and not summary.stopped:
                frame = queue.pop(0)
                pending[pool.submit(frame)] = frame
            if not pending:
                break
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                frame = pending.pop(fut)
                try:
                    result = fut.result()
                except BudgetExceeded as exc:
                    summary.stopped = f"spending cap reached: {exc}"
                    queue.clear()
                    continue
                except Exception as exc:  # one broken frame must not end the run: record it, go on
                    _append_record(records, {"frame": frame.id, "scenario": frame.scenario, "time": frame.time,
                                             "ok": False, "reason": f"{type(exc).__name__}: {exc}"})
                    summary.failed += 1
                    bar.update(1)
                    continue
                record = result.record()
                if result.ok:
                    item = result.memory_item(frame.id, time.time(), scene_vector(frame.scene))
                    try:
                        bank.append(item)  # durable before the record says the frame is done
                    except InvalidItemError as exc:  # this item only; a broken bank raises other errors
                        result.ok, result.reason = False, f"memory bank refused the item: {exc}"
                        record.update(ok=False, reason=result.reason)
                _append_record(records, {"frame": frame.id, "scenario": frame.scenario, "time": frame.time,
                                         "expert_decision": frame.expert_decision, **record})
                _tally(summary, result)
                bar.update(1)
                if meter is not None:
                    bar.set_postfix(cost=f"{meter.cost:.4f}", tokens=meter.prompt_tokens + meter.completion_tokens)
    except KeyboardInterrupt:
        summary.stopped = "interrupted"
        queue.clear()
    finally:
        pool.shutdown()
        bar.close()
    summary.wall_time = time.monotonic() - t0
    summary.usage = meter.summary() if meter is not None else {}
    summary.cache = {"hits": cache.hits, "misses": cache.misses} if cache is not None else {}
    (run_dir / SUMMARY).write_text(json.dumps(vars(summary), indent=2, default=str), encoding="utf-8")
    return summary


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _load_object(spec: str) -> Any:
    """``package.module:callable`` -> the callable's result (e.g. an ActionScorer factory)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise CollectError(f"expected 'module:callable', got {spec!r}")
    return getattr(importlib.import_module(module), name)()


def build_model(args: argparse.Namespace, meter: UsageMeter) -> Any:
    if args.backend == "local":
        from luna_core.llm import TransformersChatModel

        return TransformersChatModel(args.model, num_threads=args.threads, meter=meter)
    if not args.base_url:
        raise CollectError("--backend openai needs --base-url")
    config = EndpointConfig(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                            timeout=args.timeout, max_retries=args.retries, concurrency=args.concurrency,
                            requests_per_minute=args.rpm, top_k_field=None if args.no_top_k else "top_k",
                            price_prompt_per_1m=args.price_prompt, price_completion_per_1m=args.price_completion)
    return OpenAIChatModel(config, meter)


def run(args: argparse.Namespace) -> int:
    from luna_core.memory import MemoryBank, MiniLMEmbedder, SceneVectorEmbedder  # MiniLM loads lazily

    frames = read_frames(args.frames)[: args.limit or None]
    config = TeacherConfig(num_voters=args.voters, vote_temperature=args.temperature, top_k=args.top_k,
                           vote_max_tokens=args.max_tokens_vote, confidence_max_tokens=args.max_tokens_confidence,
                           summary_max_tokens=args.max_tokens_summary, parallel=args.voter_parallel,
                           constrained_fallback=not args.no_constrained,
                           score_temperature=args.score_temperature)
    meter = UsageMeter(spending_cap=args.spending_cap)
    cache = None
    summarizer = None
    if args.scorer:
        voters: Any = ScoredVoterPool(_load_object(args.scorer), config)
    else:
        cache = CachingChatModel(build_model(args, meter), args.cache or args.run / "cache")
        voters = LLMVoterPool(cache, config=config)
        summarizer = None if args.no_summary else cache
    teacher = Teacher(voters, summarizer, config=config)
    embedder = MiniLMEmbedder() if args.embedder == "minilm" else SceneVectorEmbedder()
    executor = args.executor
    if executor == "auto":
        executor = "process" if args.scorer and args.concurrency > 1 else "thread"
    if executor != "thread" and not args.scorer:
        raise CollectError(f"--executor {executor} runs simulation-grounded teachers (--scorer); LLM teachers "
                           f"run in threads (their response cache and spending cap live in this process)")
    runner: FrameRunner | None = None
    if executor == "process":
        runner = ProcessRunner(teacher, args.seed, args.concurrency)
    elif executor == "ray":
        runner = RayRunner(teacher, args.seed, args.concurrency, args.ray_address)
    with MemoryBank.create(args.bank, embedder, index=args.index, exist_ok=True) as bank:
        summary = collect(frames, teacher, bank, args.run, seed=args.seed, concurrency=args.concurrency,
                          retry_failed=args.retry_failed, meter=meter, cache=cache, runner=runner)
    print(summary.table())
    if summary.stopped.startswith("spending cap"):
        return EXIT_BUDGET
    return 0 if summary.ok or summary.skipped_done else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("collect", help="run the teacher over frames into a memory bank",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=Path, required=True, help="frames JSON lines (luna-offline frames)")
    p.add_argument("--bank", type=Path, required=True, help="memory bank directory (created if missing)")
    p.add_argument("--run", type=Path, required=True, help="run directory: records, summary, cache")
    p.add_argument("--cache", type=Path, help="response cache directory (default <run>/cache)")
    p.add_argument("--limit", type=int, default=0, help="only the first N frames")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retry-failed", action="store_true", help="redo frames recorded as failed")
    g = p.add_argument_group("model")
    g.add_argument("--backend", choices=("local", "openai"), default="local")
    g.add_argument("--model", default="smollm2-135m-instruct", help="model name or local path")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--api-key-env", help="NAME of the environment variable holding the API key")
    g.add_argument("--timeout", type=float, default=120.0)
    g.add_argument("--retries", type=int, default=4)
    g.add_argument("--rpm", type=float, help="maximum requests per minute")
    g.add_argument("--no-top-k", action="store_true", help="do not send top_k (servers without it)")
    g.add_argument("--price-prompt", type=float, default=0.0, help="price per 1M prompt tokens")
    g.add_argument("--price-completion", type=float, default=0.0, help="price per 1M completion tokens")
    g.add_argument("--spending-cap", type=float, help="hard cap on the total cost")
    g.add_argument("--threads", type=int, default=2, help="torch threads (local backend)")
    t = p.add_argument_group("teacher")
    t.add_argument("--voters", type=int, default=10, help="M")
    t.add_argument("--temperature", type=float, default=0.7)
    t.add_argument("--top-k", type=int, default=40)
    t.add_argument("--max-tokens-vote", type=int, default=512)
    t.add_argument("--max-tokens-confidence", type=int, default=160)
    t.add_argument("--max-tokens-summary", type=int, default=512)
    t.add_argument("--voter-parallel", type=int, default=1, help="voters of one frame run concurrently")
    t.add_argument("--concurrency", type=int, default=1, help="frames in flight (threads, processes or Ray actors)")
    t.add_argument("--executor", choices=("auto", "thread", "process", "ray"), default="auto",
                   help="where frames run: auto = worker processes for --scorer with --concurrency > 1, else "
                        "threads; ray = Ray actors (a local instance, or --ray-address)")
    t.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray instance)")
    t.add_argument("--no-summary", action="store_true", help="template rationales instead of the summariser")
    t.add_argument("--no-constrained", action="store_true", help="drop voters whose answers do not parse")
    t.add_argument("--scorer", help="simulation-grounded voters: 'module:factory' returning an ActionScorer")
    t.add_argument("--score-temperature", type=float, default=TeacherConfig.score_temperature,
                   help="scored voters: softmax temperature over the outcome scores")
    m = p.add_argument_group("memory bank")
    m.add_argument("--embedder", choices=("minilm", "scene-vector"), default="minilm")
    m.add_argument("--index", choices=("flat", "hnsw"), default="flat")
    p.set_defaults(func=run)
