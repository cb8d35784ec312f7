"""Batch closed-loop evaluation: planners x modes x scenarios in worker processes or on Ray (a local
instance or a cluster, ``executor="ray"``), nuPlan metrics, results files and the Table-III-layout
summary.

Output directory layout::

    scenarios/<planner>/<mode>/<scenario>.json  one result per run (CLS, every metric with its
                                                statistics and per-step time series, planner cycles
                                                by mode, decisions), written atomically; a rerun
                                                skips the ones present (resume)
    timings/<planner>/<mode>/<scenario>.json    wall and CPU seconds of that run (not a metric file)
    per_scenario.csv    one row per run: status, CLS, every metric's score, the collisions (every
                        contact, as the progress monitor reports them) and the at-fault ones
    per_metric.csv      per planner x mode x metric: mean score over the scenarios
    summary.csv / summary.md   Table III layout: planners (the expert log replay first) x
                        NR-CLS, NR-SR, R-CLS, R-SR; the Markdown adds the failures, wall time and
                        peak memory of the run
    run.json            wall time, peak memory, counts, failed scenarios (not a metric file)
    renders/<planner>/<mode>/<scenario>.png|.gif   with ``render=True``

Everything except ``summary.md``, ``run.json`` and ``timings/`` is a function of the scenarios and
planners only: the same command writes byte-identical metric files. A scenario that fails to load or
whose run crashes is never dropped: it scores 0 and is listed with its error.

Planners are named as registered, optionally with their own replanning rate: ``pdm@10hz`` is ``pdm``
called every simulation step whatever ``--replan-every`` says (a second row beside ``pdm`` replanning
with the stack). The expert log replay always runs at nuPlan's 10 Hz. Named evaluation sets
(``EVALUATION_SETS``, ``luna-bridge eval --set standard``) fix the scenarios every table uses.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import multiprocessing as mp
import os
import re
import resource
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from tqdm import tqdm

from luna_bridge.baselines import EXPERT, eval_planner_names, make_eval_planner
from luna_bridge.metrics import METRIC_NAMES, ScenarioScore, aggregate, score_log
from luna_bridge.scenario import SIM_DT, Scenario
from luna_bridge.stack_planner import SEARCH_PLANNERS, STACK_PLANNERS, StackSettings, use_settings
from luna_core.types import ACTION_CODES, DecisionDistribution


MODES = {"non-reactive": (False,), "reactive": (True,), "both": (False, True)}
STATUS_OK, STATUS_LOAD_ERROR, STATUS_CRASHED = "ok", "load_error", "crashed"
# Where the runs execute: worker processes on this machine, or Ray tasks (a local instance or a cluster).
EXECUTORS = ("process", "ray")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # one thread per worker

#: Named evaluation sets: (suite, every N-th scenario of the sorted suite, scenarios the suite must have).
#: ``standard`` is the one protocol of the results tables (2 per scenario type of each synthetic split
#: and every CommonRoad file); ``full`` is every scenario.
EVALUATION_SETS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "standard": (("synthetic-hard", 5, 140), ("synthetic-random", 5, 140), ("commonroad", 1, 27)),
    "full": (("synthetic-hard", 1, 140), ("synthetic-random", 1, 140), ("commonroad", 1, 27)),
}


class EvaluationError(RuntimeError):
    """The evaluation cannot start (unknown suite or planner, wrong scenario count, ...)."""


def mode_name(reactive: bool) -> str:
    return "reactive" if reactive else "non_reactive"


def planner_spec(spec: str) -> tuple[str, int | None]:
    """(registered name, simulation steps between its calls, or None for the evaluation's own) of a
    planner as named on the command line: ``pdm`` or ``pdm@10hz``."""
    name, sep, rate = spec.partition("@")
    if not sep:
        return spec, None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)hz", rate.lower())
    hz = float(m.group(1)) if m else 0.0
    steps = round(1.0 / (hz * SIM_DT)) if hz > 0 else 0
    if steps < 1 or abs(steps * SIM_DT * hz - 1.0) > 1e-9:
        raise EvaluationError(f"planner {spec!r}: the rate after '@' must be like 10hz or 2hz and divide "
                              f"nuPlan's 10 Hz simulation step")
    return name, steps


# --------------------------------------------------------------------------------------------------
# Scenario sources
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioRef:
    """A scenario to load inside a worker: ``loader`` (``"module:function"``) applied to ``source``."""

    name: str
    source: str  # a file path, or whatever the loader takes
    loader: str


def resolve_suite(suite: str) -> list[ScenarioRef]:
    """Scenario refs of a named suite or a directory of scenario files
    (``luna_bridge.scenarios.suite_refs``), sorted by name."""
    from luna_bridge.scenarios import suite_refs

    try:
        refs = [ScenarioRef(*r) for r in suite_refs(suite)]
    except (KeyError, FileNotFoundError) as exc:
        raise EvaluationError(str(exc).strip('"')) from None
    names = [r.name for r in refs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise EvaluationError(f"suite {suite!r}: duplicate scenario names {dup[:5]}")
    return refs


# --------------------------------------------------------------------------------------------------
# One run (executed in a worker)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    ref: ScenarioRef
    planner: str
    reactive: bool
    out_dir: str
    render: bool = False
    replan_every: int = 1
    stack: StackSettings | None = None  # settings of the stack / Diffusion-ES planners (None for the others)

    @property
    def result_path(self) -> Path:
        return Path(self.out_dir) / "scenarios" / self.planner / mode_name(self.reactive) / f"{self.ref.name}.json"

    @property
    def timing_path(self) -> Path:
        return Path(self.out_dir) / "timings" / self.planner / mode_name(self.reactive) / f"{self.ref.name}.json"


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write via a temporary file and rename, so a killed run never leaves a half-written result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(text, bytes):
        tmp.write_bytes(text)
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"


def closed_loop_run(scenario: Scenario, planner: str, reactive: bool, replan_every: int,
                    stack: StackSettings | None, observe: Callable[[Any, Any], None] | None = None
                    ) -> tuple[Any, Any]:
    """One closed-loop run of the eval planner ``planner`` (a name of ``make_eval_planner``): the simulation
    log and the planner's decision source (None for planners without one). A stack planner decides every
    T_d = ``stack.decision_every`` steps, as in evaluation (``luna-offline frames --on-policy`` uses this too,
    so its states are the evaluated stack's). ``observe(planner_input, planner)``, if given, is called after
    every planner call (the traces in benchmarks/ read the planner's last cycle there)."""
    from luna_bridge.sim import SimulationConfig, simulate

    instance = make_eval_planner(planner, scenario)
    if observe is not None:
        plan = instance.plan

        def observed(planner_input):
            trajectory = plan(planner_input)
            observe(planner_input, instance)
            return trajectory
        instance.plan = observed
    source = getattr(instance, "decision_source", None)  # the stack decides every T_d
    decision_every = stack.decision_every if stack is not None else 5
    log = simulate(scenario, instance, reactive=reactive, decision_source=source,
                   config=SimulationConfig(replan_every=replan_every, decision_every=decision_every))
    return log, source


def run_job(job: Job) -> dict[str, Any]:
    """Load, simulate, score (and render) one run; always writes a result, whatever fails."""
    from luna_bridge.scenarios.registry import load_entry

    started, cpu_started = time.perf_counter(), time.process_time()
    head = {"scenario": job.ref.name, "source": job.ref.source, "planner": job.planner,
            "mode": mode_name(job.reactive), "replan_every": job.replan_every}
    if job.stack is not None:
        head["stack"] = asdict(job.stack)
        use_settings(job.stack)
    try:
        scenario: Scenario = load_entry(job.ref.source, job.ref.loader)
    except Exception as exc:  # noqa: BLE001 - a bad file must not stop the run; it is reported
        result = {**head, "status": STATUS_LOAD_ERROR, "score": 0.0, "scenario_type": "",
                  "error": f"{type(exc).__name__}: {exc}", "metrics": {}}
    else:
        try:
            sim_log, source = closed_loop_run(scenario, planner_spec(job.planner)[0], job.reactive, job.replan_every,
                                              job.stack)
            score: ScenarioScore = score_log(sim_log)
            result = {**head, **score.to_json(), "status": STATUS_OK if not score.error else STATUS_CRASHED,
                      "planner_failures": sim_log.planner_failures, "steps": len(sim_log.ego)}
            if sim_log.plan_info:
                result["planner_cycles"] = sim_log.cycle_statistics()
            if source is not None:
                result["decisions"] = decision_statistics(source)
            result["planner"], result["mode"] = job.planner, mode_name(job.reactive)
            if job.render:
                from luna_bridge.render import render_gif, render_png

                base = Path(job.out_dir) / "renders" / job.planner / mode_name(job.reactive)
                base.mkdir(parents=True, exist_ok=True)
                title = f"{job.planner} {mode_name(job.reactive)} {scenario.name} CLS {score.score:.2f}"
                render_png(sim_log, base / f"{job.ref.name}.png", title, score=score)
                render_gif(sim_log, base / f"{job.ref.name}.gif", title, score=score)
        except Exception as exc:  # noqa: BLE001 - a crash is a zero score with its reason
            result = {**head, "status": STATUS_CRASHED, "score": 0.0, "scenario_type": scenario.scenario_type,
                      "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5),
                      "metrics": {}}
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    simulated = float(result.get("steps", 0)) * SIM_DT
    write_atomic(job.timing_path, _dumps({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                                          "simulated_s": round(simulated, 3)}))
    write_atomic(job.result_path, _dumps(result))
    return {"scenario": job.ref.name, "planner": job.planner, "mode": result["mode"], "status": result["status"],
            "wall_time": wall, "cpu_time": cpu}


def reflection_items_used(decision: DecisionDistribution, bank: Any) -> list[str]:
    """The ids of the reflection items (written by reflection, LUNA-AD Eq. 29) among those the
    decision's prompt used, in retrieval order."""
    if bank is None:
        return []
    return [i for i in decision.retrieved_ids if i in bank and bank.get(i).source == "reflection"]


def _top3(probabilities: Any) -> list[list[Any]]:
    return [[code, round(float(p), 3)] for code, p in
            sorted(zip(ACTION_CODES, probabilities), key=lambda cp: -cp[1])[:3]]


def decision_statistics(source: Any) -> dict[str, Any]:
    """What the stack decided in one run: count, top actions, the three most probable actions of every
    decision by its scene stamp (near-ties show there), scenes that could not be described, how many
    decisions showed the student 0, 1, ... retrieved examples, the decisions that retrieved a reflection
    item and which items (per decision in the timeline, and per item the number of decisions), so that a
    moved score can be traced to the items behind it. No timings: result files stay reproducible."""
    decisions = source.decisions
    bank = getattr(source.heuristic, "bank", None)
    top: dict[str, int] = {}
    used_by_item: dict[str, int] = {}
    examples: dict[str, int] = {}
    timeline = []
    using = 0
    for d in decisions:
        top[d.top_action] = top.get(d.top_action, 0) + 1
        shown = str(len(d.retrieved_ids))
        examples[shown] = examples.get(shown, 0) + 1
        entry: dict[str, Any] = {"stamp": round(float(d.stamp), 3), "top3": _top3(d.probabilities)}
        used = reflection_items_used(d, bank)
        if used:
            using += 1
            entry["reflection_items"] = used
            similarity = dict(zip(d.retrieved_ids, d.retrieved_similarities))
            entry["reflection_similarity"] = [round(similarity[i], 4) for i in used if i in similarity]
            if d.student_probabilities is not None:  # the lessons changed the student's distribution
                entry["student_top3"] = _top3(d.student_probabilities)
            for item_id in used:
                used_by_item[item_id] = used_by_item.get(item_id, 0) + 1
        timeline.append(entry)
    return {"count": len(decisions), "top_actions": dict(sorted(top.items())), "timeline": timeline,
            "scene_errors": len(source.scene_errors), "examples_shown": dict(sorted(examples.items())),
            "using_reflection_items": using,
            "reflection_items": dict(sorted(used_by_item.items()))}


def _worker_init() -> None:
    try:
        import torch

        torch.set_num_threads(1)  # workers share 2 cores: one thread each
    except ImportError:
        pass


# --------------------------------------------------------------------------------------------------
# The evaluation
# --------------------------------------------------------------------------------------------------


@dataclass
class EvalConfig:
    suite: str
    planners: list[str]
    modes: tuple[bool, ...] = (False,)
    workers: int = 1
    out_dir: Path = Path("out/eval")
    render: bool = False
    expect_count: int | None = None  # refuse to run when the suite does not have this many scenarios
    limit: int | None = None  # first N scenarios only (smoke runs)
    every: int = 1  # every N-th scenario of the sorted suite (an even subset across scenario types)
    only: tuple[str, ...] = ()  # these scenarios of the suite by name (of the ``every`` subset); () = all
    replan_every: int = 1  # simulation steps between planner calls (nuPlan: 1, i.e. 10 Hz)
    stack: StackSettings = field(default_factory=StackSettings)  # for the stack / Diffusion-ES planners
    executor: str = "process"  # one of EXECUTORS: where the runs execute
    ray_address: str | None = None  # executor "ray": the cluster (None: a local instance of `workers` CPUs)

    def job_stack(self, planner: str) -> StackSettings | None:
        name = planner_spec(planner)[0]
        return self.stack.for_planner(name) if name in SEARCH_PLANNERS else None

    def job_replan_every(self, planner: str) -> int:
        """Simulation steps between the planner's calls: its own rate if named (``pdm@10hz``), every
        step for the expert log replay (nuPlan's protocol), else ``replan_every``."""
        name, own = planner_spec(planner)
        return 1 if name == EXPERT else own if own is not None else self.replan_every


@dataclass
class EvalSummary:
    out_dir: Path
    scenario_count: int
    runs: int
    skipped: int  # runs found finished (resume)
    failures: list[dict[str, str]] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)
    wall_time: float = 0.0
    peak_rss_main_mb: float = 0.0
    peak_rss_worker_mb: float = 0.0


def _planner_order(planners: Iterable[str]) -> list[str]:
    """The expert row first, then the planners as given, without repeats."""
    out = [EXPERT]
    for p in planners:
        if p not in out:
            out.append(p)
    return out


def _load_results(cfg: EvalConfig, refs: list[ScenarioRef], planners: list[str]) -> list[dict[str, Any]]:
    rows = []
    for planner in planners:
        for reactive in cfg.modes:
            for ref in refs:
                job = Job(ref, planner, reactive, str(cfg.out_dir))
                rows.append(json.loads(job.result_path.read_text(encoding="utf-8")))
    return rows


def _load_timings(cfg: EvalConfig, refs: list[ScenarioRef], planners: list[str]) -> dict[str, list[dict[str, float]]]:
    """planner -> the timing records of its runs (those that have one)."""
    out: dict[str, list[dict[str, float]]] = {}
    for planner in planners:
        for reactive in cfg.modes:
            for ref in refs:
                try:
                    out.setdefault(planner, []).append(json.loads(
                        Job(ref, planner, reactive, str(cfg.out_dir)).timing_path.read_text(encoding="utf-8")))
                except (OSError, ValueError):
                    continue
    return out


def _csv(rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _fmt(v: float) -> str:
    return "nan" if v != v else f"{v:.2f}"


def write_reports(cfg: EvalConfig, results: list[dict[str, Any]], planners: list[str]) -> list[dict[str, Any]]:
    """per_scenario.csv, per_metric.csv and summary.csv; returns the summary table rows."""
    out = cfg.out_dir
    # Every contact (what the progress monitor reports) beside the at-fault ones (what the score counts).
    header = ["planner", "mode", "scenario", "scenario_type", "status", "score", *METRIC_NAMES, "collisions",
              "at_fault_collisions", "error"]
    rows = [header]
    for r in results:
        m = r.get("metrics", {})
        counts = m.get("no_ego_at_fault_collisions", {}).get("statistics", {})
        rows.append([r["planner"], r["mode"], r["scenario"], r.get("scenario_type", ""), r["status"],
                     f"{r['score']:.6f}", *[f"{m[k]['score']:.6f}" if k in m else "" for k in METRIC_NAMES],
                     counts.get("number_of_collisions", ""), counts.get("number_of_at_fault_collisions", ""),
                     r.get("error", "")])
    write_atomic(out / "per_scenario.csv", _csv(rows))

    metric_rows = [["planner", "mode", "metric", "mean_score", "scored_runs"]]
    table = []
    for planner in planners:
        entry: dict[str, Any] = {"planner": planner}
        for reactive in (False, True):
            mode = mode_name(reactive)
            sel = [r for r in results if r["planner"] == planner and r["mode"] == mode]
            if reactive not in cfg.modes:
                continue
            agg = aggregate([r["score"] for r in sel])
            prefix = "R" if reactive else "NR"
            entry[f"{prefix}-CLS"], entry[f"{prefix}-SR"] = agg.cls, agg.success_rate
            entry[f"{prefix}-n"] = agg.count
            for metric in METRIC_NAMES:
                vals = [r["metrics"][metric]["score"] for r in sel if metric in r.get("metrics", {})]
                mean = sum(vals) / len(vals) if vals else float("nan")
                metric_rows.append([planner, mode, metric, _fmt(100 * mean) if vals else "nan", len(vals)])
        table.append(entry)
    write_atomic(out / "per_metric.csv", _csv(metric_rows))
    cols = ["NR-CLS", "NR-SR", "R-CLS", "R-SR"]
    summary = [["planner", *cols, "scenarios"]]
    for e in table:
        n = e.get("NR-n", e.get("R-n", 0))
        summary.append([e["planner"], *[_fmt(e[c]) if c in e else "" for c in cols], n])
    write_atomic(out / "summary.csv", _csv(summary))
    return table


def _markdown(cfg: EvalConfig, summary: EvalSummary, command: str,
              timings: dict[str, list[dict[str, float]]]) -> str:
    cols = ["NR-CLS", "NR-SR", "R-CLS", "R-SR"]
    lines = [f"# Closed-loop evaluation: {cfg.suite}", "", f"Command: `{command}`", "",
             f"Scenarios: {summary.scenario_count} (every {cfg.every}. of the suite); planners called every "
             f"{cfg.replan_every} simulation step(s) of 0.1 s unless their name says (name@10hz), the expert "
             f"every step; runs: {summary.runs} ({summary.skipped} resumed from disk).", "",
             "| planner | " + " | ".join(cols) + " | CPU s per run (median) | CPU / simulated time |",
             "|---|" + "---:|" * (len(cols) + 2)]
    for e in summary.table:
        runs = timings.get(e["planner"], [])
        cpu = sorted(r["cpu_s"] for r in runs)
        simulated = sum(r["simulated_s"] for r in runs)
        per_run = f"{cpu[len(cpu) // 2]:.1f}" if cpu else "-"
        ratio = f"{sum(cpu) / simulated:.2f}" if cpu and simulated > 0 else "-"
        lines.append(f"| {e['planner']} | " + " | ".join(_fmt(e[c]) if c in e else "-" for c in cols)
                     + f" | {per_run} | {ratio} |")
    if any(e["planner"] in SEARCH_PLANNERS for e in summary.table):
        decides = any(e["planner"] in STACK_PLANNERS for e in summary.table)
        lines += ["", f"{'Stack / ' if decides else ''}Diffusion-ES planners: {cfg.stack.describe(decides)}."]
    lines += ["", f"Wall time: {summary.wall_time:.1f} s; peak RSS: main process {summary.peak_rss_main_mb:.0f} MB, "
              f"largest worker {summary.peak_rss_worker_mb:.0f} MB.", ""]
    if summary.failures:
        lines += [f"Failed runs ({len(summary.failures)}; each scored 0):", ""]
        lines += [f"- {f['planner']} / {f['mode']} / {f['scenario']}: {f['status']}: {f['error']}"
                  for f in summary.failures]
    else:
        lines.append("No scenario failed to load and no run crashed.")
    return "\n".join(lines) + "\n"


def run_evaluation(cfg: EvalConfig, command: str = "", progress: bool = True) -> EvalSummary:
    started = time.perf_counter()
    refs = resolve_suite(cfg.suite)
    if not refs:
        raise EvaluationError(f"suite {cfg.suite!r} has no scenarios")
    if cfg.expect_count is not None and len(refs) != cfg.expect_count:
        raise EvaluationError(f"suite {cfg.suite!r} has {len(refs)} scenarios, expected {cfg.expect_count}")
    if cfg.every < 1 or cfg.replan_every < 1:
        raise EvaluationError(f"every ({cfg.every}) and replan_every ({cfg.replan_every}) must be >= 1")
    if cfg.executor not in EXECUTORS:
        raise EvaluationError(f"unknown executor {cfg.executor!r}; one of {', '.join(EXECUTORS)}")
    subset = refs[:: cfg.every]
    if cfg.only:
        # Names pick from the --every subset (not every N-th of the names, which would drop some silently).
        unknown = sorted(set(cfg.only) - {r.name for r in refs})
        if unknown:
            raise EvaluationError(f"suite {cfg.suite!r} has no scenario(s) {unknown}")
        outside = sorted(set(cfg.only) - {r.name for r in subset})
        if outside:
            raise EvaluationError(f"scenario(s) {outside} of suite {cfg.suite!r} are not in its --every "
                                  f"{cfg.every} subset; drop --every to run them")
        subset = [r for r in subset if r.name in cfg.only]
    refs = subset[: cfg.limit]
    planners = _planner_order(cfg.planners)
    unknown = [p for p in planners if planner_spec(p)[0] not in eval_planner_names()]
    if unknown:
        raise EvaluationError(f"unknown planner(s) {unknown}; registered: {', '.join(eval_planner_names())}")
    if progress:  # the count is checked and shown before any work starts
        print(f"suite {cfg.suite}: {len(refs)} scenarios x {len(planners)} planners ({', '.join(planners)}) x "
              f"{len(cfg.modes)} mode(s)", flush=True)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [Job(ref, p, reactive, str(cfg.out_dir), cfg.render, cfg.job_replan_every(p), cfg.job_stack(p))
            for p in planners for reactive in cfg.modes for ref in refs]
    todo = [j for j in jobs if not _finished(j)]
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=f"eval {cfg.suite}", unit="run",
               disable=not progress)
    if cfg.executor == "ray":
        _run_on_ray(todo, cfg, bar)
    elif cfg.workers <= 1:
        _worker_init()  # one torch thread here too: spare threads spin on a busy machine (6x slower seen)
        for job in todo:
            run_job(job)
            bar.update()
    else:
        with single_threaded_children():
            with mp.get_context("spawn").Pool(cfg.workers, initializer=_worker_init) as pool:
                for _ in pool.imap_unordered(run_job, todo, chunksize=1):
                    bar.update()
    bar.close()
    results = _load_results(cfg, refs, planners)
    table = write_reports(cfg, results, planners)
    failures = [{k: r.get(k, "") for k in ("planner", "mode", "scenario", "status", "error")}
                for r in results if r["status"] != STATUS_OK]
    summary = EvalSummary(cfg.out_dir, len(refs), len(jobs), len(jobs) - len(todo), failures, table,
                          time.perf_counter() - started,
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0)
    write_atomic(cfg.out_dir / "summary.md", _markdown(cfg, summary, command, _load_timings(cfg, refs, planners)))
    info = {k: v for k, v in asdict(summary).items() if k != "out_dir"}
    info.update(command=command, suite=cfg.suite, planners=planners, modes=[mode_name(m) for m in cfg.modes])
    write_atomic(cfg.out_dir / "run.json", json.dumps(info, indent=1, sort_keys=True, default=str) + "\n")
    return summary


@contextlib.contextmanager
def single_threaded_children() -> Iterator[None]:
    """Processes spawned in the block inherit one BLAS / OpenMP thread each (workers share the cores)."""
    env = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update({k: "1" for k in env})
    try:
        yield
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def ray_session(cfg: EvalConfig) -> Iterator[None]:
    """Ray connected for the block: the cluster at ``cfg.ray_address``, or a local instance of
    ``cfg.workers`` CPUs, started here and stopped at the end (an already connected Ray is used as
    it is, so several suites can share one instance)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=cfg.ray_address, num_cpus=None if cfg.ray_address else max(cfg.workers, 1),
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {k: "1" for k in THREAD_VARIABLES}})
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _run_on_ray(jobs: list[Job], cfg: EvalConfig, bar: tqdm) -> None:
    """``jobs`` as Ray tasks of one CPU each (``ray_session``). A task runs its job into a scratch
    folder of its node and returns the files the job wrote; this process writes them under
    ``cfg.out_dir`` as they arrive, so the files are the process pool's, byte for byte, a stopped
    evaluation resumes as before, and the nodes share no output folder (they need this code and the
    scenario files at the same paths)."""
    import ray

    with ray_session(cfg):
        task = ray.remote(num_cpus=1)(_job_files)
        pending = [task.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for name, data in ray.get(done[0]).items():
                write_atomic(cfg.out_dir / name, data)
            bar.update()


def _job_files(job: Job) -> dict[str, bytes]:
    """Run ``job`` into a scratch folder (a Ray task); its files by path relative to the folder."""
    import tempfile

    _worker_init()
    with tempfile.TemporaryDirectory(prefix="luna-eval-") as scratch:
        run_job(replace(job, out_dir=scratch))
        return {str(f.relative_to(scratch)): f.read_bytes() for f in sorted(Path(scratch).rglob("*")) if f.is_file()}


# Stack settings whose behaviour before the field existed is not today's default: a result file without the
# field ran with this value (before session 43 every run arbitrated by the paper's Eq. 22; before session 51
# a lane change the map did not allow was dropped).
SETTINGS_BEFORE_THEIR_FIELD = {"safety_first": False, "blocked_lateral_to_keep": False}


def _finished(job: Job) -> bool:
    """A run is done when its result file parses and was made with the same settings (a torn or
    corrupt file, or one from another replanning rate or other stack settings, is rerun). A setting that
    a file predates (added to StackSettings later) counts as what that run used: its default, or the value
    in ``SETTINGS_BEFORE_THEIR_FIELD``."""
    try:
        done = json.loads(job.result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(done, dict):
        return False
    stored = done.get("stack")
    if isinstance(stored, dict):
        stored = {**asdict(StackSettings()), **SETTINGS_BEFORE_THEIR_FIELD, **stored}
    return done.get("replan_every") == job.replan_every and stored == (asdict(job.stack) if job.stack else None)


def run_set(name: str, cfg: EvalConfig, command: str = "", progress: bool = True) -> dict[str, EvalSummary]:
    """Every suite of the named evaluation set (``EVALUATION_SETS``) with ``cfg``'s planners and
    settings, each into ``<cfg.out_dir>/<suite>``; ``cfg.suite``, ``every`` and ``expect_count`` are
    the set's. Returns the summary of each suite."""
    if name not in EVALUATION_SETS:
        raise EvaluationError(f"unknown evaluation set {name!r}; one of {', '.join(EVALUATION_SETS)}")
    out = {}
    for suite, every, count in EVALUATION_SETS[name]:
        suite_cfg = replace(cfg, suite=suite, every=every, expect_count=count, out_dir=cfg.out_dir / suite)
        out[suite] = run_evaluation(suite_cfg, command=command, progress=progress)
    return out
