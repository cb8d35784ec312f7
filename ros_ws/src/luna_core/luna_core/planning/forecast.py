"""Constant-velocity forecast of the tracked objects, plus red lights as obstacles (PDM-Closed).

Objects within 50 m of the ego are moved at their current speed along their heading every ``dt``,
or against it when their velocity points backwards (a car reversing out of a bay: PDM-Closed's object
manager flips the heading when the velocity is more than 90 deg off it). PDM-Closed forecasts at
0.2 s; the scorer here works at 0.1 s, so the forecast does too. The
nearest objects are kept up to PDM-Closed's caps per class (50 vehicles, 25 pedestrians,
10 bicycles, 50 static objects). A red (or yellow, treated the same: the ego should not enter)
light controlling a lane of the ego's route lane sequence becomes a static obstacle filling the
first metres of that lane, unless the ego is already in that lane.
"""

from __future__ import annotations

import math

import numpy as np

from luna_core.lanes import LaneMap
from luna_core.planning.scorer import ObjectBoxes
from luna_core.types import ObjectClass, PlannerInput, TrafficLightPhase, TrackedObject, usable_objects

FORECAST_RADIUS = 50.0  # m
CLASS_CAPS = {ObjectClass.VEHICLE: 50, ObjectClass.PEDESTRIAN: 25, ObjectClass.BICYCLE: 10,
              ObjectClass.STATIC: 50}
RED_LIGHT_DEPTH = 2.0  # m of the controlled lane blocked by a red light
STOP_PHASES = (TrafficLightPhase.RED, TrafficLightPhase.YELLOW)


def select_objects(planner_input: PlannerInput, radius: float = FORECAST_RADIUS) -> list[TrackedObject]:
    """Objects (``usable_objects``: unknown sizes get default footprints) within ``radius`` of the ego rear
    axle, nearest first, capped per class."""
    ego = planner_input.ego
    objs = usable_objects(planner_input.objects.objects).objects
    dist = [math.hypot(o.x - ego.x, o.y - ego.y) for o in objs]
    order = sorted((d, objs[k].id, k) for k, d in enumerate(dist) if d <= radius)  # id breaks ties: deterministic
    kept: list[TrackedObject] = []
    counts = {c: 0 for c in CLASS_CAPS}
    for _, _, k in order:
        c = objs[k].object_class
        if counts[c] < CLASS_CAPS[c]:
            counts[c] += 1
            kept.append(objs[k])
    return kept


def red_light_obstacles(planner_input: PlannerInput, lanes: LaneMap,
                        route_lane_ids: list[str]) -> list[tuple[str, float, float, float, float, float]]:
    """(id, x, y, heading, length, width) boxes at the entry of route lanes behind a red light."""
    stop = {tl.lane_id for tl in planner_input.traffic_lights.lights if tl.phase in STOP_PHASES}
    out = []
    for k, lane_id in enumerate(route_lane_ids):
        if lane_id not in stop or k == 0 or lane_id not in lanes.graph.lanes:
            continue  # k == 0: the ego is already in the controlled lane and must clear it
        line = lanes.centerlines[lane_id]
        depth = min(RED_LIGHT_DEPTH, line.length)
        x, y, h = line.interpolate(depth / 2)
        out.append((f"red_light:{lane_id}", float(x), float(y), float(h), depth,
                    max(lanes.graph.lanes[lane_id].width, 1.0)))
    return out


def constant_velocity_forecast(planner_input: PlannerInput, lanes: LaneMap, route_lane_ids: list[str],
                               steps: int, dt: float = 0.1,
                               radius: float = FORECAST_RADIUS) -> ObjectBoxes:
    """Boxes of the selected objects and red-light obstacles at ``steps`` times 0, dt, ..."""
    objs = select_objects(planner_input, radius)
    lights = red_light_obstacles(planner_input, lanes, route_lane_ids)
    n = len(objs) + len(lights)
    if n == 0:
        return ObjectBoxes.empty(steps)
    t = np.arange(steps) * dt
    x0 = np.array([o.x for o in objs] + [b[1] for b in lights])
    y0 = np.array([o.y for o in objs] + [b[2] for b in lights])
    h = np.array([o.heading for o in objs] + [b[3] for b in lights])
    static = np.array([o.object_class is ObjectClass.STATIC for o in objs] + [True] * len(lights))
    speed = np.array([o.speed for o in objs] + [0.0] * len(lights))
    speed = np.where(static, 0.0, speed)
    backwards = np.array([o.vx * math.cos(o.heading) + o.vy * math.sin(o.heading) < 0.0 for o in objs]
                         + [False] * len(lights))
    travel = np.where(backwards, h + math.pi, h)  # direction of motion; the box keeps its heading
    pose = np.empty((n, steps, 3))
    pose[..., 0] = x0[:, None] + speed[:, None] * np.cos(travel)[:, None] * t[None]
    pose[..., 1] = y0[:, None] + speed[:, None] * np.sin(travel)[:, None] * t[None]
    pose[..., 2] = h[:, None]
    size = np.array([[o.length, o.width] for o in objs] + [[b[4], b[5]] for b in lights]).reshape(n, 2)
    red = np.array([False] * len(objs) + [True] * len(lights))
    return ObjectBoxes([o.id for o in objs] + [b[0] for b in lights], pose, size, speed, static, red)
