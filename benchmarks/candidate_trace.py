"""Eq. 22 at every planner cycle of one closed-loop stack run: the decision's top action, the candidate
actions with their probability, J_dec, J_gen and Eq. 22 score, the action picked (a*) and the mode. It
tells whether two rows that part (``luna`` and ``luna-onehot``, docs/benchmarks.md "Session 23") part in
the choice of action or inside the search:

    .venv/bin/python benchmarks/candidate_trace.py synthetic-hard hard_high_lateral_acceleration_05 luna --mode N

The run is ``luna-bridge eval``'s (``evaluate.closed_loop_run``: decisions every T_d, the search seed of
``--search-seed``); the last line is its CLS.
"""
import argparse
import sys
from pathlib import Path

from luna_bridge.evaluate import closed_loop_run
from luna_bridge.metrics import score_log
from luna_bridge.scenarios.registry import load_suite
from luna_bridge.stack_planner import STACK_PLANNERS, StackSettings, use_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_tables import beside_argmax_text  # noqa: E402 - benchmarks/ on sys.path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite")
    p.add_argument("scenario")
    p.add_argument("planner", choices=sorted(STACK_PLANNERS))
    p.add_argument("--mode", choices=("N", "R"), default="N", help="non-reactive or reactive agents")
    p.add_argument("--replan-every", type=int, default=5)
    p.add_argument("--search-seed", type=int, default=0)
    p.add_argument("--student", default="", help="student folder (default: the bundled models/student)")
    args = p.parse_args()
    scenario = next(s for s in load_suite(args.suite).scenarios if s.name == args.scenario)
    stack = StackSettings(search_seed=args.search_seed, student=args.student)
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
                               f"Eq.22 {c.selection_score:.3f}" for c in last.candidates)
        print(f"t={planner_input.time:5.1f} s  v={planner_input.ego.velocity:5.2f} m/s  top={top}  "
              f"a*={last.action or '-'}  mode={last.mode}  |  {candidates}", flush=True)

    log, _ = closed_loop_run(scenario, args.planner, args.mode == "R", args.replan_every, stack, observe)
    print(f"{beside_argmax_text(sum(beside), len(beside))}; "
          f"CLS {score_log(log).score:.4f}")


if __name__ == "__main__":
    main()
