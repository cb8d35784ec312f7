"""``luna-bridge ros``: run one scenario against the stack started by ``luna up --sim-time``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("ros", help="drive a running stack over ROS in lock step with /clock")
    p.add_argument("--scenario", required=True, help="scenario file (.json, .json.gz or CommonRoad .xml)")
    p.add_argument("--mode", choices=("non-reactive", "reactive"), default="non-reactive")
    p.add_argument("--replan-period", type=float, default=0.5, help="the planner node's replan_period (s)")
    p.add_argument("--timeout", type=float, default=10.0, help="wall seconds to wait for each trajectory")
    p.add_argument("--out", type=Path, help="write the scenario score JSON here")
    p.set_defaults(func=run)


def load_any_scenario(path: str):
    if path.endswith(".xml"):
        from luna_bridge.scenarios import load_commonroad
        return load_commonroad(path)
    from luna_bridge.scenarios.format import load_scenario
    return load_scenario(path)


def run(args: argparse.Namespace) -> int:
    import rclpy

    from luna_bridge.metrics import score_log
    from luna_bridge.ros_bridge import LockstepConfig, RosStackPlanner, lockstep_simulation_config
    from luna_bridge.sim.simulator import simulate

    scenario = load_any_scenario(args.scenario)
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
