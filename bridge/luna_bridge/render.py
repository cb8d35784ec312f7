"""Bird's-eye views of a simulation log: a PNG of the whole run and a GIF animation (matplotlib + pillow).

Lanes are drawn as grey polygons, the ego's driven path in blue with the expert's in dashed green,
objects as boxes (vehicles orange, VRUs red, static grey); lights colour their lane's first metres.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Polygon as PatchPolygon  # noqa: E402
from PIL import Image  # noqa: E402

from luna_core.lanes import lane_map  # noqa: E402
from luna_core.types import ObjectClass, TrafficLightPhase, box_corners  # noqa: E402

from luna_bridge.scenario import SimulationLog  # noqa: E402

_OBJECT_COLOURS = {ObjectClass.VEHICLE: "tab:orange", ObjectClass.PEDESTRIAN: "tab:red",
                   ObjectClass.BICYCLE: "tab:red", ObjectClass.STATIC: "dimgray"}
_LIGHT_COLOURS = {TrafficLightPhase.RED: "red", TrafficLightPhase.YELLOW: "gold", TrafficLightPhase.GREEN: "limegreen"}


def _draw_frame(ax: plt.Axes, log: SimulationLog, k: int, view: tuple[float, float, float, float],
                title: str) -> None:
    ax.clear()
    lm = lane_map(log.scenario.lane_graph)
    for lane_id in lm.ids:
        lane = lm.graph.lanes[lane_id]
        ring = np.vstack([lane.left_boundary, lane.right_boundary[::-1]])
        ax.add_patch(PatchPolygon(ring, closed=True, facecolor="0.9", edgecolor="0.7", linewidth=0.5))
    for light in log.lights[k].lights:
        if light.lane_id in lm.graph.lanes and light.phase in _LIGHT_COLOURS:
            c = lm.centerlines[light.lane_id].points[:3]
            ax.plot(c[:, 0], c[:, 1], color=_LIGHT_COLOURS[light.phase], linewidth=4)
    ex = log.scenario.expert
    ax.plot(ex.x, ex.y, "--", color="tab:green", linewidth=1, label="expert")
    ego = log.ego_array()
    ax.plot(ego[: k + 1, 0], ego[: k + 1, 1], color="tab:blue", linewidth=1.5, label=log.planner)
    for obj in log.objects[k].objects:
        if obj.is_finite():
            corners = box_corners(obj.x, obj.y, obj.heading, obj.length, obj.width)
            ax.add_patch(PatchPolygon(corners, closed=True, facecolor=_OBJECT_COLOURS[obj.object_class], alpha=0.8))
    vp = log.scenario.vehicle
    e = log.ego[k]
    cx, cy = vp.center_from_rear_axle(e.x, e.y, e.heading)
    ax.add_patch(PatchPolygon(box_corners(cx, cy, e.heading, vp.length, vp.width), closed=True,
                              facecolor="tab:blue", alpha=0.9))
    ax.set_xlim(view[0], view[1])
    ax.set_ylim(view[2], view[3])
    ax.set_aspect("equal")
    ax.set_title(f"{title}  t = {log.t[k]:.1f} s", fontsize=8)
    ax.legend(loc="upper right", fontsize=6)


def _view(log: SimulationLog, margin: float = 25.0) -> tuple[float, float, float, float]:
    ego = log.ego_array()
    x0, x1 = ego[:, 0].min() - margin, ego[:, 0].max() + margin
    y0, y1 = ego[:, 1].min() - margin, ego[:, 1].max() + margin
    half = max(x1 - x0, y1 - y0) / 2  # square view around the driven path
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    return cx - half, cx + half, cy - half, cy + half


def render_png(log: SimulationLog, path: Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    _draw_frame(ax, log, len(log.ego) - 1, _view(log), title or log.scenario.name)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def render_gif(log: SimulationLog, path: Path, title: str = "", every: int = 5) -> Path:
    """One frame every ``every`` steps (0.5 s by default), played at that rate in real time."""
    fig, ax = plt.subplots(figsize=(5, 5), dpi=80)
    view = _view(log)
    frames = []
    for k in range(0, len(log.ego), every):
        _draw_frame(ax, log, k, view, title or log.scenario.name)
        fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]))
    plt.close(fig)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(every * 100), loop=0)
    return path
