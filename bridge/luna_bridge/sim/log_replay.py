"""The expert: replays the logged ego trajectory (the log-replay row of every results table)."""

from __future__ import annotations

import numpy as np

from luna_core.types import PlannerInput, Trajectory

from luna_bridge.scenario import SIM_DT, Scenario


class LogReplayPlanner:
    """Returns the logged ego future (``horizon`` s) from the current time; the simulator tracks it
    with the same LQR + bicycle as any planner, as nuPlan's log-future planner is tracked. It reads
    the scenario, so it is a reference row, never a competitor."""

    name = "log_replay"

    def __init__(self, scenario: Scenario, horizon: float = 8.0) -> None:
        self.scenario = scenario
        self.horizon = horizon

    def reset(self) -> None:
        """Stateless."""

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        track = self.scenario.expert
        now = planner_input.time
        i = track.index_at(now)
        if i is None:
            raise ValueError(f"the expert log of {self.scenario.name} has no state at t = {now:.1f} s")
        j = min(i + int(round(self.horizon / SIM_DT)) + 1, len(track.t))
        rows = np.arange(i, j)
        rows = rows[np.isfinite(track.x[rows])]
        if len(rows) < 2:  # end of the log: hold the last pose
            rows = np.array([i, i])
        t = track.t[rows] - now
        if t[-1] <= t[0]:
            t = np.array([0.0, SIM_DT])
        h = track.heading[rows]
        v = track.vx[rows] * np.cos(h) + track.vy[rows] * np.sin(h)
        a = np.gradient(v, t) if len(rows) > 2 else np.zeros(len(rows))
        return Trajectory(now, t, track.x[rows].copy(), track.y[rows].copy(), h.copy(), v, a)
