"""The simulator's steering angle against the one planning starts from, at every planner call of one
closed-loop run (the "held at -0.30 rad at a standstill" reading of docs/benchmarks.md, session 9):

    .venv/bin/python benchmarks/steering_trace.py synthetic-hard hard_stationary_in_traffic_05 diffusion-es --mode N
"""
import argparse

from luna_bridge.baselines import make_eval_planner
from luna_bridge.scenarios.registry import load_suite
from luna_bridge.sim.simulator import SimulationConfig, simulate
from luna_core.planning.context import sanitised_ego


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite")
    p.add_argument("scenario")
    p.add_argument("planner")
    p.add_argument("--mode", choices=("N", "R"), default="N", help="non-reactive or reactive agents")
    p.add_argument("--replan-every", type=int, default=5)
    args = p.parse_args()
    scenario = next(s for s in load_suite(args.suite).scenarios if s.name == args.scenario)
    planner = make_eval_planner(args.planner, scenario)
    plan = planner.plan

    def traced(planner_input):
        ego = planner_input.ego
        start, _ = sanitised_ego(planner_input)
        print(f"t={planner_input.time:5.1f} s  v={ego.velocity:5.2f} m/s  yaw rate={ego.yaw_rate:+.4f} rad/s  "
              f"simulator's angle={ego.steering_angle:+.4f} rad  planning from={start.steering_angle:+.4f} rad",
              flush=True)
        return plan(planner_input)

    planner.plan = traced
    simulate(scenario, planner, reactive=args.mode == "R", config=SimulationConfig(replan_every=args.replan_every))


if __name__ == "__main__":
    main()
