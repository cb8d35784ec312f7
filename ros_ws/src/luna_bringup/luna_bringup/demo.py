"""``luna demo``: the main job on the bundled defaults.

The stack (the ``luna up`` topology under simulation time) drives in closed loop over ROS through
the bridge, in lock step with ``/clock``, on a few bundled scenarios; the run prints the nuPlan
metrics table and writes a BEV picture per scenario, an MCAP bag of every topic, the stack's logs
and a summary (``out/demo`` by default). Parts that are not available (a model not built yet) are
left out and named, and the demo runs what exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from luna_bringup.supervisor import Supervisor
from luna_bringup.topology import config_dir, load_topology

DEFAULT_SCENARIOS = ("hard_following_lane_with_lead_00", "hard_stopping_with_lead_00",
                     "hard_waiting_for_pedestrian_to_cross_00")


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
    shutil.rmtree(params, ignore_errors=True)
    shutil.copytree(config_dir(), params)

    def patch(node: str, **values) -> None:
        path = params / f"{node}.yaml"
        data = yaml.safe_load(path.read_text())
        data[node]["ros__parameters"].update(values)
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    # Lock step: the clock waits for the planner, and the planner for the decision of its instant.
    patch("planner", planner=planner, input_sync_timeout=30.0 if with_decisions else 2.0,
          decision_period=2.0 if with_decisions else 0.0)
    patch("decision_inference", input_sync_timeout=10.0, max_scene_age=2.0)
    return params


def run_demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    (out / "bev").mkdir(parents=True, exist_ok=True)
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
    names = ["planner", "scene_descriptor", "progress_monitor"]
    if with_decisions:
        names += ["decision", "reflection_client"]
    topology = load_topology().select(names)
    params = _params_dir(out, planner, with_decisions)
    env = dict(os.environ, LUNA_DATA=str(out / "data"), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    env.setdefault("ROS_DOMAIN_ID", str(1 + os.getpid() % 100))
    os.environ.update({k: env[k] for k in ("LUNA_DATA", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_DOMAIN_ID")})
    print(f"stack: {', '.join(p.name for p in topology.processes)} (planner '{planner}', "
          f"decisions {'on' if with_decisions else 'off'}); logs in {out / 'stack.log'}")

    from luna_bringup.supervisor import stack_environment
    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", stack_environment()["FASTDDS_DEFAULT_PROFILES_FILE"])
    bag_dir = out / "run_bag"
    shutil.rmtree(bag_dir, ignore_errors=True)
    with open(out / "stack.log", "w") as log_file:
        supervisor = Supervisor(topology, params, use_sim_time=True, env=env, out=log_file)
        supervisor.start()
        recorder = subprocess.Popen([str(Path(sys.executable).parent / "luna"), "bag", "record", "-o", str(bag_dir),
                                     "--use-sim-time", "--quiet"], env=env, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rows = _drive(args, out, with_decisions)
        finally:
            recorder.send_signal(signal.SIGINT)
            try:
                recorder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                recorder.kill()
            supervisor.stop()
    _report(rows, out, planner, with_decisions, missing, bag_dir)
    return 0 if rows and all(r["error"] == "" for r in rows) else 1


def _drive(args: argparse.Namespace, out: Path, with_decisions: bool) -> list[dict]:
    import rclpy

    from luna_bridge.metrics import score_log
    from luna_bridge.render import render_png
    from luna_bridge.ros_bridge import (TIME_OFFSET, LockstepConfig, PlannerTimeout, RosStackPlanner,
                                       lockstep_simulation_config)
    from luna_bridge.scenarios.registry import load_entry, suite_refs
    from luna_bridge.sim.simulator import simulate

    refs = {name: (source, loader) for name, source, loader in suite_refs("synthetic-hard")}
    wanted = args.scenarios.split(",") if args.scenarios else list(DEFAULT_SCENARIOS)
    unknown = [n for n in wanted if n not in refs]
    if unknown:
        raise SystemExit(f"luna demo: unknown scenario(s) {unknown}")
    rclpy.init()
    rows = []
    offset = TIME_OFFSET
    try:
        for i, name in enumerate(wanted):
            scenario = load_entry(*refs[name])
            # One running stack drives every scenario: its clock must keep moving forwards.
            bridge = RosStackPlanner(scenario, LockstepConfig(timeout=120.0, connect_timeout=300.0,
                                                              time_offset=offset), node_name=f"luna_bridge_{i}")
            offset += scenario.duration + 10.0
            started = time.monotonic()
            print(f"[{i + 1}/{len(wanted)}] {name} ({scenario.scenario_type}, {scenario.duration:.0f} s) ...",
                  flush=True)
            try:
                log = simulate(scenario, bridge, reactive=False, config=lockstep_simulation_config(0.5),
                               decision_source=bridge if with_decisions else None)
                error = ""
            except PlannerTimeout as exc:
                log, error = None, str(exc)
            finally:
                bridge.close()
            row = {"scenario": name, "type": scenario.scenario_type, "wall_s": time.monotonic() - started,
                   "error": error}
            if log is not None:
                score = score_log(log)
                picture = render_png(log, out / "bev" / f"{name}.png", title=f"{name}: CLS {100 * score.score:.1f}")
                row.update(cls=score.score, failures=log.planner_failures, decisions=len(log.decisions),
                           metrics={k: m.score for k, m in score.metrics.items()}, bev=str(picture))
            rows.append(row)
            print(f"    CLS {100 * row.get('cls', float('nan')):.1f}  ({row['wall_s']:.0f} s wall)"
                  f"{'  ' + error if error else ''}",
                  flush=True)
    finally:
        rclpy.try_shutdown()
    return rows


def _report(rows: list[dict], out: Path, planner: str, with_decisions: bool, missing: list[str],
            bag_dir: Path) -> None:
    metric_names = sorted({k for r in rows for k in r.get("metrics", {})})
    short = {m: m.replace("ego_", "").replace("_compliance", "").replace("time_to_collision_within_bound", "ttc")
             for m in metric_names}
    header = ["scenario", "CLS"] + [short[m] for m in metric_names] + ["decisions", "planner failures"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "cls" not in r:
            lines.append(f"| {r['scenario']} | failed: {r['error']} |")
            continue
        cells = [r["scenario"], f"{100 * r['cls']:.1f}"] + [f"{r['metrics'][m]:.2f}" for m in metric_names]
        cells += [str(r["decisions"]), str(r["failures"])]
        lines.append("| " + " | ".join(cells) + " |")
    scored = [r["cls"] for r in rows if "cls" in r]
    mean = sum(scored) / len(scored) if scored else float("nan")
    success = sum(s > 0 for s in scored) / len(rows) if rows else 0.0
    summary = [f"# LUNA-AD demo", "", f"planner `{planner}`, decisions {'on' if with_decisions else 'off'}, "
               f"non-reactive, lock step over ROS", "", *lines, "",
               f"NR-CLS {100 * mean:.1f} (0-100), NR-SR {100 * success:.0f}% over {len(rows)} scenarios", "",
               f"bag: `{bag_dir}`; BEV pictures: `{out / 'bev'}`; stack logs: `{out / 'stack.log'}`"]
    if missing:
        summary.append(f"\nnot available in this run: {', '.join(missing)}")
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    print(f"NR-CLS {100 * mean:.1f} (0-100), NR-SR {100 * success:.0f}% over {len(rows)} scenarios")
    print(f"wrote {out / 'summary.md'}, {out / 'bev'}/*.png, bag {bag_dir}")


def register(sub) -> None:
    p = sub.add_parser("demo", help="the stack in closed loop over ROS on bundled scenarios (the main job)")
    p.add_argument("--out", type=Path, default=Path("out/demo"))
    p.add_argument("--scenarios", default="", help="comma-separated synthetic-hard scenario names")
    p.add_argument("--planner", default="auto", choices=("auto", "luna", "diffusion-es", "pdm", "idm"))
    p.add_argument("--no-decisions", action="store_true", help="leave the language model out")
    p.set_defaults(func=run_demo)
