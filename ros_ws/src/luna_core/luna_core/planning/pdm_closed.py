"""PDM-Closed-style planner (Dauner et al., tuplan_garage), with the centreline re-planned every call.

Each call, from the cycle's ``PlanningContext`` (``planning.context``): the route centreline from the lane
the ego is on now (RAD-LAD's critique of PDM-Closed is
that it fixes its paths at the first step and cannot recover after leaving them; here they follow the
ego), a constant-velocity forecast, 15 IDM proposals = centreline offsets {0, -1, +1} m x target
speeds {0.2, 0.4, 0.6, 0.8, 1.0} x the speed limit (PDM-Closed's order: centreline first, then by
offset), each over 8 s with its first 4 s tracked by LQR + bicycle and scored by the shared PDM
scorer; the best proposal's 8 s IDM trajectory is returned.
Emergency brake: if the best proposal still runs into an at-fault collision within 2 s while the
ego is at most 5 m/s, brake as PDM-Closed does (``emergency_brake_trajectory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from luna_core.control import BicycleParameters, StateIndex, TrackerParameters, lqr_commands, propagate, state_from_ego
from luna_core.planning.context import PlanningContext, build_planning_context
from luna_core.planning.proposals import ProposalSet, idm_proposals
from luna_core.planning.scorer import (MAX_LON_ACCEL, MIN_LON_ACCEL, PDM_WEIGHTS, ProposalScores, ScorerWeights,
                                       score_proposals)
from luna_core.types import EgoState, PlannerInput, Trajectory, VehicleParameters


@dataclass(frozen=True)
class PDMClosedConfig:
    # m, left positive. The centreline first, as PDM-Closed orders its paths: proposal index breaks
    # ties in the argmax (equal totals, or every total 0), so the centreline wins them, not the
    # 1 m right offset that came first before.
    offsets: tuple[float, ...] = (0.0, -1.0, 1.0)
    speed_fractions: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)  # of the speed limit
    scoring_horizon: float = 4.0  # s
    output_horizon: float = 8.0  # s
    dt: float = 0.1
    emergency_time: float = 2.0  # s to an at-fault collision of the best proposal
    emergency_max_speed: float = 5.0  # m/s
    weights: ScorerWeights = PDM_WEIGHTS


def pdm_correcting_velocity(velocity: float, acceleration: float) -> float:
    """PDM-Closed's emergency-brake reference velocity (tuplan_garage ``PDMEmergencyBrake``): above
    0.2 m/s 1.1 (v + clip(-10 v)) (= 1.1 (v - 4.05) above 0.41 m/s, negative below 4.05 m/s); below,
    a PD term clip(-4 v - a) whose -a damps the actuator lag. Clips are nuPlan's comfort bounds."""
    if velocity > 0.2:
        return 1.1 * (velocity + min(max(-10.0 * velocity, MIN_LON_ACCEL), MAX_LON_ACCEL))
    return min(max(-4.0 * velocity - acceleration, MIN_LON_ACCEL), MAX_LON_ACCEL)


def emergency_brake_trajectory(ego: EgoState, steps: int, dt: float, vehicle: VehicleParameters = VehicleParameters(),
                               tracker: TrackerParameters = TrackerParameters(),
                               bicycle: BicycleParameters = BicycleParameters()) -> Trajectory:
    """PDM-Closed's emergency brake as one trajectory, valid however long it is followed.

    PDM-Closed asks, every 0.1 s, for a straight reference along the heading driven at
    ``pdm_correcting_velocity``. nuPlan's LQR tracks the reference velocity one look-ahead (1 s)
    ahead, a = -(10/11)(v - v_ref), so this brakes at about 4 m/s^2 down to 0.2 m/s and the PD term
    then stops the car without reversing. (A reference that itself stops at 4 m/s^2 only gets
    a = -0.91 v below 4 m/s from that tracker: an exponential creep needing ~1.5 m more to stop
    from 4 m/s (test_pdm), enough to touch the stopped leader the proposals were braking for. Holding PDM's
    constant reference for longer than 0.1 s, as a planner replanning every 0.5 s does, reverses the
    car once it stops.) So the brake is rolled out here with the same tracker and bicycle, asking
    PDM's law at every step, and the reference velocity one look-ahead after each step is the
    velocity PDM-Closed asked for at that step (before the first look-ahead: its first request)."""
    state = state_from_ego(ego)[None]
    state[0, [StateIndex.X, StateIndex.Y, StateIndex.HEADING, StateIndex.STEERING_ANGLE,
              StateIndex.STEERING_RATE, StateIndex.YAW_RATE]] = 0.0  # longitudinal only, ego frame
    asked = np.zeros(steps + 1)
    no_curvature = np.zeros((1, tracker.horizon))
    for k in range(steps + 1):
        asked[k] = pdm_correcting_velocity(float(state[0, StateIndex.VELOCITY]),
                                           float(state[0, StateIndex.ACCELERATION]))
        if k < steps:
            accel, _ = lqr_commands(state, state[:, :3].copy(), asked[k:k + 1], no_curvature, vehicle.wheelbase,
                                    tracker)
            state = propagate(state, accel, np.zeros(1), vehicle.wheelbase, dt, bicycle)
    velocity = np.concatenate([np.full(tracker.horizon, asked[0]), asked])[:steps + 1]
    t = np.arange(steps + 1) * dt
    s = np.concatenate([[0.0], np.cumsum(0.5 * (velocity[1:] + velocity[:-1]) * dt)])
    c, sn = math.cos(ego.heading), math.sin(ego.heading)
    return Trajectory(ego.stamp, t, ego.x + c * s, ego.y + sn * s, np.full_like(t, ego.heading), velocity,
                      np.gradient(velocity, t))


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
        self.last_context: PlanningContext | None = None  # the last cycle's set-up

    def reset(self) -> None:
        self.last = None
        self.last_context = None

    def cycle_info(self) -> dict[str, object]:
        """How the last cycle ended: its best proposal, or the emergency brake."""
        return {} if self.last is None else {"mode": "emergency_brake" if self.last.emergency_brake else "proposal"}

    def plan(self, planner_input: PlannerInput, context: PlanningContext | None = None) -> Trajectory:
        """The best proposal's trajectory (or the emergency brake), from ``context`` (built from
        ``planner_input`` here if not given); ``OffMapError`` off the map."""
        c = self.config
        steps = int(round(c.output_horizon / c.dt))
        score_steps = int(round(c.scoring_horizon / c.dt))
        if context is None:
            context = build_planning_context(planner_input, output_horizon=c.output_horizon,
                                             scored_steps=score_steps, dt=c.dt)
        context.check(planner_input, steps, score_steps, c.dt, self.name)
        self.last_context = context
        context.require_map(self.name)
        ref = context.route_reference
        ego = context.ego
        props = idm_proposals(ego, ref.centerline, context.near_forecast, offsets=c.offsets,
                              target_speeds=tuple(f * ref.speed_limit for f in c.speed_fractions),
                              steps=steps, simulate_steps=score_steps, dt=c.dt, vehicle=planner_input.vehicle)
        assert props.states is not None
        scores = score_proposals(props.states, context.scoring_context(ref), c.weights)
        best = scores.best
        brake = bool(scores.time_to_at_fault_collision[best] <= c.emergency_time
                     and ego.velocity <= c.emergency_max_speed)
        self.last = PDMClosedResult(props, scores, brake)
        if brake:
            return emergency_brake_trajectory(ego, steps, c.dt, planner_input.vehicle)
        return props.trajectory(best, ego.stamp)
