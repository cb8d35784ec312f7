"""``luna-bridge reflect``: a reflection round (LUNA-AD Sec. III-E, Sec. IV-D) in process.

The round, like the paper's:

1. **Deploy**: the stack (the student deciding every T_d through ``HeuristicSystem`` with K retrieved
   memory items, the decision-guided planner ``luna``) drives a set of scenarios in the closed-loop
   simulator.
2. **Detect**: each run is replayed through the progress monitor exactly as the ``progress_monitor``
   node sees it (odometry and object frames at 10 Hz, the scene descriptor's light phase, the issued
   decisions; a check every T_d; SAT collisions, Eq. 23 stalls; the failure gate's cooldown).
3. **Explain**: the student explains the decision executed when each failure happened (Eq. 25-28),
   with the context that decision was made with.
4. **Reflect**: every (failure, explanation) goes through the durable outbox to the reflection LLM
   (the in-process default model, or an OpenAI-compatible endpoint); valid revised answers become
   reflection memory items in a COPY of the memory bank (``<out>/memory_bank``); the source bank is
   never written.
5. **Evaluate**: the same stack with the updated bank drives the evaluation set (the deployment set by
   default); the nuPlan closed-loop metrics before and after are tabulated.

Outputs in ``<out>``: ``memory_bank/`` (the updated copy), ``outbox/`` (the reflection journal),
``reflections.jsonl`` (every failure with its explanation and outcome), ``per_scenario.csv``,
``summary.json``, ``summary.md`` and ``before_after.png``.

By default the planner searches under a wall-clock budget, so two runs of one scenario differ slightly
even with the same bank; ``--planner-option deterministic=true`` (full search, no budget) makes the
before/after comparison depend on the memory bank only.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from luna_core.failure_gate import FailureGate
from luna_core.monitor import MonitorParameters, ProgressMonitor
from luna_core.reflection import Outbox, ReflectionConfig, ReflectionRequest, ReflectionSystem
from luna_core.scene import SceneInputError, build_scene
from luna_core.types import (DecisionDistribution, DecisionExplanation, FailureEvent, PlannerInput, ReflectionResult,
                             TrafficLightPhase)

from luna_bridge.metrics import aggregate, score_log
from luna_bridge.scenario import SIM_DT, Scenario, SimulationLog

log = logging.getLogger(__name__)

BANK_DIR, OUTBOX_DIR = "memory_bank", "outbox"


class ReflectionRoundError(RuntimeError):
    """The round cannot run (missing student or bank, an output folder from an earlier round, ...)."""


@dataclass(frozen=True)
class RoundConfig:
    out_dir: Path
    student: str = ""  # student folder; "" = the bundled default (models/student)
    memory_bank: str = ""  # source bank, copied to <out>/memory_bank; "" = the bundled default
    device: str | None = None  # torch device; None = CUDA when present
    k: int = 3  # retrieved items per decision
    gamma_p: float = 0.1
    explanation_max_tokens: int = 200
    # Reflection LLM: "" = the in-process model; else an OpenAI-compatible base URL.
    endpoint: str = ""
    model: str = "smollm2-135m-instruct"
    api_key_env: str = ""  # NAME of the environment variable with the key (never the key)
    timeout: float = 60.0  # s per reflection request
    reflection_max_tokens: int = 512
    endpoint_wait: float = 0.0  # s to keep retrying an unreachable endpoint before evaluating anyway
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    # Closed loop.
    reactive: bool = False
    planner: str = "luna"
    planner_options: dict[str, Any] = field(default_factory=dict)
    replan_every: int = 5  # simulation steps (0.1 s) between planner calls
    decision_every: int = 20  # steps between decisions: T_d = decision_every * 0.1 s = 2.0 s
    # Progress monitor (node defaults).
    stall_window_cycles: int = 3
    stall_speed_threshold: float = 0.5
    failure_cooldown: float = 5.0

    @property
    def decision_period(self) -> float:
        return self.decision_every * SIM_DT

    def monitor_parameters(self) -> MonitorParameters:
        return MonitorParameters(decision_period=self.decision_period, stall_window_cycles=self.stall_window_cycles,
                                 stall_speed_threshold=self.stall_speed_threshold)


# --------------------------------------------------------------------------------------------------
# The stack in process
# --------------------------------------------------------------------------------------------------


class SceneDecisionSource:
    """The simulator's decision source: xi_t from the planner input (as ``scene_descriptor`` builds it),
    then ``HeuristicSystem.decide``. Records every decision and the light phase of every scene, which
    the progress monitor needs afterwards."""

    def __init__(self, heuristic: Any) -> None:
        self.heuristic = heuristic
        self.decisions: list[DecisionDistribution] = []
        self.lights: list[tuple[float, TrafficLightPhase]] = []
        self.scene_errors: list[str] = []

    def reset(self) -> None:
        """A new scenario: forget the records, the recent actions of the prompt and the retrieved items
        the heuristic system would keep (its retrieval margin), so a run does not depend on the last."""
        self.decisions.clear()
        self.lights.clear()
        self.scene_errors.clear()
        self.heuristic.reset()

    def decide(self, planner_input: PlannerInput) -> DecisionDistribution | None:
        recent = [d.top_action for d in self.decisions[-2:]]
        try:
            scene = build_scene(planner_input.ego, planner_input.objects, planner_input.traffic_lights,
                                planner_input.route, planner_input.lane_graph, recent, planner_input.vehicle)
        except SceneInputError as exc:  # no decision this cycle: the planner runs its fallback objective
            self.scene_errors.append(f"t={planner_input.time:.1f}s: {exc}")
            return None
        self.lights.append((scene.stamp, scene.traffic_light))
        decision = self.decision_for(scene, planner_input)
        if decision is not None:
            self.decisions.append(decision)
        return decision

    def decision_for(self, scene: Any, planner_input: PlannerInput) -> DecisionDistribution | None:
        """The decision for ``scene`` (the student's; the oracle source also reads the planner input)."""
        return self.heuristic.decide(scene)


def detect_failures(sim_log: SimulationLog, decisions: Sequence[DecisionDistribution],
                    lights: Sequence[tuple[float, TrafficLightPhase]], params: MonitorParameters,
                    cooldown: float) -> list[FailureEvent]:
    """The failures the ``progress_monitor`` node would publish for this run: every input fed by stamp,
    ``check`` every T_d from the first full period on, debounced by the failure gate."""
    monitor = ProgressMonitor(params)
    gate = FailureGate(cooldown)
    for stamp, phase in lights:
        monitor.update_light(stamp, phase)
    for d in decisions:
        monitor.on_decision(d)
    every = max(1, int(round(params.decision_period / SIM_DT)))
    failures = []
    for k, (t, ego, objects) in enumerate(zip(sim_log.t, sim_log.ego, sim_log.objects)):
        monitor.update_ego(ego)
        monitor.update_objects(objects)
        if k == 0 or k % every:
            continue
        event = monitor.check(float(t))
        admitted = gate.admit(event) if event is not None else None
        if admitted is not None:
            failures.append(admitted)
    return failures


def executed_decision(decisions: Sequence[DecisionDistribution], failure: FailureEvent) -> DecisionDistribution | None:
    """The decision the failure names (by its stamp), or None if the failure had no decision in force."""
    if not failure.issued_decision:
        return None
    return next((d for d in decisions if abs(d.stamp - failure.decision_stamp) < 1e-6), None)


@dataclass
class RunRecord:
    """One closed-loop run of the stack and what the monitor found in it."""

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
    unexplained: int = 0  # failures with no decision in force (nothing to explain)

    @property
    def collisions(self) -> int:
        return sum(1 for f in self.failures if f.collision)

    @property
    def stalls(self) -> int:
        return sum(1 for f in self.failures if f.stall)


def run_stack(scenario: Scenario, planner: Any, heuristic: Any, config: RoundConfig,
              explain: bool) -> RunRecord:
    """Drive ``scenario`` with the stack, score it, detect failures and (``explain``) explain them."""
    from luna_bridge.sim import SimulationConfig, simulate

    started = time.perf_counter()
    source = SceneDecisionSource(heuristic)
    sim_log = simulate(scenario, planner, reactive=config.reactive, decision_source=source,
                       config=SimulationConfig(replan_every=config.replan_every,
                                               decision_every=config.decision_every))
    score = score_log(sim_log)
    failures = detect_failures(sim_log, source.decisions, source.lights, config.monitor_parameters(),
                               config.failure_cooldown)
    record = RunRecord(scenario.name, scenario.scenario_type, score.score, score.error, failures,
                       len(source.decisions), len(source.scene_errors), sim_log.planner_failures, 0.0,
                       _reflection_retrievals(source.decisions, heuristic.bank))
    if explain:
        for failure in failures:
            decision = executed_decision(source.decisions, failure)
            if decision is None:
                record.unexplained += 1
                continue
            record.explanations.append(heuristic.explain(decision, failure))
    record.wall_time = time.perf_counter() - started
    return record


def _reflection_retrievals(decisions: Sequence[DecisionDistribution], bank: Any) -> int:
    if bank is None:
        return 0
    return sum(1 for d in decisions
               if any(i in bank and bank.get(i).source == "reflection" for i in d.retrieved_ids))


def run_phase(name: str, scenarios: Sequence[Scenario], planner: Any, heuristic: Any, config: RoundConfig,
              explain: bool) -> list[RunRecord]:
    records = []
    bar = tqdm(scenarios, desc=name, unit="scn")
    for scenario in bar:
        bar.set_postfix_str(scenario.name[:40])
        records.append(run_stack(scenario, planner, heuristic, config, explain))
        bar.set_postfix(failures=sum(len(r.failures) for r in records))
    return records


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


def make_reflection_llm(config: RoundConfig) -> Any:
    if config.endpoint:
        from luna_core.llm import EndpointConfig, OpenAIChatModel
        return OpenAIChatModel(EndpointConfig(model=config.model, base_url=config.endpoint,
                                              api_key_env=config.api_key_env or None, timeout=config.timeout,
                                              max_retries=0))  # the outbox retries, with backoff
    from luna_core.llm import TransformersChatModel
    return TransformersChatModel(config.model, device=config.device, num_threads=None)


# --------------------------------------------------------------------------------------------------
# The round
# --------------------------------------------------------------------------------------------------


@dataclass
class RoundReport:
    deployed: list[RunRecord]
    before: list[RunRecord]  # the evaluation set with the bank as it was (the deployment runs if same set)
    after: list[RunRecord]
    reflections: list[ReflectionOutcome]
    bank_path: Path
    bank_version_before: int
    bank_version_after: int
    wall_time: float = 0.0
    planner_deterministic: bool = False  # no wall-clock budget: before/after differ only by the bank

    @property
    def counts(self) -> dict[str, int]:
        answered = [o.result for o in self.reflections if o.result is not None]
        return {
            "scenarios_deployed": len(self.deployed),
            "failures": sum(len(r.failures) for r in self.deployed),
            "collisions": sum(r.collisions for r in self.deployed),
            "stalls": sum(r.stalls for r in self.deployed),
            "explanations": sum(len(r.explanations) for r in self.deployed),
            "unexplained_failures": sum(r.unexplained for r in self.deployed),
            "reflection_requests": len(self.reflections),
            "reflections": len(answered),
            "normal_answers": sum(1 for r in answered if r.normal and not r.error),
            "rejected_answers": sum(1 for r in answered if r.error),
            "new_memory_items": sum(1 for r in answered if r.memory_item_id),
            "pending_in_outbox": sum(1 for o in self.reflections if o.result is None),
            "scenarios_evaluated": len(self.after),
            "failures_before": sum(len(r.failures) for r in self.before),
            "failures_after": sum(len(r.failures) for r in self.after),
            "decisions_after": sum(r.decisions for r in self.after),
            "decisions_after_using_reflections": sum(r.reflection_retrievals for r in self.after),
        }


def copy_bank(source: Path, target: Path) -> None:
    """Copy the source bank for this round (the writer lock and cached indexes stay behind)."""
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


def load_heuristic(config: RoundConfig, bank: Any) -> Any:
    from luna_core.assets import resolve
    from luna_core.heuristic import HeuristicConfig, HeuristicSystem
    from luna_core.prompts import PromptManager
    from luna_core.student import DualHeadStudent

    try:
        folder = resolve(config.student, "student")
    except FileNotFoundError as exc:
        raise ReflectionRoundError(f"{exc} (give --student)") from None
    student = DualHeadStudent.from_pretrained(folder, device=config.device)
    return HeuristicSystem(student, PromptManager(), bank,
                           HeuristicConfig(k=config.k, gamma_p=config.gamma_p,
                                           explanation_max_tokens=config.explanation_max_tokens))


def _same_set(a: Sequence[Scenario], b: Sequence[Scenario]) -> bool:
    return [s.name for s in a] == [s.name for s in b]


def run_round(deploy: Sequence[Scenario], evaluate: Sequence[Scenario] | None, config: RoundConfig) -> RoundReport:
    """Deploy, detect, explain, reflect into a copy of the bank, evaluate (see the module docstring)."""
    from luna_core.assets import resolve
    from luna_core.memory.bank import MemoryBank
    from luna_core.llm import LLMConfigError
    from luna_core.planning.factory import PlannerConfigError, make_planner
    from luna_core.prompts import PromptManager

    started = time.perf_counter()
    if not deploy:
        raise ReflectionRoundError("no deployment scenarios")
    evaluate = list(evaluate) if evaluate else list(deploy)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        source_bank = resolve(config.memory_bank, "memory_bank")
    except FileNotFoundError as exc:
        raise ReflectionRoundError(f"{exc} (give --memory-bank)") from None
    bank_path = out / BANK_DIR
    _check_bank_copy(source_bank, bank_path)
    try:  # configuration errors surface before any simulation runs
        planner = make_planner(config.planner, config.planner_options)
        reflection_llm = make_reflection_llm(config)
    except (PlannerConfigError, LLMConfigError) as exc:
        raise ReflectionRoundError(str(exc)) from None
    copy_bank(source_bank, bank_path)
    bank = MemoryBank.open(bank_path, writable=True)
    outbox = Outbox(out / OUTBOX_DIR)
    try:
        version_before = int(bank.version)
        heuristic = load_heuristic(config, bank)

        deployed = run_phase("deploy", deploy, planner, heuristic, config, explain=True)
        before = deployed if _same_set(deploy, evaluate) else \
            run_phase("evaluate (before)", evaluate, planner, heuristic, config, explain=False)

        requests = []
        for record in deployed:
            for explanation in record.explanations:
                failure = next(f for f in record.failures if f.stamp == explanation.failure_stamp)
                request = ReflectionRequest.from_events(explanation, failure)
                outbox.put(request)
                requests.append(request)
        results: dict[str, ReflectionResult] = {}
        if requests:
            system = ReflectionSystem(reflection_llm, PromptManager(), bank,
                                      ReflectionConfig(max_tokens=config.reflection_max_tokens))
            results = reflect_all(system, outbox, config)
        outcomes = [ReflectionOutcome(r, results.get(r.id)) for r in requests]

        after = run_phase("evaluate (after)", evaluate, planner, heuristic, config, explain=False)
        report = RoundReport(deployed, before, after, outcomes, bank_path, version_before, int(bank.version),
                             planner_deterministic=bool(config.planner_options.get("deterministic", False)))
    finally:
        outbox.close()
        bank.close()
    report.wall_time = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def _cls(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100.0 * value:.1f}"


def summary_markdown(report: RoundReport, command: str = "") -> str:
    c = report.counts
    lines = ["# Reflection round", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["| count | value |", "|---|---:|"]
    lines += [f"| {k.replace('_', ' ')} | {v} |" for k, v in c.items()]
    lines += [f"| memory bank version | {report.bank_version_before} -> {report.bank_version_after} |", ""]
    before = {r.scenario: r for r in report.before}
    lines += ["| scenario | type | CLS before | CLS after | failures before | failures after |",
              "|---|---|---:|---:|---:|---:|"]
    for r in report.after:
        b = before.get(r.scenario)
        lines.append(f"| {r.scenario} | {r.scenario_type} | {_cls(b.score) if b else '-'} | {_cls(r.score)} | "
                     f"{len(b.failures) if b else '-'} | {len(r.failures)} |")
    agg_b = aggregate(r.score for r in report.before)
    agg_a = aggregate(r.score for r in report.after)
    lines += ["", "| evaluation set | scenarios | CLS (0-100) | success rate (%) | failures |",
              "|---|---:|---:|---:|---:|",
              f"| before reflection | {agg_b.count} | {agg_b.cls:.1f} | {agg_b.success_rate:.1f} | "
              f"{c['failures_before']} |",
              f"| after reflection | {agg_a.count} | {agg_a.cls:.1f} | {agg_a.success_rate:.1f} | "
              f"{c['failures_after']} |", "",
              f"Updated memory bank: `{report.bank_path}`. Wall time {report.wall_time:.0f} s. "
              + ("The planner ran in deterministic mode (no wall-clock budget): the runs before and after "
                 "differ only by the memory bank." if report.planner_deterministic else
                 "The planner searched under a wall-clock budget: part of any before/after difference is "
                 "run-to-run noise (`--planner-option deterministic=true` removes it).")]
    return "\n".join(lines) + "\n"


def _failure_json(f: FailureEvent) -> dict[str, Any]:
    return {"stamp": f.stamp, "issued_decision": f.issued_decision, "decision_stamp": f.decision_stamp,
            "colliding_ids": list(f.colliding_ids), "stall": f.stall}


def write_outputs(report: RoundReport, out: Path, command: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "reflections.jsonl").open("w", encoding="utf-8") as f:
        for o in report.reflections:
            rec = {"request": asdict(o.request),
                   "result": None if o.result is None else {
                       "normal": o.result.normal, "revised_answer": o.result.revised_answer,
                       "memory_item_id": o.result.memory_item_id, "error": o.result.error}}
            f.write(json.dumps(rec) + "\n")
    with (out / "per_scenario.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["phase", "scenario", "type", "cls", "collisions", "stalls", "decisions",
                    "decisions_using_reflections", "scene_errors", "planner_failures", "explanations", "wall_time_s",
                    "error"])
        for phase, records in (("deploy", report.deployed), ("after", report.after)) + \
                (() if report.before is report.deployed else (("before", report.before),)):
            for r in records:
                w.writerow([phase, r.scenario, r.scenario_type, f"{r.score:.4f}", r.collisions, r.stalls,
                            r.decisions, r.reflection_retrievals, r.scene_errors, r.planner_failures,
                            len(r.explanations), f"{r.wall_time:.1f}", r.score_error])
    summary = {"command": command, "counts": report.counts, "bank": str(report.bank_path),
               "bank_version_before": report.bank_version_before, "bank_version_after": report.bank_version_after,
               "before": asdict(aggregate(r.score for r in report.before)),
               "after": asdict(aggregate(r.score for r in report.after)), "wall_time": report.wall_time,
               "failures": {r.scenario: [_failure_json(f) for f in r.failures] for r in report.deployed}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(report, command), encoding="utf-8")
    plot_before_after(report, out / "before_after.png")


def plot_before_after(report: RoundReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    before = {r.scenario: r.score for r in report.before}
    names = [r.scenario for r in report.after]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names) + 2.0), 3.5))
    ax.bar(x - 0.2, [100.0 * before.get(n, math.nan) for n in names], 0.4, label="before reflection")
    ax.bar(x + 0.2, [100.0 * r.score for r in report.after], 0.4, label="after reflection")
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("CLS (0-100)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    ax.set_title("Reflection round: closed-loop score per scenario")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("reflect", help="a reflection round: deploy, reflect on failures, re-evaluate",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, help="deployment scenarios: a suite name or a folder of scenario files")
    p.add_argument("--eval-suite", default=None, help="evaluation scenarios (default: the deployment set)")
    p.add_argument("--limit", type=int, default=None, help="first N scenarios of each set")
    p.add_argument("--every", type=int, default=1, help="every N-th scenario of each sorted set")
    p.add_argument("--out", type=Path, required=True, help="output folder (must not hold an earlier round)")
    p.add_argument("--student", default="", help="student folder (default: the bundled models/student)")
    p.add_argument("--memory-bank", default="", help="source memory bank, copied (default: models/memory_bank)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--k", type=int, default=3, help="retrieved memory items per decision (K)")
    p.add_argument("--explanation-tokens", type=int, default=200)
    p.add_argument("--endpoint", default="",
                   help="OpenAI-compatible base URL of the reflection LLM (default: $LUNA_REFLECTION_ENDPOINT, "
                        "else the in-process model)")
    p.add_argument("--model", default="", help="reflection model name (default: $LUNA_REFLECTION_MODEL, "
                                                "else smollm2-135m-instruct)")
    p.add_argument("--api-key-env", default="", help="NAME of the environment variable holding the API key")
    p.add_argument("--timeout", type=float, default=60.0, help="s per reflection request")
    p.add_argument("--reflection-tokens", type=int, default=512)
    p.add_argument("--endpoint-wait", type=float, default=60.0,
                   help="s to keep retrying an unreachable endpoint; what is left stays in <out>/outbox")
    p.add_argument("--reactive", action="store_true", help="IDM agents instead of log replay")
    p.add_argument("--planner-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option of the luna planner (e.g. time_budget=0.4, population=64); repeatable")
    p.add_argument("--replan-every", type=int, default=5, help="simulation steps between planner calls")
    p.add_argument("--decision-every", type=int, default=20, help="simulation steps between decisions (T_d/0.1 s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 beside other jobs)")
    p.set_defaults(func=run)


def _planner_options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ReflectionRoundError(f"--planner-option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    import os

    import torch

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(max(1, args.threads))
    command = "luna-bridge " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        config = RoundConfig(
            out_dir=args.out, student=args.student, memory_bank=args.memory_bank, device=args.device, k=args.k,
            explanation_max_tokens=args.explanation_tokens,
            endpoint=args.endpoint or os.environ.get("LUNA_REFLECTION_ENDPOINT", ""),
            model=args.model or os.environ.get("LUNA_REFLECTION_MODEL", "") or "smollm2-135m-instruct",
            api_key_env=args.api_key_env, timeout=args.timeout, reflection_max_tokens=args.reflection_tokens,
            endpoint_wait=args.endpoint_wait, reactive=args.reactive,
            planner_options=_planner_options(args.planner_option), replan_every=args.replan_every,
            decision_every=args.decision_every)
        deploy = load_scenarios(args.suite, args.limit, args.every)
        evaluate = load_scenarios(args.eval_suite, args.limit, args.every) if args.eval_suite else None
        report = run_round(deploy, evaluate, config)
    except ReflectionRoundError as exc:
        print(f"luna-bridge reflect: {exc}", file=sys.stderr)
        return 2
    write_outputs(report, args.out, command)
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    return 0
