"""The shared scorer's terms for PDM-style proposals of one suite scenario at t = 0.

    .venv/bin/python benchmarks/proposal_terms.py USA_Peach-3_2_T-1 [--suite commonroad] [--speeds 0.5 1 2 3 5 8]

IDM proposals along the current lane (lateral offset 0) at the given target speeds, simulated with the
LQR tracker over the scored 4 s, then scored as every planner scores them (``planning.scorer``, PDM's
weights): one row per proposal with each term, the total, and how far (m) a footprint corner gets
outside the drivable area. It answers "why is no moving trajectory feasible here" in one cycle
(docs/benchmarks.md, "Session 17").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from luna_core.planning.context import build_planning_context
from luna_core.planning.proposals import idm_proposals
from luna_core.planning.scorer import ego_corners, score_proposals
from luna_core.types import PlannerInput

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_planner import commonroad_scene  # noqa: E402 - benchmarks/ on sys.path


def scenario_input(name: str, suite: str) -> PlannerInput:
    """The planner input of a suite scenario at t = 0, as the simulator builds it (the decision is not
    read: the proposals follow the current lane)."""
    return commonroad_scene({"CK": 1.0}, name, suite)


def proposal_table(pi: PlannerInput, speeds: list[float]) -> list[str]:
    ctx = build_planning_context(pi)
    if not ctx.on_map:
        raise SystemExit(f"the ego is off the map: {ctx.off_map}")
    path = ctx.paths["K"]
    proposals = idm_proposals(ctx.ego, path.centerline, ctx.forecast, offsets=(0.0,), target_speeds=tuple(speeds),
                              steps=ctx.output_steps, simulate_steps=ctx.scored_steps, dt=ctx.dt, vehicle=pi.vehicle)
    s = score_proposals(proposals.states, ctx.scoring_context(path))
    outside = ctx.local_lanes.distance_to_drivable_area(ego_corners(proposals.states, pi.vehicle)[:, 1:])
    lines = [f"ego at ({ctx.ego.x:.1f}, {ctx.ego.y:.1f}) m, heading {ctx.ego.heading:.2f} rad, "
             f"{ctx.ego.velocity:.1f} m/s; lane K {list(path.lane_ids)}, limit {path.speed_limit:.1f} m/s",
             "| target (m/s) | at-fault free | drivable | direction | progress (m) | progress | TTC | comfort "
             "| total | corner outside (m) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, v in enumerate(proposals.target_speeds):
        lines.append(f"| {v:.1f} | {s.no_at_fault_collision[i]:.2f} | {s.drivable_area[i]:.0f} | "
                     f"{s.driving_direction[i]:.1f} | {s.raw_progress[i]:.2f} | {s.progress[i]:.2f} | {s.ttc[i]:.0f} | "
                     f"{s.comfort[i]:.0f} | {s.total[i]:.3f} | {outside[i].max():.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario")
    ap.add_argument("--suite", default="commonroad")
    ap.add_argument("--speeds", type=float, nargs="+", default=[0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 11.0])
    args = ap.parse_args(argv)
    print("\n".join(proposal_table(scenario_input(args.scenario, args.suite), args.speeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
