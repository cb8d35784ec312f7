"""``luna demo``: the main job on the bundled defaults.

The stack (the ``luna up`` topology under simulation time) drives in closed loop over ROS through
the bridge, in lock step with ``/clock``, on a few bundled scenarios; the run prints the nuPlan
metrics table, the same scenarios driven by PDM-style and Diffusion-ES (in process, by
``luna-bridge eval``: same simulator, same metrics), and writes a BEV picture and GIF per scenario, an
MCAP bag of every topic, the stack's logs and a summary (``out/demo`` by default). Parts that are not
available (a model not built yet) are left out and named, and the demo runs what exists.

Two runs print the same tables, on an idle or a loaded machine:

* every node waits for the inputs of its instant (``input_sync_timeout`` raised to ``LOCKSTEP_WAIT``)
  and the planner searches deterministically (no wall-clock budget); a wait that still runs out is
  counted by the node (``input_sync_timeouts``) and the summary says the run is not reproducible;
* each run starts from a fresh copy of the bundled memory bank (``<out>/data``), and decisions read it
  as copied: reflections written during the run go into that copy (audited in the summary) but do not
  change this run's retrieval, which would depend on when they land;
* consecutive scenarios run on one stack at ROS times T_d apart, so every scenario starts on a
  decision instant, and each scenario's route starts a new mission (``Route.starts_mission``): no recent
  decisions, retrieved items or warm start carry over from the scenario before, as in ``luna-bridge eval``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from luna_bringup.supervisor import Supervisor
from luna_core.decision import DecisionTiming
from luna_bringup.topology import COMMON_PARAMS, config_dir, load_topology

DEFAULT_SCENARIOS = ("hard_following_lane_with_lead_00", "hard_stopping_with_lead_00",
                     "hard_waiting_for_pedestrian_to_cross_00")
#: Shown beside the stack, in process (``luna-bridge eval``), replanning as often as the stack's planner.
BASELINES = (("pdm", "PDM-style"), ("diffusion-es", "Diffusion-ES"))
REPLAN_PERIOD = 0.5  # s, the planner node's default replan_period
LOCKSTEP_WAIT = 120.0  # s of wall time a node waits for the inputs of its instant before it gives up
BRIDGE_WAIT = 2 * LOCKSTEP_WAIT + 60.0  # s the bridge waits for a trajectory (a decision, then a plan)
SCENARIO_GAP = 10.0  # s of ROS time at least between consecutive scenarios
RUN_PRODUCTS = ("data", "params", "bev", "run_bag", "baselines", "summary.md", "results.json", "stack.log",
                "baselines.log")


@dataclass
class Component:
    name: str
    ok: bool
    detail: str


def _artifact(name: str) -> Component:
    from luna_core.assets import default_path
    try:
        path = default_path(name)
        return Component(name, True, str(path))
    except (FileNotFoundError, KeyError) as exc:
        return Component(name, False, str(exc))


def inventory() -> dict[str, Component]:
    parts = {n: _artifact(n) for n in ("student", "memory_bank", "diffusion_prior")}
    try:
        from luna_bridge.scenarios.registry import suite_refs
        n = len(suite_refs("synthetic-hard"))
        parts["scenarios"] = Component("scenarios", n > 0, f"{n} synthetic-hard scenarios")
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        parts["scenarios"] = Component("scenarios", False, str(exc))
    return parts


def _params_dir(out: Path, planner: str, with_decisions: bool) -> Path:
    """The bundled parameter files with the demo's lock-step settings."""
    params = out / "params"
    shutil.copytree(config_dir(), params)

    def patch(node: str, **values) -> None:
        path = params / f"{node}.yaml"
        data = yaml.safe_load(path.read_text())
        data[node]["ros__parameters"].update(values)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    # Lock step: the clock waits for the planner, the planner for the inputs and the decision of its
    # instant, the decision for the scene of its instant, the scene for the inputs of its instant.
    # Without decisions the planner waits for none (decision_period 0); its timeout then cannot derive
    # from T_d and is set to what it would be (no decision comes to age anyway).
    timing = {"decision_period": decision_period()} if with_decisions else \
        {"decision_period": 0.0, "decision_timeout": DecisionTiming(decision_period()).expiry}
    patch("planner", planner=planner, deterministic="on", replan_period=REPLAN_PERIOD,
          input_sync_timeout=LOCKSTEP_WAIT, **timing)
    patch("scene_descriptor", input_sync_timeout=LOCKSTEP_WAIT)
    patch("decision_inference", input_sync_timeout=LOCKSTEP_WAIT, max_scene_age=2.0, memory_reload=False)
    return params


def decision_period() -> float:
    """T_d of the bundled parameters (the stack's shared file)."""
    data = yaml.safe_load((config_dir() / COMMON_PARAMS).read_text())
    return float(data["/**"]["ros__parameters"]["decision_period"])


def _fresh(out: Path) -> None:
    """Remove what an earlier run left in ``out`` (its memory bank above all), nothing else."""
    for name in RUN_PRODUCTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (out / "bev").mkdir(parents=True)


def _baselines_command(out: Path, scenarios: list[str]) -> list[str]:
    cmd = [str(Path(sys.executable).parent / "luna-bridge"), "eval", "--suite", "synthetic-hard"]
    for name in scenarios:
        cmd += ["--only", name]
    for planner, _ in BASELINES:
        cmd += ["--planner", planner]
    return cmd + ["--mode", "non-reactive", "--replan-every", str(round(REPLAN_PERIOD / 0.1)),
                  "--out", str(out / "baselines")]


def run_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out: Path = args.out
    _fresh(out)
    parts = inventory()
    print("LUNA-AD demo: components")
    for c in parts.values():
        print(f"  [{'x' if c.ok else ' '}] {c.name:16s} {c.detail}")
    if not parts["scenarios"].ok:
        print("luna demo: no bundled scenarios; nothing to drive", file=sys.stderr)
        return 1
    with_decisions = parts["student"].ok and parts["memory_bank"].ok and not args.no_decisions
    planner = args.planner
    if planner == "auto":
        planner = "luna" if parts["diffusion_prior"].ok else "pdm"
    missing = [c.name for c in parts.values() if not c.ok]
    if missing:
        print(f"  still missing: {', '.join(missing)}; running without them")
    wanted = args.scenarios.split(",") if args.scenarios else list(DEFAULT_SCENARIOS)
    from luna_bridge.scenarios.registry import suite_refs
    unknown = sorted(set(wanted) - {name for name, _, _ in suite_refs("synthetic-hard")})
    if unknown:
        print(f"luna demo: unknown scenario(s) {unknown}", file=sys.stderr)
        return 2
    names = ["planner", "scene_descriptor", "progress_monitor"]
    if with_decisions:
        names += ["decision", "reflection_client"]
        print(f"memory bank: a fresh copy of the bundled one in {out / 'data' / 'memory_bank'}; this run's "
              "decisions read it as copied (reflections written meanwhile go into it, audited below)")
    topology = load_topology().select(names)
    params = _params_dir(out, planner, with_decisions)
    env = dict(os.environ, LUNA_DATA=str(out / "data"), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    env.setdefault("ROS_DOMAIN_ID", str(1 + os.getpid() % 100))
    os.environ.update({k: env[k] for k in ("LUNA_DATA", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_DOMAIN_ID")})
    print(f"stack: {', '.join(p.name for p in topology.processes)} (planner '{planner}', deterministic search, "
          f"decisions {'on' if with_decisions else 'off'}); logs in {out / 'stack.log'}")

    # The baselines are deterministic and need no ROS: they run meanwhile, on the other core.
    baselines_cmd = [] if args.no_baselines else _baselines_command(out, wanted)
    baselines = None
    if baselines_cmd:
        print(f"baselines ({', '.join(label for _, label in BASELINES)}) in process, meanwhile: "
              f"{' '.join([Path(baselines_cmd[0]).name, *baselines_cmd[1:]])}")
        baselines = subprocess.Popen(baselines_cmd, stdout=(out / "baselines.log").open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    from luna_bringup.supervisor import stack_environment
    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", stack_environment()["FASTDDS_DEFAULT_PROFILES_FILE"])
    bag_dir = out / "run_bag"
    nodes = [n for p in topology.processes for n in p.nodes]
    try:
        with open(out / "stack.log", "w") as log_file:
            supervisor = Supervisor(topology, params, use_sim_time=True, env=env, out=log_file)
            supervisor.start()
            recorder = subprocess.Popen([str(Path(sys.executable).parent / "luna"), "bag", "record", "-o",
                                         str(bag_dir), "--use-sim-time", "--quiet"], env=env, stdout=log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rows, health = _drive(wanted, out, nodes, planner, with_decisions, supervisor)
            finally:
                recorder.send_signal(signal.SIGINT)
                try:
                    recorder.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    recorder.kill()
                supervisor.stop()
        baseline_rows = _wait_for_baselines(baselines, out, wanted)
    finally:
        if baselines is not None and baselines.poll() is None:
            baselines.kill()
    unsafe = _report(rows, baseline_rows, health, out, planner, with_decisions, missing, bag_dir,
                     supervisor.events, baselines_cmd)
    print(f"wall time {time.monotonic() - started:.0f} s")
    return 0 if rows and all(r["error"] == "" for r in rows) and not unsafe else 1


class StackWatch:
    """The demo's own node: waits for the stack to be up and keeps each node's latest diagnostics values."""

    def __init__(self, nodes: list[str]) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        from luna_bringup.replay import StackReadiness
        from luna_msgs_py import qos

        self.node = Node("luna_demo")
        self.values: dict[str, dict[str, str]] = {}
        self.readiness = StackReadiness(self.node, nodes)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, qos.DIAGNOSTICS)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, name="demo-watch", daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        while not self.stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            self.values[status.name.removeprefix("luna: ")] = {kv.key: kv.value for kv in status.values}

    def counter(self, key: str) -> dict[str, int]:
        return {node: int(float(v[key])) for node, v in sorted(self.values.items()) if key in v}

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.executor.shutdown()
        self.node.destroy_node()


def _drive(wanted: list[str], out: Path, nodes: list[str], planner: str, with_decisions: bool,
           supervisor: Supervisor) -> tuple[list[dict], dict]:
    import rclpy

    from luna_bridge.metrics import score_log
    from luna_bridge.render import render_gif, render_png
    from luna_bridge.ros_bridge import (TIME_OFFSET, LockstepConfig, PlannerTimeout, RosStackPlanner,
                                       lockstep_simulation_config)
    from luna_bridge.scenarios.registry import load_entry, suite_refs
    from luna_bridge.sim.simulator import simulate

    refs = {name: (source, loader) for name, source, loader in suite_refs("synthetic-hard")}
    period = decision_period()
    rclpy.init()
    rows = []
    offset = TIME_OFFSET  # a multiple of T_d: each scenario starts on a decision instant
    watch = StackWatch(nodes)
    bridge = None
    try:
        not_ready = watch.readiness.wait(LOCKSTEP_WAIT, threading.Event())
        if not_ready:
            print(f"  not ready after {LOCKSTEP_WAIT:.0f} s: {', '.join(not_ready)}; driving anyway", flush=True)
        for i, name in enumerate(wanted):
            scenario = load_entry(*refs[name])
            # One bridge node drives every scenario on the one running stack (RosStackPlanner.drive_next),
            # whose clock must keep moving forwards.
            if bridge is None:
                bridge = RosStackPlanner(scenario, LockstepConfig(REPLAN_PERIOD, timeout=BRIDGE_WAIT,
                                                                  connect_timeout=300.0, time_offset=offset,
                                                                  expect_decisions=with_decisions))
            bridge.drive_next(scenario, offset)
            offset += math.ceil((scenario.duration + SCENARIO_GAP) / period) * period
            started = time.monotonic()
            print(f"[{i + 1}/{len(wanted)}] {name} ({scenario.scenario_type}, {scenario.duration:.0f} s) ...",
                  flush=True)
            try:
                log = simulate(scenario, bridge, reactive=False, config=lockstep_simulation_config(REPLAN_PERIOD),
                               decision_source=bridge if with_decisions else None)
                if with_decisions:
                    bridge.await_decisions(period, float(log.plan_times[-1]) if len(log.plan_times) else 0.0)
                error = ""
            except PlannerTimeout as exc:
                log, error = None, str(exc)
            row = {"scenario": name, "type": scenario.scenario_type, "wall_s": time.monotonic() - started,
                   "error": error}
            if log is not None:
                # The stack's own decisions at their stamps (the simulator records the latest one it saw
                # at each of its calls, which in lock step may lag by a replan period).
                log.decisions = [(d.stamp, d.top_action) for d in bridge.decisions
                                 if -1e-6 <= d.stamp <= scenario.duration + 1e-6]
                log.planner = f"{planner}, ROS"
                score = score_log(log)
                title = f"{planner} over ROS: {name}, CLS {100 * score.score:.1f}"
                picture = render_png(log, out / "bev" / f"{name}.png", title=title, score=score)
                render_gif(log, out / "bev" / f"{name}.gif", title=title, score=score)
                collisions = score.metrics["no_ego_at_fault_collisions"].statistics
                row.update(cls=score.score, failures=log.planner_failures, decisions=len(log.decisions),
                           metrics={k: m.score for k, m in score.metrics.items()}, bev=str(picture),
                           collisions=collisions.get("number_of_collisions", 0),
                           at_fault_collisions=collisions.get("number_of_at_fault_collisions", 0))
            rows.append(row)
            print(f"    CLS {100 * row.get('cls', float('nan')):.1f}  ({row['wall_s']:.0f} s wall)"
                  f"{'  ' + error if error else ''}", flush=True)
        time.sleep(2.0)  # diagnostics go out every second (wall time): the last counts
        health = {"input_sync_timeouts": watch.counter("input_sync_timeouts"),
                  "restarts": list(supervisor.events)}
    finally:
        if bridge is not None:
            bridge.close()
        watch.close()
        rclpy.try_shutdown()
    return rows, health


def _wait_for_baselines(proc: subprocess.Popen | None, out: Path, wanted: list[str]) -> dict[str, dict[str, dict]]:
    """planner -> scenario -> result JSON of ``luna-bridge eval`` (empty when left out or failed)."""
    if proc is None:
        return {}
    print("waiting for the baselines ...", flush=True)
    rc = proc.wait()
    if rc != 0:
        print(f"  luna-bridge eval exited with {rc}; see {out / 'baselines.log'}", flush=True)
    results: dict[str, dict[str, dict]] = {}
    for planner, _ in BASELINES:
        for name in wanted:
            path = out / "baselines" / "scenarios" / planner / "non_reactive" / f"{name}.json"
            if path.exists():
                results.setdefault(planner, {})[name] = json.loads(path.read_text())
    return results


def _comparison(rows: list[dict], baselines: dict[str, dict[str, dict]], planner: str) -> list[str]:
    """CLS per scenario and planner: the stack over ROS beside the in-process baselines."""
    columns = [(f"{planner} (ROS, lock step)", {r["scenario"]: r.get("cls") for r in rows})]
    for planner, label in BASELINES:
        if planner in baselines:
            columns.append((f"{label} (in process)", {n: r.get("score") for n, r in baselines[planner].items()}))
    lines = ["| scenario | " + " | ".join(c for c, _ in columns) + " |", "|---|" + "---:|" * len(columns)]

    def cell(v) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    for r in rows:
        lines.append(f"| {r['scenario']} | " + " | ".join(cell(v.get(r["scenario"])) for _, v in columns) + " |")
    means = []
    for _, v in columns:
        scores = [v.get(r["scenario"]) for r in rows]
        means.append(cell(sum(s or 0.0 for s in scores) / len(scores) if scores else None))
    lines.append("| **NR-CLS** | " + " | ".join(means) + " |")
    return lines


def _report(rows: list[dict], baselines: dict, health: dict, out: Path, planner: str, with_decisions: bool,
            missing: list[str], bag_dir: Path, events: list[str], baselines_cmd: list[str]) -> int:
    """Print and write the summary; returns how many live-bank reflection items are unsafe in hindsight."""
    metric_names = sorted({k for r in rows for k in r.get("metrics", {})})
    short = {m: m.replace("ego_", "").replace("_compliance", "").replace("time_to_collision_within_bound", "ttc")
             for m in metric_names}
    # Every contact (what the progress monitor reports) beside the at-fault ones (what the score counts).
    header = ["scenario", "CLS"] + [short[m] for m in metric_names] + ["decisions", "planner failures",
                                                                       "collisions (at fault)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "cls" not in r:
            lines.append(f"| {r['scenario']} | failed: {r['error']} |")
            continue
        cells = [r["scenario"], f"{100 * r['cls']:.1f}"] + [f"{r['metrics'][m]:.2f}" for m in metric_names]
        cells += [str(r["decisions"]), str(r["failures"]), f"{r['collisions']} ({r['at_fault_collisions']})"]
        lines.append("| " + " | ".join(cells) + " |")
    scored = [r["cls"] for r in rows if "cls" in r]
    mean = sum(scored) / len(scored) if scored else float("nan")
    success = sum(s > 0 for s in scored) / len(rows) if rows else 0.0
    totals = f"NR-CLS {100 * mean:.1f} (0-100), NR-SR {100 * success:.0f}% over {len(rows)} scenarios"
    comparison = _comparison(rows, baselines, planner) if baselines else []
    timeouts = {n: c for n, c in health.get("input_sync_timeouts", {}).items() if c}
    restarts = health.get("restarts", [])
    if timeouts or restarts:
        reproducible = ("NOT reproducible: " + "; ".join(
            [f"lock-step waits that ran out ({LOCKSTEP_WAIT:.0f} s): "
             + ", ".join(f"{n} {c}" for n, c in timeouts.items())] * bool(timeouts) + restarts))
    else:
        reproducible = ("reproducible: deterministic search, no lock-step wait ran out, no process restarted, "
                        "memory bank as copied")
    summary = ["# LUNA-AD demo", "", f"planner `{planner}`, decisions {'on' if with_decisions else 'off'}, "
               f"non-reactive, lock step over ROS; {reproducible}", "", *lines, "", totals]
    if comparison:
        summary += ["", "## Beside the baselines (CLS, 0-100)", "",
                    f"Baselines in process, same simulator and metrics, replanning every {REPLAN_PERIOD} s: "
                    f"`{' '.join([Path(baselines_cmd[0]).name, *baselines_cmd[1:]])}`", "", *comparison]
    summary += ["", f"bag: `{bag_dir}`; BEV pictures and GIFs: `{out / 'bev'}`; stack logs: `{out / 'stack.log'}`"]
    if missing:
        summary.append(f"\nnot available in this run: {', '.join(missing)}")
    reflection, unsafe = _reflection_report(out / "data") if with_decisions else ([], 0)
    summary += reflection
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    (out / "results.json").write_text(json.dumps({"stack": rows, "health": health,
                                                  "baselines": {p: {n: r.get("score") for n, r in v.items()}
                                                                for p, v in baselines.items()}}, indent=1))
    print("\n".join(lines))
    print(totals)
    if comparison:
        print("\n".join(["", "beside the baselines (CLS):", *comparison]))
    print(reproducible)
    print("\n".join(reflection))
    print(f"wrote {out / 'summary.md'}, {out / 'bev'}/*.png|gif, bag {bag_dir}")
    return unsafe


def _reflection_report(data: Path) -> tuple[list[str], int]:
    """The reflection part of the summary: the requests and their outcomes (outbox journal), the
    explanations' latency, and the live bank's hindsight audit (no reflection item may rank an action
    that collides, cannot be executed or stalls in hindsight); returns the lines and the unsafe count.
    Explanations run in the background on wall time: these counts say what was done when the stack
    stopped, and are not part of the reproducible tables."""
    from luna_core.assets import live_memory_bank
    from luna_core.memory.bank import MemoryBank
    from luna_core.reflection import audit_reflections, outbox_summary

    outbox = data / "reflection_outbox"
    s = outbox_summary(outbox)
    lines = ["", "## Reflection (background, on wall time)", "",
             f"{s['requests']} failure(s) explained and reflected on ({s['collisions']} collision(s), "
             f"{s['near_misses']} near miss(es), {s['stalls']} stall(s), {s['blocked']} blocked); "
             f"revisions written {s['written']}, 'normal' {s['normal']}, no grounded "
             f"revision {s['no_grounded_revision']}, rejected {s['rejected']}, still in the outbox {s['pending']}."]
    if s["explanation_latency_max_s"] is not None:
        lines.append(f"Explanation latency: mean {s['explanation_latency_mean_s']:.1f} s, "
                     f"max {s['explanation_latency_max_s']:.1f} s.")
    bank_path = live_memory_bank("")
    if not (bank_path / "manifest.json").exists():
        return lines + ["No live memory bank: nothing to audit."], 0
    with MemoryBank.open(bank_path) as bank:
        checked, findings = audit_reflections(bank, outbox)
    lines.append(f"Hindsight audit of the run's bank: {checked} reflection item(s), {len(findings)} unsafe"
                 + (":" if findings else " (none collides, fails to execute or stalls in hindsight)."))
    lines += [f"- UNSAFE {f.item_id}: {f.problem}" for f in findings]
    return lines, len(findings)


def register(sub) -> None:
    p = sub.add_parser("demo", help="the stack in closed loop over ROS on bundled scenarios (the main job)")
    p.add_argument("--out", type=Path, default=Path("out/demo"),
                   help="output folder; what an earlier demo left there (its memory bank too) is replaced")
    p.add_argument("--scenarios", default="", help="comma-separated synthetic-hard scenario names")
    p.add_argument("--planner", default="auto", choices=("auto", "luna", "diffusion-es", "pdm", "idm"))
    p.add_argument("--no-decisions", action="store_true", help="leave the language model out")
    p.add_argument("--no-baselines", action="store_true", help="leave out the in-process PDM-style and "
                   "Diffusion-ES runs")
    p.set_defaults(func=run_demo)
