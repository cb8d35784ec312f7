"""Eq. 22 at every planner cycle of one closed-loop stack run: the decision's top action, the candidate
actions with their probability, J_dec, J_gen, J_gen's TTC term (1: X*_a keeps the bound under the forecast),
Eq. 22 score and X*_a's planned speed at 1, 2 and 4 s (m/s), the action picked (a*) and the mode. It
tells whether two rows that part (``luna`` and ``luna-onehot``, docs/benchmarks.md "Session 23") part in
the choice of action or inside the search:

    .venv/bin/python benchmarks/candidate_trace.py synthetic-hard hard_high_lateral_acceleration_05 luna --mode N
    .venv/bin/python benchmarks/candidate_trace.py synthetic-random random_starting_left_turn_00 luna --mode R \
        --paper-eq22          # any of luna-bridge eval's stack options

The run is ``luna-bridge eval``'s (``evaluate.closed_loop_run``: decisions every T_d, the search seed of
``--search-seed``); the last line is its CLS.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

from luna_bridge.evaluate import closed_loop_run
from luna_bridge.metrics import score_log
from luna_bridge.scenarios.registry import load_suite
from luna_bridge.stack_planner import STACK_PLANNERS, add_stack_arguments, stack_settings_from_args, use_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import beside_argmax_text  # noqa: E402 - benchmarks/ on sys.path


def _speeds(trajectory, at: tuple[float, ...] = (1.0, 2.0, 4.0)) -> str:
    """A candidate's planned speed (m/s) at the given times, "-" without a trajectory."""
    if trajectory is None:
        return "-"
    return "/".join(f"{np.interp(t, trajectory.t, trajectory.velocity):.1f}" for t in at)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite")
    p.add_argument("scenario")
    p.add_argument("planner", choices=sorted(STACK_PLANNERS))
    p.add_argument("--mode", choices=("N", "R"), default="N", help="non-reactive or reactive agents")
    p.add_argument("--replan-every", type=int, default=5)
    add_stack_arguments(p.add_argument_group("stack (as luna-bridge eval takes them)"))
    args = p.parse_args()
    scenario = next(s for s in load_suite(args.suite).scenarios if s.name == args.scenario)
    stack = stack_settings_from_args(args)
    use_settings(stack)
    beside = []  # per decision cycle: a* not the most likely candidate (what evaluation counts)

    def observe(planner_input, planner) -> None:
        last = planner.planner.last
        decision = planner_input.decision
        top = decision.top_action if decision is not None else "-"
        info = planner.cycle_info()
        if "beside_argmax" in info:
            beside.append(info["beside_argmax"])
        candidates = "  ".join(f"{c.action}: p {c.probability:.2f} J_dec {c.j_dec:.3f} J_gen {c.j_gen:.3f} "
                               f"TTC {c.ttc:.0f} Eq.22 {c.selection_score:.3f} v {_speeds(c.trajectory)}"
                               for c in last.candidates)
        print(f"t={planner_input.time:5.1f} s  v={planner_input.ego.velocity:5.2f} m/s  top={top}  "
              f"a*={last.action or '-'}  mode={last.mode}  |  {candidates}", flush=True)

    log, _ = closed_loop_run(scenario, args.planner, args.mode == "R", args.replan_every, stack, observe)
    print(f"{beside_argmax_text(sum(beside), len(beside))}; "
          f"CLS {score_log(log).score:.4f}")


if __name__ == "__main__":
    main()
