"""PDM-Closed-style planner (Dauner et al., tuplan_garage), with the centreline re-planned every call.

Each call: the route centreline from the lane the ego is on now (RAD-LAD's critique of PDM-Closed is
that it fixes its paths at the first step and cannot recover after leaving them; here they follow the
ego), a constant-velocity forecast, 15 IDM proposals = centreline offsets {-1, 0, +1} m x target
speeds {0.2, 0.4, 0.6, 0.8, 1.0} x the speed limit, each over 8 s with its first 4 s tracked by LQR +
bicycle and scored by the shared PDM scorer; the best proposal's 8 s IDM trajectory is returned.
Emergency brake: if the best proposal still runs into an at-fault collision within 2 s while the
ego is at most 5 m/s, brake to a stop along the centreline instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from luna_core.lanes import lane_map
from luna_core.planning.proposals import ProposalSet, idm_proposals, planning_setup, stopping_trajectory
from luna_core.planning.scorer import ProposalScores, ScorerWeights, ScoringContext, score_proposals
from luna_core.types import PlannerInput, Trajectory


@dataclass(frozen=True)
class PDMClosedConfig:
    offsets: tuple[float, ...] = (-1.0, 0.0, 1.0)  # m, left positive
    speed_fractions: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)  # of the speed limit
    scoring_horizon: float = 4.0  # s
    output_horizon: float = 8.0  # s
    dt: float = 0.1
    emergency_time: float = 2.0  # s to an at-fault collision of the best proposal
    emergency_max_speed: float = 5.0  # m/s
    emergency_deceleration: float = 4.0  # m/s^2, within nuPlan's comfort bound (-4.05)
    weights: ScorerWeights = field(default_factory=ScorerWeights)


@dataclass
class PDMClosedResult:
    """The last call's internals, for debugging views and tests."""

    proposals: ProposalSet
    scores: ProposalScores
    emergency_brake: bool


class PDMClosedPlanner:
    name = "pdm"

    def __init__(self, config: PDMClosedConfig = PDMClosedConfig()) -> None:
        self.config = config
        self.last: PDMClosedResult | None = None

    def reset(self) -> None:
        self.last = None

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        c = self.config
        steps = int(round(c.output_horizon / c.dt))
        score_steps = int(round(c.scoring_horizon / c.dt))
        setup = planning_setup(planner_input, steps, c.dt)
        ref = setup.reference
        ego = planner_input.ego
        props = idm_proposals(ego, ref.centerline, setup.forecast, offsets=c.offsets,
                              target_speeds=tuple(f * ref.speed_limit for f in c.speed_fractions),
                              steps=steps, simulate_steps=score_steps, dt=c.dt, vehicle=planner_input.vehicle)
        f = setup.forecast
        scoring_objects = type(f)(f.ids, f.pose[:, :score_steps + 1], f.size, f.speed, f.static, f.red_light)
        ctx = ScoringContext(lane_map(planner_input.lane_graph), ref.centerline, scoring_objects,
                             ref.speed_limit, planner_input.vehicle, c.dt)
        assert props.states is not None
        scores = score_proposals(props.states, ctx, c.weights)
        best = scores.best
        brake = bool(scores.time_to_at_fault_collision[best] <= c.emergency_time
                     and ego.velocity <= c.emergency_max_speed)
        self.last = PDMClosedResult(props, scores, brake)
        if brake:
            return stopping_trajectory(ego, ref.centerline, c.emergency_deceleration, steps, c.dt)
        return props.trajectory(best, ego.stamp)
