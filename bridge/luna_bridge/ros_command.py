"""``luna-bridge ros``: run scenarios against a running stack: in lock step with /clock (the stack
started by ``luna up --sim-time``), or with ``--realtime`` at wall-clock speed against a stack on
system time (``luna up``), with a latency report (``luna_bridge.ros_realtime``).

    luna up --sim-time &  luna-bridge ros --scenario s.json
    luna up &             luna-bridge ros --realtime --scenario a.json --scenario b.json --report out/rt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("ros", help="drive a running stack over ROS, in lock step with /clock or in real time")
    p.add_argument("--scenario", action="append", required=True,
                   help="scenario file (.json, .json.gz or CommonRoad .xml); repeatable with --realtime")
    p.add_argument("--mode", choices=("non-reactive", "reactive"), default="non-reactive")
    p.add_argument("--replan-period", type=float, default=0.5, help="the planner node's replan_period (s)")
    p.add_argument("--timeout", type=float, default=10.0, help="wall seconds to wait for each trajectory")
    p.add_argument("--out", type=Path, help="write the scenario score JSON here")
    rt = p.add_argument_group("real time (a stack on system time: `luna up` without --sim-time)")
    rt.add_argument("--realtime", action="store_true", help="publish at wall-clock speed, never wait for the stack")
    rt.add_argument("--rate", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    rt.add_argument("--decision-period", type=float, default=2.0, help="T_d of the decision node (s)")
    rt.add_argument("--start-timeout", type=float, default=120.0,
                    help="wall seconds to wait for the stack's first trajectory of a scenario")
    rt.add_argument("--report", type=Path, help="write realtime.json and realtime.md (latency histograms) here")
    p.set_defaults(func=run)


def load_any_scenario(path: str):
    if path.endswith(".xml"):
        from luna_bridge.scenarios import load_commonroad
        return load_commonroad(path)
    from luna_bridge.scenarios.format import load_scenario
    return load_scenario(path)


def run(args: argparse.Namespace) -> int:
    import rclpy

    if args.realtime:
        return run_realtime(args)
    if len(args.scenario) > 1:
        print("luna-bridge ros: several --scenario need --realtime (lock step runs one per stack start)",
              file=sys.stderr)
        return 2

    from luna_bridge.metrics import score_log
    from luna_bridge.ros_bridge import LockstepConfig, RosStackPlanner, lockstep_simulation_config
    from luna_bridge.sim.simulator import simulate

    scenario = load_any_scenario(args.scenario[0])
    rclpy.init()
    bridge = RosStackPlanner(scenario, LockstepConfig(args.replan_period, args.timeout))
    try:
        log = simulate(scenario, bridge, reactive=args.mode == "reactive",
                       config=lockstep_simulation_config(args.replan_period), decision_source=bridge)
    finally:
        bridge.close()
        rclpy.try_shutdown()
    score = score_log(log)
    print(f"{scenario.name} ({args.mode}): CLS {score.score:.3f}, planner failures {log.planner_failures}")
    for name, metric in score.metrics.items():
        print(f"  {name:38s} {metric.score:.3f}")
    if args.out:
        args.out.write_text(json.dumps(score.to_json(), indent=1))
    return 0


def run_realtime(args: argparse.Namespace) -> int:
    """Each scenario at wall-clock speed against the running stack; one report for all."""
    import rclpy

    from luna_bridge.metrics import score_log
    from luna_bridge.ros_bridge import lockstep_simulation_config
    from luna_bridge.ros_realtime import RealtimeConfig, RealtimeStackPlanner, markdown, report
    from luna_bridge.sim.simulator import simulate

    config = RealtimeConfig(replan_period=args.replan_period, decision_period=args.decision_period, rate=args.rate,
                            start_timeout=args.start_timeout)
    reports, scores = [], {}
    rclpy.init()
    bridge = None
    try:
        for path in args.scenario:
            scenario = load_any_scenario(path)
            # One bridge node for every scenario (RosStackPlanner.drive_next): the stack's readers match
            # its publishers once.
            bridge = bridge or RealtimeStackPlanner(scenario, config)
            bridge.drive_next(scenario)
            log = simulate(scenario, bridge, reactive=args.mode == "reactive",
                           config=lockstep_simulation_config(args.replan_period), decision_source=bridge)
            score = score_log(log)
            scores[scenario.name] = score.to_json()
            reports.append(report(scenario.name, bridge.record, config, score.score))
            print(f"{scenario.name} ({args.mode}, real time x{args.rate:g}): CLS {score.score:.3f}, "
                  f"missed deadlines {reports[-1]['missed_deadlines']}, planner failures {log.planner_failures}")
    finally:
        if bridge is not None:
            bridge.close()
        rclpy.try_shutdown()
    text = markdown(reports)
    print(text)
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / "realtime.json").write_text(json.dumps(reports, indent=1))
        (args.report / "realtime.md").write_text(text)
    if args.out:
        args.out.write_text(json.dumps(scores, indent=1))
    return 0
