"""Bird's-eye views of a simulation log: a PNG of the whole run and a GIF animation (matplotlib + pillow).

What a reader needs at a glance: lanes (grey, the route's lanes a shade darker, traffic lights on
their lane's first metres), every agent's track (a thin line in its class colour) and box at the
instant shown (vehicles orange, pedestrians red with a ring so that a 1 m box stays visible at road
scale, bicycles purple, static objects grey), the expert's path (dashed green), and the ego's path
coloured by its speed (colour bar in m/s) with its box; white dots every 5 s on the ego's path, and
dots at the same instants on the tracks. Below the map, the ego's and the expert's speed over time,
the ego lane's speed limit and the decisions' top actions. The view fits the ego's and the expert's
paths and the agents that come near the ego (wide for a straight road), so it is not mostly empty.
Given the run's score, at-fault collisions are marked (red X) where they started.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.patches import Polygon as PatchPolygon  # noqa: E402
from PIL import Image  # noqa: E402

from luna_core.lanes import lane_map  # noqa: E402
from luna_core.types import ObjectClass, TrafficLightPhase, box_corners  # noqa: E402

from luna_bridge.scenario import SimulationLog  # noqa: E402

_OBJECT_COLOURS = {ObjectClass.VEHICLE: "tab:orange", ObjectClass.PEDESTRIAN: "tab:red",
                   ObjectClass.BICYCLE: "tab:purple", ObjectClass.STATIC: "dimgray"}
_LIGHT_COLOURS = {TrafficLightPhase.RED: "red", TrafficLightPhase.YELLOW: "gold", TrafficLightPhase.GREEN: "limegreen"}
_SPEED_MAP = "viridis"
_MARGIN = 10.0  # m around the ego's and the expert's paths
_NEAR = 40.0  # m: agents that come this close to the ego are in the view
_MIN_HEIGHT = 30.0  # m: the shortest side of the view
_MAX_ASPECT = 4.0  # widest view (width / height); a longer road gets a taller view than it needs
_MARK_EVERY = 5.0  # s between the time marks on the ego's path and the agents' tracks


def _tracks(log: SimulationLog) -> dict[str, tuple[ObjectClass, np.ndarray]]:
    """Each agent's class and (N, 2) positions over the run (NaN where it is not reported)."""
    n = len(log.objects)
    tracks: dict[str, tuple[ObjectClass, np.ndarray]] = {}
    for k, frame in enumerate(log.objects):
        for obj in frame.objects:
            if not (np.isfinite(obj.x) and np.isfinite(obj.y)):
                continue
            if obj.id not in tracks:
                tracks[obj.id] = (obj.object_class, np.full((n, 2), np.nan))
            tracks[obj.id][1][k] = (obj.x, obj.y)
    return tracks


def _view(log: SimulationLog, tracks: dict) -> tuple[float, float, float, float]:
    """x0, x1, y0, y1 around the ego's and the expert's paths and the agents that come within
    ``_NEAR`` of the ego, at most ``_MAX_ASPECT`` wide."""
    ego = log.ego_array()[:, :2]
    ex = log.scenario.expert
    pts = [ego, np.column_stack([ex.x, ex.y])]
    for _, xy in tracks.values():
        n = min(len(xy), len(ego))
        near = np.hypot(*(xy[:n] - ego[:n]).T) < _NEAR  # NaN (not reported) compares False
        pts.append(xy[:n][near])
    pts = np.vstack(pts)
    pts = pts[np.isfinite(pts).all(axis=1)]
    x0, y0 = pts.min(axis=0) - _MARGIN
    x1, y1 = pts.max(axis=0) + _MARGIN
    w, h = x1 - x0, y1 - y0
    # Equal axes: pad the short side up to the allowed aspect (the long one never shrinks).
    w2, h2 = max(w, h / _MAX_ASPECT, _MIN_HEIGHT), max(h, w / _MAX_ASPECT, _MIN_HEIGHT)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return cx - w2 / 2, cx + w2 / 2, cy - h2 / 2, cy + h2 / 2


def _expert_speed(log: SimulationLog) -> np.ndarray:
    ex = log.scenario.expert
    return np.hypot(ex.vx, ex.vy)


def _lane_limits(log: SimulationLog) -> np.ndarray:
    """The speed limit (m/s) of the ego's lane at each step; NaN where unknown or off the map."""
    lm = lane_map(log.scenario.lane_graph)
    limits = np.full(len(log.ego), np.nan)
    for k, e in enumerate(log.ego):
        match = lm.nearest_lane(e.x, e.y, e.heading)
        if match is not None and lm.graph.lanes[match.lane_id].speed_limit > 0:
            limits[k] = lm.graph.lanes[match.lane_id].speed_limit
    return limits


def _speed_limits(log: SimulationLog) -> tuple[float, float]:
    """The speed colour scale (m/s): 0 to the fastest of the ego and the expert."""
    speeds = np.concatenate([log.ego_array()[:, 3], _expert_speed(log), _lane_limits(log)])
    finite = speeds[np.isfinite(speeds)]
    return 0.0, max(float(finite.max()) if len(finite) else 0.0, 1.0)


def _draw_map(ax: plt.Axes, log: SimulationLog, k: int) -> None:
    lm = lane_map(log.scenario.lane_graph)
    route = set(log.scenario.route.road_ids)
    for lane_id in lm.ids:
        lane = lm.graph.lanes[lane_id]
        ring = np.vstack([lane.left_boundary, lane.right_boundary[::-1]])
        ax.add_patch(PatchPolygon(ring, closed=True, facecolor="0.82" if lane.road_id in route else "0.9",
                                  edgecolor="0.6", linewidth=0.4, zorder=0))
    for light in log.lights[k].lights:
        if light.lane_id in lm.graph.lanes and light.phase in _LIGHT_COLOURS:
            c = lm.centerlines[light.lane_id].points[:3]
            ax.plot(c[:, 0], c[:, 1], color=_LIGHT_COLOURS[light.phase], linewidth=4, zorder=1)


def _marks(log: SimulationLog, k: int) -> list[int]:
    """Steps of the time marks up to step k: every ``_MARK_EVERY`` s after the start."""
    every = max(1, int(round(_MARK_EVERY / max(float(log.t[1] - log.t[0]), 1e-3)))) if len(log.t) > 1 else 1
    return list(range(every, k + 1, every))


def _draw_agents(ax: plt.Axes, log: SimulationLog, k: int, tracks: dict, whole_track: bool) -> set[ObjectClass]:
    """Tracks (the whole run, or up to step k) with dots at the time marks, and boxes at step k;
    returns the classes drawn."""
    drawn: set[ObjectClass] = set()
    marks = _marks(log, len(log.t) - 1 if whole_track else k)
    for cls, xy in tracks.values():
        part = xy if whole_track else xy[: k + 1]
        if np.isfinite(part).all(axis=1).sum() >= 2:
            ax.plot(part[:, 0], part[:, 1], color=_OBJECT_COLOURS[cls], linewidth=0.8, alpha=0.6, zorder=2)
            ax.plot(xy[marks, 0], xy[marks, 1], ".", color=_OBJECT_COLOURS[cls], markersize=5, zorder=2)
            drawn.add(cls)
    for obj in log.objects[k].objects:
        if not obj.is_finite():
            continue
        colour = _OBJECT_COLOURS[obj.object_class]
        corners = box_corners(obj.x, obj.y, obj.heading, obj.length, obj.width)
        ax.add_patch(PatchPolygon(corners, closed=True, facecolor=colour, edgecolor="black", linewidth=0.4,
                                  alpha=0.9, zorder=3))
        if obj.object_class.is_vru:  # a 1 m box vanishes at road scale: ring it
            ax.plot(obj.x, obj.y, "o", markersize=9, markerfacecolor="none", markeredgecolor=colour,
                    markeredgewidth=1.5, zorder=3)
        drawn.add(obj.object_class)
    return drawn


def _draw_ego(ax: plt.Axes, log: SimulationLog, k: int, norm) -> object:
    ego = log.ego_array()
    ex = log.scenario.expert
    ax.plot(ex.x, ex.y, "--", color="tab:green", linewidth=1.0, zorder=2)
    xy = ego[: k + 1, :2]
    segments = np.stack([xy[:-1], xy[1:]], axis=1) if len(xy) > 1 else np.zeros((0, 2, 2))
    ax.plot(xy[:, 0], xy[:, 1], color="black", linewidth=4.2, solid_capstyle="round", zorder=4)  # contrast
    lines = LineCollection(segments, cmap=_SPEED_MAP, norm=norm, linewidth=3.0, capstyle="round", zorder=4)
    lines.set_array(ego[1: k + 1, 3])
    ax.add_collection(lines)
    ax.plot(ego[0, 0], ego[0, 1], "o", color="black", markersize=4, zorder=5)
    for i in _marks(log, k - 1):  # the same instants are dotted on the agents' tracks (not under the box)
        ax.plot(ego[i, 0], ego[i, 1], "o", markerfacecolor="white", markeredgecolor="black", markersize=5, zorder=6)
        ax.annotate(f"{log.t[i] - log.t[0]:.0f} s", (ego[i, 0], ego[i, 1]), textcoords="offset points",
                    xytext=(0, 7), ha="center", fontsize=7, zorder=6)
    vp = log.scenario.vehicle
    e = log.ego[k]
    cx, cy = vp.center_from_rear_axle(e.x, e.y, e.heading)
    ax.add_patch(PatchPolygon(box_corners(cx, cy, e.heading, vp.length, vp.width), closed=True,
                              facecolor="tab:blue", edgecolor="black", linewidth=0.6, zorder=5))
    return lines


def _collision_steps(score) -> list[int]:
    """Steps where an at-fault collision starts, from the metric's time series (none without a score)."""
    if score is None or "no_ego_at_fault_collisions" not in score.metrics:
        return []
    series = score.metrics["no_ego_at_fault_collisions"].time_series or []
    return [i for i, v in enumerate(series) if v]


def _draw_collisions(ax: plt.Axes, log: SimulationLog, k: int, steps: list[int]) -> bool:
    shown = [i for i in steps if i <= k]
    for i in shown:
        e = log.ego[i]
        ax.plot(e.x, e.y, "X", color="red", markeredgecolor="black", markersize=11, zorder=7)
        ax.annotate(f"at-fault collision {log.t[i] - log.t[0]:.1f} s", (e.x, e.y), textcoords="offset points",
                    xytext=(0, -14), ha="center", fontsize=7, color="darkred", zorder=7)
    return bool(shown)


def _legend(ax: plt.Axes, classes: set[ObjectClass], planner: str) -> None:
    handles = [Patch(facecolor="tab:blue", edgecolor="black", label=f"ego ({planner}), path by speed"),
               Line2D([], [], linestyle="--", color="tab:green", label="expert path"),
               Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="black",
                      label=f"every {_MARK_EVERY:.0f} s (dots on tracks)")]
    handles += [Patch(facecolor=_OBJECT_COLOURS[c], edgecolor="black", label=f"{c.value} (box, track)")
                for c in ObjectClass if c in classes]
    # Above the map, never over it.
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=7,
              frameon=False, handlelength=1.5, columnspacing=1.0)


def _draw_speed(ax: plt.Axes, log: SimulationLog, k: int, collision_steps: list[int]) -> None:
    """Ego and expert speed over time up to step k, the decisions' top actions along the top, at-fault
    collisions as red lines."""
    ego = log.ego_array()
    ex = log.scenario.expert
    ax.plot(log.t, _lane_limits(log), color="0.45", linewidth=1.0, drawstyle="steps-post", label="speed limit")
    ax.plot(ex.t, _expert_speed(log), "--", color="tab:green", linewidth=1.0, label="expert")
    ax.plot(log.t[: k + 1], ego[: k + 1, 3], color="tab:blue", linewidth=1.5, label="ego")
    ax.legend(loc="lower left", fontsize=7, framealpha=0.85)
    top = _speed_limits(log)[1] * 1.25
    for t, action in log.decisions:
        if t <= log.t[k] + 1e-9:
            ax.axvline(t, color="0.8", linewidth=0.6, zorder=0)
            ax.text(t, top * 0.96, f" {action}", fontsize=6, va="top", ha="left", color="0.35")
    for i in collision_steps:
        if i <= k:
            ax.axvline(log.t[i], color="red", linewidth=1.2)
    ax.set_xlim(log.t[0], log.t[-1])
    ax.set_ylim(0.0, top)
    ax.set_xlabel("t (s)", fontsize=8)
    ax.set_ylabel("speed (m/s)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


class _Figure:
    """The map above (colour bar at its right), the speed plot below; the size follows the view."""

    def __init__(self, log: SimulationLog, width_in: float, dpi: int) -> None:
        self.log = log
        self.tracks = _tracks(log)
        self.view = _view(log, self.tracks)
        x0, x1, y0, y1 = self.view
        map_h = width_in * 0.93 * (y1 - y0) / (x1 - x0)
        self.fig = plt.figure(figsize=(width_in, map_h + 2.2), dpi=dpi)
        grid = self.fig.add_gridspec(2, 2, height_ratios=[map_h, 1.5], width_ratios=[40, 1], hspace=0.35,
                                     wspace=0.03)
        self.ax = self.fig.add_subplot(grid[0, 0])
        self.cax = self.fig.add_subplot(grid[0, 1])
        self.speed_ax = self.fig.add_subplot(grid[1, 0])
        self.norm = plt.Normalize(*_speed_limits(log))
        cbar = self.fig.colorbar(plt.cm.ScalarMappable(norm=self.norm, cmap=_SPEED_MAP), cax=self.cax)
        cbar.set_label("ego speed (m/s)", fontsize=8)
        cbar.ax.tick_params(labelsize=7)

    def draw(self, k: int, title: str, whole_track: bool, collision_steps: list[int]) -> None:
        ax, log = self.ax, self.log
        ax.clear()
        self.speed_ax.clear()
        _draw_map(ax, log, k)
        classes = _draw_agents(ax, log, k, self.tracks, whole_track)
        _draw_ego(ax, log, k, self.norm)
        _draw_collisions(ax, log, k, collision_steps)
        x0, x1, y0, y1 = self.view
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("x (m)", fontsize=8)
        ax.set_title(f"{title}   t = {log.t[k]:.1f} s", fontsize=10, pad=18)  # the legend sits between
        _legend(ax, classes, log.planner)
        _draw_speed(self.speed_ax, log, k, collision_steps)

    def close(self) -> None:
        plt.close(self.fig)


def render_png(log: SimulationLog, path: Path, title: str = "", score=None) -> Path:
    """The whole run: every track in full, boxes at the last step; with the run's ``ScenarioScore``,
    its at-fault collisions marked where they started."""
    figure = _Figure(log, width_in=10.0, dpi=110)
    figure.draw(len(log.ego) - 1, title or log.scenario.name, whole_track=True,
                collision_steps=_collision_steps(score))
    figure.fig.savefig(path, bbox_inches="tight")
    figure.close()
    return path


def render_gif(log: SimulationLog, path: Path, title: str = "", every: int = 5, score=None) -> Path:
    """One frame every ``every`` steps (0.5 s by default), played at that rate in real time; tracks
    grow with the run."""
    figure = _Figure(log, width_in=10.0, dpi=80)
    collisions = _collision_steps(score)
    frames = []
    for k in list(range(0, len(log.ego), every)) + ([len(log.ego) - 1] if (len(log.ego) - 1) % every else []):
        figure.draw(k, title or log.scenario.name, whole_track=False, collision_steps=collisions)
        figure.fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(figure.fig.canvas.buffer_rgba())[..., :3]))
    figure.close()
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(every * 100), loop=0)
    return path
