"""``luna-bridge reflect``: reflection rounds that measure their gain (LUNA-AD Sec. III-E and IV-D,
Table V's last two rows; LeapVAD Sec. III-E and Table VIII: the memory growing round after round).

Round 0 evaluates the stack with the source bank: the row without reflection items. Round r = 1..R:

1. **Deploy**: the stack (the student deciding every T_d with K items retrieved from the bank of round
   r - 1, the decision-guided planner; ``luna_bridge.stack_planner``, as ``luna-bridge eval`` builds it)
   drives the reflection split in the closed-loop simulator (non-reactive unless ``--reactive``).
   The reflection split is scenarios in neither the training suite nor the evaluation set, like the
   paper's Reduced-Val14: ``luna-bridge generate-suite --splits reflect`` (seed base 4000; see
   docs/reflection.md).
2. **Detect**: each run is replayed through the progress monitor exactly as the ``progress_monitor``
   node sees it (odometry and object frames at 10 Hz, the scene descriptors, the issued decisions; a
   check every T_d; collisions, Eq. 23 stalls, blocked; the failure gate's cooldown).
3. **Explain**: the student explains the decision executed when each failure happened (Eq. 25-28),
   with the context that decision was made with; its latency is recorded.
4. **Reflect**: the hindsight observation of each failed decision is cut from the run's log by the
   ``HindsightRecorder`` the ``reflection_client`` node uses; each request goes through the durable
   outbox to the ``ReflectionSystem``: the hindsight check (every alternative rolled out against what
   happened, with the teacher's machinery) writes the grounded revision, or an OpenAI-compatible LLM
   (``--endpoint``) writes it if its answer agrees with the check; nothing unchecked is written. The
   items go into the round's COPY of the bank (``round_<r>/memory_bank``); no source bank is written.
5. **Evaluate**: the stack with the round's bank drives the evaluation set with ``luna-bridge eval``'s
   machinery (``--eval-set standard``, or ``--eval-suite``), NR and R by default.

Outputs in ``<out>``: ``rounds.md`` / ``rounds.json`` (the table: failures found, revisions written,
normal, no grounded revision, rejected, the bank and its repeated revisions, NR/R CLS per suite per
round), and per round ``round_<r>/``: ``deploy/<scenario>.json`` (each deployment run: its score,
failures, explanations and reflection requests), ``memory_bank/``, ``outbox/`` (the reflection
journal, with every hindsight observation), ``reflections.jsonl`` (each failure, its explanation, the
verdict and the outcome),
``deploy.csv`` (per deployed scenario) and ``eval/<suite>/`` (the evaluation's files: per_scenario.csv,
summary.md, one result per run). A rerun resumes: finished rounds are read back, an interrupted round
keeps the deployment runs on disk (and redoes its reflection into a fresh copy of the bank), evaluations
skip the runs on disk. The deployment runs on ``workers`` processes like the evaluation's.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import multiprocessing as mp
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from luna_core.hindsight import HindsightConfig, HindsightError, HindsightRecorder
from luna_core.monitor import MonitorParameters
from luna_core.reflection import Outbox, ReflectionConfig, ReflectionRequest, ReflectionSystem
from luna_core.scene import SceneInputError
from luna_core.stack import StackConfigError as CoreConfigError
from luna_core.stack import (LLMClientConfig, MonitorConfig, SceneDescriber, build_llm_client,
                             build_progress_monitor, executed_decision)
from luna_core.types import (DecisionDistribution, DecisionExplanation, FailureEvent, PlannerInput, ReflectionResult,
                             SceneDescriptor)

from luna_bridge.metrics import score_log
from luna_bridge.scenario import SIM_DT, Scenario, SimulationLog
from luna_bridge.stack_planner import StackConfigError, StackSettings, add_stack_arguments, stack_settings_from_args

log = logging.getLogger(__name__)

BANK_DIR, OUTBOX_DIR, ROUND_FILE, DEPLOY_DIR = "memory_bank", "outbox", "round.json", "deploy"
DEPLOY_SETTINGS = "settings.json"  # in DEPLOY_DIR: what its runs were driven with
EVAL_PLANNER = "luna"


class ReflectionRoundError(RuntimeError):
    """The rounds cannot run (missing student or bank, an interrupted round, a bad option, ...)."""


@dataclass(frozen=True)
class EvalPart:
    """One suite of the evaluation set: every ``every``-th scenario (the first ``limit`` of them)."""

    suite: str
    every: int = 1
    expect_count: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class RoundConfig:
    out_dir: Path
    rounds: int = 2
    stack: StackSettings = field(default_factory=StackSettings)  # student, SOURCE bank, K, T_d, search
    evaluation: tuple[EvalPart, ...] = ()  # empty: no evaluation (deploy and reflect only)
    eval_modes: tuple[bool, ...] = (False, True)
    eval_workers: int = 1
    deploy_workers: int = 1  # processes driving the reflection split (each loads its own student)
    explanation_max_tokens: int = 0  # 0 = the heuristic system's budget (shorter on the CPU)
    # Reflection LLM: "" = the hindsight check writes the revision; else an OpenAI-compatible base URL.
    endpoint: str = ""
    model: str = ""
    api_key_env: str = ""  # NAME of the environment variable with the key (never the key)
    timeout: float = 60.0  # s per reflection request
    reflection_max_tokens: int = 512
    endpoint_wait: float = 0.0  # s to keep retrying an unreachable endpoint before evaluating anyway
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    # Deployment in closed loop.
    reactive: bool = False
    replan_every: int = 5  # simulation steps (0.1 s) between planner calls
    # Progress monitor (node defaults) and hindsight.
    stall_window_cycles: int = 3
    stall_speed_threshold: float = 0.5
    failure_cooldown: float = 5.0
    hindsight: HindsightConfig = field(default_factory=HindsightConfig)

    def llm_client(self) -> LLMClientConfig:
        """The reflection LLM's endpoint (the key stays in the environment variable named here)."""
        return LLMClientConfig(endpoint=self.endpoint, model=self.model, api_key_env=self.api_key_env,
                               timeout=self.timeout)

    def monitor_parameters(self) -> MonitorParameters:
        return MonitorParameters(decision_period=self.stack.decision_period,
                                 stall_window_cycles=self.stall_window_cycles,
                                 stall_speed_threshold=self.stall_speed_threshold)


# --------------------------------------------------------------------------------------------------
# The stack in process
# --------------------------------------------------------------------------------------------------


class SceneDecisionSource:
    """The simulator's decision source: xi_t from the planner input (as ``scene_descriptor`` builds it),
    then ``HeuristicSystem.decide``. Records every decision and every scene, which the progress
    monitor and the hindsight check need afterwards (the scene says what held the ego)."""

    def __init__(self, heuristic: Any) -> None:
        self.heuristic = heuristic
        self.describer = SceneDescriber()
        self.decisions: list[DecisionDistribution] = []
        self.scenes: list[SceneDescriptor] = []
        self.scene_errors: list[str] = []

    def reset(self) -> None:
        """A new scenario: forget the records, the recent actions of the prompt and the retrieved items
        the heuristic system would keep (its retrieval margin), so a run does not depend on the last."""
        self.decisions.clear()
        self.scenes.clear()
        self.scene_errors.clear()
        self.describer.reset()
        self.heuristic.reset()

    def decide(self, planner_input: PlannerInput) -> DecisionDistribution | None:
        try:
            scene = self.describer.describe(planner_input.ego, planner_input.objects, planner_input.traffic_lights,
                                            planner_input.route, planner_input.lane_graph, planner_input.vehicle)
        except SceneInputError as exc:  # no decision this cycle: the planner runs its fallback objective
            self.scene_errors.append(f"t={planner_input.time:.1f}s: {exc}")
            return None
        self.scenes.append(scene)
        decision = self.decision_for(scene, planner_input)
        if decision is not None:
            self.decisions.append(decision)
            self.describer.on_decision(decision)
        return decision

    def decision_for(self, scene: Any, planner_input: PlannerInput) -> DecisionDistribution | None:
        """The decision for ``scene`` (the student's; the oracle source also reads the planner input)."""
        return self.heuristic.decide(scene)


def detect_failures(sim_log: SimulationLog, decisions: Sequence[DecisionDistribution],
                    scenes: Sequence[SceneDescriptor], params: MonitorParameters,
                    cooldown: float) -> list[FailureEvent]:
    """The failures the ``progress_monitor`` node would publish for this run: every input fed by stamp,
    its tick (``luna_core.stack.FailureDetector``) every T_d from the first full period on."""
    detector = build_progress_monitor(MonitorConfig(params, cooldown))
    for scene in scenes:
        detector.monitor.update_scene(scene)
    for d in decisions:
        detector.monitor.on_decision(d)
    every = max(1, int(round(params.decision_period / SIM_DT)))
    failures = []
    for k, (t, ego, objects) in enumerate(zip(sim_log.t, sim_log.ego, sim_log.objects)):
        detector.monitor.update_ego(ego)
        detector.monitor.update_objects(objects)
        if k == 0 or k % every:
            continue
        admitted = detector.tick(float(t)).admitted
        if admitted is not None:
            failures.append(admitted)
    return failures


def hindsight_recorder(sim_log: SimulationLog, scenes: Sequence[SceneDescriptor],
                       config: HindsightConfig) -> HindsightRecorder:
    """The ``HindsightRecorder`` the ``reflection_client`` node keeps, fed with the whole run's log (the
    perceived objects and lights of every step, the scenes, the map and the route)."""
    scenario = sim_log.scenario
    recorder = HindsightRecorder(config, scenario.vehicle, keep=math.inf)
    recorder.set_map(scenario.lane_graph)
    recorder.set_route(scenario.route)
    for ego, objects, lights in zip(sim_log.ego, sim_log.objects, sim_log.lights):
        recorder.update_ego(ego)
        recorder.update_objects(objects)
        recorder.update_lights(lights)
    for scene in scenes:
        recorder.update_scene(scene)
    return recorder


@dataclass
class RunRecord:
    """One closed-loop deployment run, what the monitor found in it and what reflection needs of it."""

    scenario: str
    scenario_type: str
    score: float
    score_error: str
    failures: list[FailureEvent]
    decisions: int
    scene_errors: int
    planner_failures: int
    wall_time: float
    reflection_retrievals: int = 0  # decisions whose retrieved context held a reflection item
    explanations: list[DecisionExplanation] = field(default_factory=list)
    # One per explanation: the failure, the explanation, the hindsight observation of the executed
    # decision (None where none could be cut) and the earlier decisions', as the outbox stores them.
    requests: list[ReflectionRequest] = field(default_factory=list)
    hindsight_errors: list[str] = field(default_factory=list)
    unexplained: int = 0  # failures with no decision in force (nothing to explain)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (the deployment run's file in ``round_<r>/deploy/``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        return cls(**{**d, "failures": [FailureEvent(**f) for f in d["failures"]],
                      "explanations": [DecisionExplanation(**e) for e in d["explanations"]],
                      "requests": [ReflectionRequest(**q) for q in d["requests"]]})

    @property
    def collisions(self) -> int:
        return sum(1 for f in self.failures if f.collision)

    @property
    def near_misses(self) -> int:
        return sum(1 for f in self.failures if f.near_miss)

    @property
    def stalls(self) -> int:
        return sum(1 for f in self.failures if f.stall)

    @property
    def blocked(self) -> int:
        return sum(1 for f in self.failures if f.blocked)


def deploy_run(scenario: Scenario, stack: Any, config: RoundConfig) -> RunRecord:
    """Drive ``scenario`` with the stack, score it, detect the failures, explain them and cut the
    hindsight observation of each failed decision."""
    from luna_bridge.sim import SimulationConfig, simulate

    started = time.perf_counter()
    source: SceneDecisionSource = stack.decision_source
    sim_log = simulate(scenario, stack, reactive=config.reactive, decision_source=source,
                       config=SimulationConfig(replan_every=config.replan_every,
                                               decision_every=config.stack.decision_every))
    score = score_log(sim_log)
    failures = detect_failures(sim_log, source.decisions, source.scenes, config.monitor_parameters(),
                               config.failure_cooldown)
    heuristic = source.heuristic
    record = RunRecord(scenario.name, scenario.scenario_type, score.score, score.error, failures,
                       len(source.decisions), len(source.scene_errors), sim_log.planner_failures, 0.0,
                       _reflection_retrievals(source.decisions, heuristic.bank))
    recorder = hindsight_recorder(sim_log, source.scenes, config.hindsight) if failures else None
    for failure in failures:
        decision = executed_decision(source.decisions, failure)
        if decision is None:
            record.unexplained += 1
            continue
        explanation = heuristic.explain(decision, failure, max_tokens=config.explanation_max_tokens or None)
        record.explanations.append(explanation)
        try:
            observation = recorder.observation(failure.decision_stamp)
        except HindsightError as exc:  # the request says so; nothing is written for it
            observation = None
            record.hindsight_errors.append(f"t={failure.stamp:.1f}s: {exc}")
        record.requests.append(ReflectionRequest.from_events(explanation, failure, observation,
                                                             recorder.earlier(source.decisions, failure)))
    record.wall_time = time.perf_counter() - started
    return record


def _reflection_retrievals(decisions: Sequence[DecisionDistribution], bank: Any) -> int:
    from luna_bridge.evaluate import reflection_items_used

    return sum(1 for d in decisions if reflection_items_used(d, bank))


def _make_stack(settings: StackSettings) -> Any:
    from luna_bridge.stack_planner import make_stack_planner

    try:
        return make_stack_planner(EVAL_PLANNER, None, settings)
    except StackConfigError as exc:
        raise ReflectionRoundError(str(exc)) from None


def _deploy_settings(settings: StackSettings, config: RoundConfig) -> dict[str, Any]:
    """Everything a deployment run's record depends on (not the evaluation's options)."""
    keys = ("reactive", "replan_every", "stall_window_cycles", "stall_speed_threshold", "failure_cooldown",
            "explanation_max_tokens", "hindsight")
    return json.loads(json.dumps({"stack": asdict(settings), **{k: asdict(config)[k] for k in keys}}, default=str))


def _check_deploy_settings(path: Path, settings: StackSettings, config: RoundConfig) -> None:
    """Runs on disk are resumed only under the settings they were driven with."""
    wanted = _deploy_settings(settings, config)
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored != wanted:
            differ = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
            raise ReflectionRoundError(f"{path.parent} holds deployment runs made with other settings "
                                       f"({', '.join(differ)}): use the same options, or remove the round's "
                                       "folder to redo it")
    else:
        _write_json(path, wanted)


_worker: dict[str, Any] = {}  # a deployment worker's stack and round configuration


def _deploy_worker_init(settings: StackSettings, config: RoundConfig) -> None:
    import torch

    torch.set_num_threads(1)  # workers share the cores: one thread each
    _worker.update(stack=_make_stack(settings), config=config)


def _deploy_in_worker(scenario: Scenario) -> dict[str, Any]:
    return deploy_run(scenario, _worker["stack"], _worker["config"]).to_dict()


def deploy(scenarios: Sequence[Scenario], settings: StackSettings, config: RoundConfig, name: str,
           folder: Path) -> list[RunRecord]:
    """Drive every scenario with the stack (``config.deploy_workers`` processes); each run is written to
    ``folder/<scenario>.json`` as it finishes, and a run already there is read back instead (resumption).
    Each run starts from a reset stack, so the records do not depend on the order or the worker."""
    from luna_bridge.evaluate import single_threaded_children, write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    _check_deploy_settings(folder / DEPLOY_SETTINGS, settings, config)
    records: dict[str, RunRecord] = {}
    for scenario in scenarios:
        path = folder / f"{scenario.name}.json"
        if path.exists():
            records[scenario.name] = RunRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    todo = [s for s in scenarios if s.name not in records]
    bar = tqdm(total=len(scenarios), initial=len(records), desc=name, unit="scn")

    def done(record: RunRecord) -> None:
        write_atomic(folder / f"{record.scenario}.json", json.dumps(record.to_dict(), allow_nan=False) + "\n")
        records[record.scenario] = record
        bar.set_postfix(failures=sum(len(r.failures) for r in records.values()))
        bar.update()

    if todo and config.deploy_workers <= 1:
        stack = _make_stack(settings)
        for scenario in todo:
            done(deploy_run(scenario, stack, config))
    elif todo:
        # A configuration error must surface here: a pool whose initializer raises respawns it forever.
        _make_stack(settings)
        with single_threaded_children():
            with mp.get_context("spawn").Pool(config.deploy_workers, initializer=_deploy_worker_init,
                                              initargs=(settings, config)) as pool:
                for d in pool.imap_unordered(_deploy_in_worker, todo, chunksize=1):
                    done(RunRecord.from_dict(d))
    bar.close()
    return [records[s.name] for s in scenarios]


# --------------------------------------------------------------------------------------------------
# Reflection
# --------------------------------------------------------------------------------------------------


@dataclass
class ReflectionOutcome:
    request: ReflectionRequest
    result: ReflectionResult | None  # None: still in the outbox (endpoint unreachable)


def reflect_all(system: ReflectionSystem, outbox: Outbox, config: RoundConfig,
                sleep: Callable[[float], None] = time.sleep) -> dict[str, ReflectionResult]:
    """Send every pending request of ``outbox`` until it is empty or no request got an answer for
    ``config.endpoint_wait`` s (the endpoint unreachable); request id -> result for the ones answered."""
    results: dict[str, ReflectionResult] = {}
    last_answer = time.monotonic()
    with tqdm(total=len(outbox), desc="reflect", unit="req") as bar:
        while len(outbox):
            for pending in outbox.due():
                result = system.process(outbox, pending, config.backoff_base, config.backoff_max)
                if result is not None:
                    results[pending.request.id] = result
                    last_answer = time.monotonic()
                    bar.update(1)
            if not len(outbox):
                break
            waited = time.monotonic() - last_answer
            if waited >= config.endpoint_wait:
                log.warning("no reflection answer for %.0f s: %d request(s) stay in the outbox", waited, len(outbox))
                break
            if not outbox.due():
                sleep(min(1.0, config.endpoint_wait - waited))
    return results


def copy_bank(source: Path, target: Path) -> None:
    """Copy a bank for a round (the writer lock and cached indexes stay behind)."""
    _check_bank_copy(source, target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("writer.lock", "index-hnsw-*"))


def _check_bank_copy(source: Path, target: Path) -> None:
    if not (source / "manifest.json").exists():
        raise ReflectionRoundError(f"no memory bank at {source} (manifest.json missing)")
    if target.exists():
        raise ReflectionRoundError(f"{target} already exists (an earlier round?): choose another --out "
                                   "or remove it; a round never appends to an existing copy")
    if source.resolve() == target.resolve():
        raise ReflectionRoundError("the round's bank copy cannot be the source bank")


# --------------------------------------------------------------------------------------------------
# Rounds
# --------------------------------------------------------------------------------------------------


@dataclass
class RoundResult:
    """What one round found, wrote and scored (round 0: the source bank, evaluated only)."""

    round: int
    bank: str
    bank_items: int = 0
    reflection_items: int = 0
    counts: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, dict[str, Any]] = field(default_factory=dict)  # suite -> NR/R CLS, SR, runs
    wall_time: float = 0.0
    # reflection items repeating an earlier one's query and answer (one failure written again; retrieved
    # once, luna_core.lessons.repeated_reflections); None in a round.json written before the count
    reflection_repeats: int | None = None


def round_counts(records: Sequence[RunRecord], outcomes: Sequence[ReflectionOutcome]) -> dict[str, Any]:
    answered = [o.result for o in outcomes if o.result is not None]
    latencies = [e.latency for r in records for e in r.explanations]
    return {
        "scenarios": len(records),
        "failures": sum(len(r.failures) for r in records),
        "collisions": sum(r.collisions for r in records),
        "near_misses": sum(r.near_misses for r in records),
        "stalls": sum(r.stalls for r in records),
        "blocked": sum(r.blocked for r in records),
        "explanations": len(latencies),
        "unexplained": sum(r.unexplained for r in records),
        "explanation_latency_mean_s": round(sum(latencies) / len(latencies), 2) if latencies else None,
        "explanation_latency_max_s": round(max(latencies), 2) if latencies else None,
        "action_names_repaired": sum(e.names_repaired for r in records for e in r.explanations),
        "no_hindsight_observation": sum(len(r.hindsight_errors) for r in records),
        "requests": len(outcomes),
        "written": sum(1 for r in answered if r.memory_item_id),
        "normal": sum(1 for r in answered if r.normal),
        "no_grounded_revision": sum(1 for r in answered if not r.normal and not r.memory_item_id and not r.error),
        "rejected": sum(1 for r in answered if r.error),
        "pending": sum(1 for o in outcomes if o.result is None),
        "decisions": sum(r.decisions for r in records),
        "decisions_using_reflections": sum(r.reflection_retrievals for r in records),
        "deploy_cls": round(100.0 * sum(r.score for r in records) / len(records), 2) if records else None,
    }


def evaluate_bank(bank: Path, config: RoundConfig, out: Path, command: str) -> dict[str, dict[str, Any]]:
    """The stack with ``bank`` on the evaluation set (``luna-bridge eval``'s runs, resumable): per suite
    the NR / R CLS and success rate, the scenario count and the decisions that used reflection items."""
    from luna_bridge.evaluate import EvalConfig, EvaluationError, mode_name, run_evaluation

    settings = replace(config.stack, memory_bank=str(bank))
    table: dict[str, dict[str, Any]] = {}
    for part in config.evaluation:
        name = Path(part.suite).name
        cfg = EvalConfig(suite=part.suite, planners=[EVAL_PLANNER], modes=config.eval_modes,
                         workers=config.eval_workers, out_dir=out / name, expect_count=part.expect_count,
                         limit=part.limit, every=part.every, replan_every=config.replan_every, stack=settings)
        try:
            summary = run_evaluation(cfg, command=command, progress=True)
        except EvaluationError as exc:
            raise ReflectionRoundError(str(exc)) from None
        row = next(e for e in summary.table if e["planner"] == EVAL_PLANNER)
        used = 0
        for reactive in config.eval_modes:
            for result in (out / name / "scenarios" / EVAL_PLANNER / mode_name(reactive)).glob("*.json"):
                used += json.loads(result.read_text(encoding="utf-8")).get("decisions", {}).get(
                    "using_reflection_items", 0)
        table[name] = {**{k: row[k] for k in ("NR-CLS", "NR-SR", "R-CLS", "R-SR") if k in row},
                       "scenarios": summary.scenario_count, "decisions_using_reflections": used,
                       "failed_runs": len(summary.failures)}
    return table


def _bank_sizes(path: Path) -> tuple[int, int, int]:
    """Items, reflection items, and reflection items that repeat an earlier one."""
    from luna_core.lessons import repeated_reflections
    from luna_core.memory.bank import MemoryBank

    with MemoryBank.open(path) as bank:
        reflections = [(i, 1.0) for i in bank if i.source == "reflection"]
        return len(bank), len(reflections), len(repeated_reflections(reflections))


def reflect_round(r: int, deploy_set: Sequence[Scenario], previous_bank: Path, config: RoundConfig,
                  llm: Any) -> RoundResult:
    """Deploy with ``previous_bank``, reflect into a copy of it (``round_<r>/memory_bank``), write the
    round's files; the evaluation comes after (``run_rounds``)."""
    from luna_core.memory.bank import MemoryBank
    from luna_core.prompts import PromptManager

    started = time.perf_counter()
    folder = Path(config.out_dir) / f"round_{r}"
    bank_path = folder / BANK_DIR
    records = deploy(deploy_set, replace(config.stack, memory_bank=str(previous_bank)), config, f"round {r}: deploy",
                     folder / DEPLOY_DIR)
    # Reflection starts from a fresh copy of the bank and an empty outbox, also after an interruption:
    # the requests are the deployment records', so a redone reflection writes the same items.
    for partial in (bank_path, folder / OUTBOX_DIR):
        if partial.exists():
            shutil.rmtree(partial)
    copy_bank(previous_bank, bank_path)
    bank = MemoryBank.open(bank_path, writable=True)
    outbox = Outbox(folder / OUTBOX_DIR)
    try:
        requests = []
        for record in records:
            for request in record.requests:
                outbox.put(request)
                requests.append((record.scenario, request))
        results: dict[str, ReflectionResult] = {}
        if requests:
            system = ReflectionSystem(llm, PromptManager(), bank, ReflectionConfig(
                max_tokens=config.reflection_max_tokens, hindsight=config.hindsight))
            results = reflect_all(system, outbox, config)
        outcomes = [ReflectionOutcome(q, results.get(q.id)) for _, q in requests]
    finally:
        outbox.close()
        bank.close()
    _write_round_files(folder, records, [(s, o) for (s, _), o in zip(requests, outcomes)])
    items, reflections, repeats = _bank_sizes(bank_path)
    result = RoundResult(r, str(bank_path), items, reflections, round_counts(records, outcomes),
                         wall_time=time.perf_counter() - started, reflection_repeats=repeats)
    _write_json(folder / ROUND_FILE, asdict(result))
    return result


def run_rounds(deploy_set: Sequence[Scenario], config: RoundConfig, command: str = "") -> list[RoundResult]:
    """Round 0 (the source bank evaluated), then ``config.rounds`` reflection rounds (module docstring).
    Finished rounds are read back from ``round_<r>/round.json``; evaluations resume run by run."""
    from luna_core.assets import resolve
    from luna_core.llm import LLMConfigError

    if not deploy_set:
        raise ReflectionRoundError("no deployment scenarios")
    if config.rounds < 1:
        raise ReflectionRoundError(f"--rounds must be >= 1, got {config.rounds}")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        source_bank = resolve(config.stack.memory_bank, "memory_bank")
    except FileNotFoundError as exc:
        raise ReflectionRoundError(f"{exc} (give --memory-bank)") from None
    if not (source_bank / "manifest.json").exists():
        raise ReflectionRoundError(f"no memory bank at {source_bank} (manifest.json missing)")
    try:  # configuration errors surface before any simulation runs
        llm = build_llm_client(config.llm_client())  # None: the hindsight check writes the revision
    except (LLMConfigError, CoreConfigError) as exc:
        raise ReflectionRoundError(str(exc)) from None
    results = []
    items, reflections, repeats = _bank_sizes(source_bank)
    zero = RoundResult(0, str(source_bank), items, reflections, reflection_repeats=repeats)
    previous = source_bank
    for r in range(config.rounds + 1):
        folder = out / f"round_{r}"
        if r == 0:
            result = zero
        elif (folder / ROUND_FILE).exists():
            result = RoundResult(**json.loads((folder / ROUND_FILE).read_text(encoding="utf-8")))
            if result.reflection_repeats is None and Path(result.bank).exists():
                result.reflection_repeats = _bank_sizes(Path(result.bank))[2]
        else:  # new, or interrupted: its deployment runs on disk are kept (reflect_round)
            result = reflect_round(r, deploy_set, previous, config, llm)
        if config.evaluation:  # the round's wall time so far is its deployment and reflection (reflect_round's)
            started = time.perf_counter()
            result.evaluation = evaluate_bank(Path(result.bank), config, folder / "eval", command)
            result.wall_time += time.perf_counter() - started
        if r:  # round 0 is the source bank: nothing of it is stored but the summary
            _write_json(folder / ROUND_FILE, asdict(result))
        results.append(result)
        previous = Path(result.bank)
    write_summary(results, config, command)
    return results


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=False, default=str) + "\n", encoding="utf-8")


def _failure_json(f: FailureEvent) -> dict[str, Any]:
    return {"stamp": f.stamp, "issued_decision": f.issued_decision, "decision_stamp": f.decision_stamp,
            "colliding_ids": list(f.colliding_ids), "collision_kinds": dict(f.collision_kinds), "stall": f.stall,
            "blocked_by": f.blocked_by, "near_misses": dict(f.near_misses)}


def _write_round_files(folder: Path, records: Sequence[RunRecord],
                       outcomes: Sequence[tuple[str, ReflectionOutcome]]) -> None:
    with (folder / "reflections.jsonl").open("w", encoding="utf-8") as f:
        for scenario, o in outcomes:
            request = {k: v for k, v in asdict(o.request).items() if k != "observation"}  # in the outbox
            result = None if o.result is None else {
                "normal": o.result.normal, "revised_answer": o.result.revised_answer,
                "memory_item_id": o.result.memory_item_id, "error": o.result.error, "hindsight": o.result.hindsight}
            f.write(json.dumps({"scenario": scenario, "request": request, "result": result}) + "\n")
    with (folder / "deploy.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "type", "cls", "collisions", "collision_kinds", "near_misses", "stalls", "blocked",
                    "decisions",
                    "decisions_using_reflections", "scene_errors", "planner_failures", "explanations",
                    "explanation_latency_s", "no_hindsight", "wall_time_s", "error"])
        for r in records:
            kinds = " ".join(f"{i}:{k}" for f_ in r.failures for i, k in f_.collision_kinds.items())
            w.writerow([r.scenario, r.scenario_type, f"{r.score:.4f}", r.collisions, kinds, r.near_misses, r.stalls,
                        r.blocked,
                        r.decisions, r.reflection_retrievals, r.scene_errors, r.planner_failures,
                        len(r.explanations), " ".join(f"{e.latency:.1f}" for e in r.explanations),
                        "; ".join(r.hindsight_errors), f"{r.wall_time:.1f}", r.score_error])
    _write_json(folder / "failures.json", {r.scenario: [_failure_json(f) for f in r.failures] for r in records})


def _cls(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.2f}"


def summary_markdown(results: Sequence[RoundResult], config: RoundConfig, command: str = "") -> str:
    suites = [Path(p.suite).name for p in config.evaluation]
    lines = ["# Reflection rounds", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    by = f"the LLM at {config.endpoint} (agreeing with hindsight)" if config.endpoint else "the hindsight check"
    lines += [f"Stack: {config.stack.describe()}; deployment {'reactive' if config.reactive else 'non-reactive'}; "
              f"reflection by {by}.", ""]
    header = ["round", "bank items (reflection / repeats)", "failures (coll. / near miss / stall / blocked)",
              "written", "normal", "no grounded revision", "rejected"]
    for s in suites:
        header += [f"{s} NR-CLS", f"{s} R-CLS"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for res in results:
        c = res.counts
        repeats = "-" if res.reflection_repeats is None else res.reflection_repeats
        row = [str(res.round), f"{res.bank_items} ({res.reflection_items} / {repeats})"]
        if res.round == 0:
            row += ["-"] * 5
        else:
            # Rounds written before the near-miss kind have no such count.
            row += [f"{c['failures']} ({c['collisions']} / {c.get('near_misses', 0)} / {c['stalls']} / {c['blocked']})",
                    str(c["written"]),
                    str(c["normal"]), str(c["no_grounded_revision"]), str(c["rejected"])]
        for s in suites:
            e = res.evaluation.get(s, {})
            row += [_cls(e.get("NR-CLS")), _cls(e.get("R-CLS"))]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Round 0 is the source bank (no reflection item written by these rounds): Table V's row without "
              "reflection; each later row evaluates that round's bank. Per round: `round_<r>/deploy.csv`, "
              "`reflections.jsonl` (each verdict), `eval/<suite>/per_scenario.csv`."]
    explained = [res.counts for res in results if res.round and res.counts.get("explanations")]
    if explained:
        lines += ["", "| round | explanations | latency mean / max (s) | names repaired | decisions using reflection "
                  "items (deploy / eval) |", "|---|---:|---:|---:|---:|"]
        for res in results[1:]:
            c = res.counts
            used_eval = sum(e.get("decisions_using_reflections", 0) for e in res.evaluation.values())
            lines.append(f"| {res.round} | {c['explanations']} | {_cls(c['explanation_latency_mean_s'])} / "
                         f"{_cls(c['explanation_latency_max_s'])} | {c['action_names_repaired']} | "
                         f"{c['decisions_using_reflections']} / {used_eval} |")
    return "\n".join(lines) + "\n"


def write_summary(results: Sequence[RoundResult], config: RoundConfig, command: str) -> None:
    out = Path(config.out_dir)
    (out / "rounds.md").write_text(summary_markdown(results, config, command), encoding="utf-8")
    _write_json(out / "rounds.json", {"command": command, "rounds": [asdict(r) for r in results]})


# --------------------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------------------


def load_scenarios(suite: str, limit: int | None, every: int) -> list[Scenario]:
    from luna_bridge.scenarios.registry import load_entry, suite_refs

    try:
        refs = suite_refs(suite)[::max(1, every)]
    except (KeyError, FileNotFoundError) as exc:
        raise ReflectionRoundError(str(exc).strip('"')) from None
    if limit is not None:
        refs = refs[:limit]
    if not refs:
        raise ReflectionRoundError(f"suite {suite!r} selects no scenarios")
    return [load_entry(source, loader) for _name, source, loader in refs]


def evaluation_parts(eval_set: str | None, eval_suite: str | None, every: int,
                     limit: int | None) -> tuple[EvalPart, ...]:
    from luna_bridge.evaluate import EVALUATION_SETS

    if eval_set:
        return tuple(EvalPart(s, e, n, limit) for s, e, n in EVALUATION_SETS[eval_set])
    return (EvalPart(eval_suite, every, None, limit),) if eval_suite else ()


def register(subparsers: argparse._SubParsersAction) -> None:
    from luna_bridge.evaluate import EVALUATION_SETS, MODES

    p = subparsers.add_parser("reflect", help="reflection rounds: deploy, reflect on failures in hindsight, evaluate",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, help="the reflection split: a suite name or a folder of scenario files "
                                                  "(generate-suite --splits reflect writes <out>/reflect)")
    p.add_argument("--limit", type=int, default=None, help="first N scenarios of the reflection split")
    p.add_argument("--every", type=int, default=1, help="every N-th scenario of the sorted reflection split")
    p.add_argument("--rounds", type=int, default=2, help="reflection rounds after round 0 (default 2)")
    p.add_argument("--out", type=Path, required=True, help="output folder (a rerun resumes it)")
    ev = p.add_mutually_exclusive_group()
    ev.add_argument("--eval-set", choices=sorted(EVALUATION_SETS), default=None,
                    help="the evaluation set of every round (standard: the results tables' set)")
    ev.add_argument("--eval-suite", default=None, help="or one suite (name or folder) to evaluate on")
    p.add_argument("--eval-every", type=int, default=1, help="with --eval-suite: every N-th scenario")
    p.add_argument("--eval-limit", type=int, default=None,
                   help="first N scenarios of each evaluated suite (smoke runs)")
    p.add_argument("--mode", choices=sorted(MODES), default="both", help="evaluation mode(s)")
    p.add_argument("--workers", type=int, default=1, help="worker processes of the deployment and the evaluation")
    p.add_argument("--reactive", action="store_true", help="deploy with IDM agents instead of log replay")
    stack = p.add_argument_group("the stack (as luna-bridge eval's luna planner)")
    add_stack_arguments(stack, memory_bank_help="source memory bank, copied")
    stack.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="torch device of the student and the denoiser (default cpu)")
    stack.add_argument("--replan-every", type=int, default=5, help="simulation steps between planner calls")
    stack.add_argument("--explanation-tokens", type=int, default=0,
                       help="tokens per explanation (default: the student's budget, 96 on the CPU)")
    llm = p.add_argument_group("reflection LLM (optional: without it the hindsight check writes the revision)")
    llm.add_argument("--endpoint", default="", help="OpenAI-compatible base URL (default: $LUNA_REFLECTION_ENDPOINT)")
    llm.add_argument("--model", default="", help="model name at the endpoint (default: $LUNA_REFLECTION_MODEL)")
    llm.add_argument("--api-key-env", default="", help="NAME of the environment variable holding the API key")
    llm.add_argument("--timeout", type=float, default=60.0, help="s per reflection request")
    llm.add_argument("--reflection-tokens", type=int, default=512)
    llm.add_argument("--endpoint-wait", type=float, default=60.0,
                     help="s to keep retrying an unreachable endpoint; what is left stays in the round's outbox")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 beside other jobs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    import torch

    from luna_bridge.evaluate import MODES

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, args.threads))
    command = "luna-bridge " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        try:
            stack = stack_settings_from_args(args, device=args.device)
        except StackConfigError as exc:
            raise ReflectionRoundError(str(exc)) from None
        config = RoundConfig(
            out_dir=args.out, rounds=args.rounds, stack=stack,
            evaluation=evaluation_parts(args.eval_set, args.eval_suite, args.eval_every, args.eval_limit),
            eval_modes=MODES[args.mode], eval_workers=args.workers, deploy_workers=args.workers,
            explanation_max_tokens=args.explanation_tokens,
            endpoint=args.endpoint or os.environ.get("LUNA_REFLECTION_ENDPOINT", ""),
            model=args.model or os.environ.get("LUNA_REFLECTION_MODEL", ""), api_key_env=args.api_key_env,
            timeout=args.timeout, reflection_max_tokens=args.reflection_tokens, endpoint_wait=args.endpoint_wait,
            reactive=args.reactive, replan_every=args.replan_every)
        deploy_set = load_scenarios(args.suite, args.limit, args.every)
        run_rounds(deploy_set, config, command)
    except ReflectionRoundError as exc:
        print(f"luna-bridge reflect: {exc}", file=sys.stderr)
        return 2
    print((args.out / "rounds.md").read_text(encoding="utf-8"))
    return 0
