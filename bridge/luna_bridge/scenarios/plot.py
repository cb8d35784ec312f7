"""A quick-look bird's-eye plot of a scenario (map, route, expert, agents) for checking suites."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from luna_bridge.scenario import Scenario


def plot_scenario_file(scenario: Scenario, out: Path, replay: bool = False) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from luna_core.types import box_corners

    fig, ax = plt.subplots(figsize=(9, 9))
    route = set(scenario.route.road_ids)
    for lane in scenario.lane_graph.lanes.values():
        poly = np.vstack([lane.left_boundary, lane.right_boundary[::-1]])
        ax.fill(poly[:, 0], poly[:, 1], color="#d8e8f8" if lane.road_id in route else "#eeeeee", lw=0)
        ax.plot(*lane.centerline.T, color="#9999aa", lw=0.4, ls="--")
    for tl in scenario.traffic_lights:
        c = scenario.lane_graph.lanes[tl.lane_id].centerline[0]
        phase = tl.phase_at(0.0).value
        ax.plot(c[0], c[1], "s", ms=3, color={"Green": "g", "Red": "r", "Yellow": "y"}.get(phase, "k"))
    ex = scenario.expert
    ok = np.isfinite(ex.x) & (ex.t >= 0)
    ax.plot(ex.x[ok], ex.y[ok], "r-", lw=1.5, label="expert (rear axle)")
    v = scenario.vehicle
    for t in np.arange(0.0, scenario.duration + 1e-6, 3.0):
        s = ex.state_at(t)
        if s is None:
            continue
        cx, cy = v.center_from_rear_axle(s.x, s.y, s.heading)
        box = box_corners(cx, cy, s.heading, v.length, v.width)
        ax.fill(box[:, 0], box[:, 1], color="red", alpha=0.25 + 0.05 * t)
    for a in scenario.agents:
        okk = np.isfinite(a.x)
        color = "tab:green" if a.object_class.is_vru else "tab:blue" if a.object_class.value == "vehicle" else "k"
        ax.plot(a.x[okk], a.y[okk], "-", color=color, lw=0.7)
        for t in np.arange(0.0, scenario.duration + 1e-6, 3.0):
            s = a.state_at(t)
            if s is not None:
                box = box_corners(s.x, s.y, s.heading, s.length, s.width)
                ax.fill(box[:, 0], box[:, 1], color=color, alpha=0.25 + 0.05 * t)
    if replay:
        from luna_bridge.sim import LogReplayPlanner, simulate

        e = simulate(scenario, LogReplayPlanner(scenario)).ego_array()
        ax.plot(e[:, 0], e[:, 1], "k:", lw=1.2, label="log replay (LQR + bicycle)")
    xy = np.column_stack([ex.x[ok], ex.y[ok]])
    lo, hi = xy.min(axis=0) - 35.0, xy.max(axis=0) + 35.0
    span = max(hi - lo) / 2
    mid = (lo + hi) / 2
    ax.set_xlim(mid[0] - span, mid[0] + span)
    ax.set_ylim(mid[1] - span, mid[1] + span)
    ax.set_aspect("equal")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{scenario.name}\n{scenario.metadata.get('description', scenario.scenario_type)}"
                 f" (boxes every 3 s, darker = later)", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
