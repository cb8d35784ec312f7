"""CommonRoad XML scenarios (commonroad-io 2022.1) as ``Scenario`` objects.

Conversion:

* the lanelet network -> ``LaneGraph`` through ``luna_core.maps.commonroad`` (the same conversion the
  ``map_server`` node uses for a vehicle's CommonRoad map; see there).
* dynamic obstacles -> ``AgentTrack`` (box centre, heading, speed along the heading) at the file's
  0.1 s steps; static obstacles -> ``static`` tracks over the whole scenario.
* planning problem -> the ego's initial state (CommonRoad gives the vehicle's reference point; it is
  taken as the box centre and moved to the rear axle), the route (roads from the initial lanelet
  to the goal region's lanelets over successors and neighbours, shortest by length) and the goal
  pose (centre of the goal region).
* the expert: CommonRoad planning problems carry no ego log. The expert here is a calm IDM driver
  (``traffic.HUMAN``) following the route's centreline from the initial state behind the recorded
  traffic, with a lane change blended in when the goal lies in a neighbouring lane. It is a
  reference drive for the progress metric and the log-replay row, not a recorded human; its 2 s of
  history run back at the initial speed along the lane.
* duration: up to the goal's latest time step or the last recorded state, whichever is later.

A file that is not CommonRoad XML raises ``CommonRoadError`` (``luna_core.maps.commonroad``) naming the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from luna_core.idm import idm_acceleration
from luna_core.lanes import Polyline, lane_map
from luna_core.maps.commonroad import CommonRoadError, lane_graph_from_network, open_commonroad
from luna_core.types import EgoState, LaneGraph, ObjectClass, Route, VehicleParameters

from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario
from luna_bridge.scenarios.traffic import HUMAN, curve_speed, curve_speed_caps, lane_change_path

VEHICLE = VehicleParameters()
HISTORY = 2.0  # s


_CLASSES = {"PEDESTRIAN": ObjectClass.PEDESTRIAN, "BICYCLE": ObjectClass.BICYCLE,
            "MOTORCYCLE": ObjectClass.VEHICLE, "CAR": ObjectClass.VEHICLE, "TRUCK": ObjectClass.VEHICLE,
            "BUS": ObjectClass.VEHICLE, "PRIORITY_VEHICLE": ObjectClass.VEHICLE, "TAXI": ObjectClass.VEHICLE,
            "TRAIN": ObjectClass.VEHICLE, "PARKED_VEHICLE": ObjectClass.STATIC}


def _object_class(obstacle_type: object) -> ObjectClass:
    return _CLASSES.get(getattr(obstacle_type, "name", str(obstacle_type)), ObjectClass.STATIC)


# --------------------------------------------------------------------------------------------------
# Route and expert
# --------------------------------------------------------------------------------------------------


def _route_lanes(graph: LaneGraph, start: str, goals: set[str]) -> list[tuple[str, bool]]:
    """Shortest lane sequence from ``start`` to a goal lane; each entry says whether it was reached
    by a lane change (neighbour) rather than a successor. Falls back to the longest successor chain."""
    import heapq

    lm = lane_map(graph)
    heap = [(0.0, 0, [(start, False)])]
    seen: set[str] = set()
    tie = 0
    while heap:
        cost, _, path = heapq.heappop(heap)
        lane_id = path[-1][0]
        if lane_id in goals:
            return path
        if lane_id in seen:
            continue
        seen.add(lane_id)
        lane = graph.lanes[lane_id]
        for nxt in lane.successors:
            tie += 1
            heapq.heappush(heap, (cost + lm.centerlines[nxt].length, tie, path + [(nxt, False)]))
        for nb in (lane.left_neighbor, lane.right_neighbor):
            if nb and not path[-1][1]:  # no two lane changes in a row
                tie += 1
                heapq.heappush(heap, (cost + 20.0, tie, path + [(nb, True)]))
    chain = [start]
    while graph.lanes[chain[-1]].successors and len(chain) < 50:
        nxt = graph.lanes[chain[-1]].successors[0]
        if nxt in chain:
            break
        chain.append(nxt)
    return [(c, False) for c in chain]


def _expert_path(graph: LaneGraph, sequence: list[tuple[str, bool]], start_xy: np.ndarray) -> Polyline:
    """The centreline of ``sequence``, with each lane change blended over 40 m (or what is left)."""
    lm = lane_map(graph)
    runs: list[list[str]] = [[]]
    for lane_id, changed in sequence:
        if changed:
            runs.append([])
        runs[-1].append(lane_id)
    path = lm.route_centerline(runs[0])
    for run in runs[1:]:
        # Continue the target lane backwards by its predecessors so the blend has room.
        first = graph.lanes[run[0]]
        lanes = ([first.predecessors[0]] if first.predecessors else []) + run
        target = lm.route_centerline(lanes)
        s_here = float(path.project(target.points[0]).s) if len(lanes) > len(run) else 0.0
        s_start = max(float(path.project(start_xy).s) + 5.0, s_here)
        length = max(min(40.0, path.length - s_start), 10.0)
        path = lane_change_path(path, target, s_start, length)
    return path


def _expert_track(path: Polyline, s0: float, v0: float, speed_limit: float, agents: list[AgentTrack],
                  duration: float) -> AgentTrack:
    """IDM along ``path`` (rear axle at arc length s0) behind the recorded agents."""
    d = VEHICLE.rear_axle_to_center
    n_hist = int(round(HISTORY / SIM_DT))
    n = n_hist + int(round(duration / SIM_DT)) + 1
    s = np.zeros(n)
    v = np.zeros(n)
    s[:n_hist + 1] = s0 + v0 * SIM_DT * np.arange(-n_hist, 1)
    v[:n_hist + 1] = v0
    target = max(speed_limit, v0, 1.0)
    caps = curve_speed_caps(path, 3.0)  # slow for turns like a calm driver (3 m/s^2 lateral)
    for k in range(n_hist, n - 1):
        t = (k - n_hist) * SIM_DT
        objs = [a.state_at(t) for a in agents]
        objs = [o for o in objs if o is not None]
        gap, lead_v = math.inf, 0.0
        if objs:
            xy = np.array([[o.x, o.y] for o in objs])
            p = path.project(xy)
            ahead = p.s - (s[k] + d)
            half_w = np.array([o.width for o in objs]) / 2 + VEHICLE.width / 2
            ok = (ahead > 0) & (ahead < 80.0) & (np.abs(p.lateral) < half_w)
            if ok.any():
                gaps = np.where(ok, ahead - (np.array([o.length for o in objs]) + VEHICLE.length) / 2, np.inf)
                j = int(np.argmin(gaps))
                gap = float(gaps[j])
                lead_v = max(objs[j].vx * math.cos(p.heading[j]) + objs[j].vy * math.sin(p.heading[j]), 0.0)
        a = float(idm_acceleration(v[k], gap, lead_v, HUMAN, min(target, curve_speed(caps, s[k] + d))))
        v[k + 1] = max(v[k] + a * SIM_DT, 0.0)
        s[k + 1] = s[k] + 0.5 * (v[k] + v[k + 1]) * SIM_DT
    poses = path.interpolate(s)
    t = -HISTORY + SIM_DT * np.arange(n)
    return AgentTrack("ego", ObjectClass.VEHICLE, VEHICLE.length, VEHICLE.width, np.round(t, 6), poses[:, 0],
                      poses[:, 1], poses[:, 2], v * np.cos(poses[:, 2]), v * np.sin(poses[:, 2]))


# --------------------------------------------------------------------------------------------------
# Obstacles
# --------------------------------------------------------------------------------------------------


def _dynamic_track(obstacle: object, n_steps: int, dt: float) -> AgentTrack:
    states = [obstacle.initial_state]
    if obstacle.prediction is not None and hasattr(obstacle.prediction, "trajectory"):
        states += list(obstacle.prediction.trajectory.state_list)
    data = np.full((5, n_steps), np.nan)
    for st in states:
        k = int(st.time_step)
        if 0 <= k < n_steps:
            h = float(st.orientation)
            speed = float(getattr(st, "velocity", 0.0) or 0.0)
            data[:, k] = (st.position[0], st.position[1], h, speed * math.cos(h), speed * math.sin(h))
    shape = obstacle.obstacle_shape
    length = float(getattr(shape, "length", 2 * getattr(shape, "radius", 0.5)))
    width = float(getattr(shape, "width", 2 * getattr(shape, "radius", 0.5)))
    return AgentTrack(str(obstacle.obstacle_id), _object_class(obstacle.obstacle_type), length, width,
                      np.round(np.arange(n_steps) * dt, 6), *data)


def _static_track(obstacle: object, n_steps: int, dt: float) -> AgentTrack:
    st = obstacle.initial_state
    shape = obstacle.obstacle_shape
    ones = np.ones(n_steps)
    return AgentTrack(str(obstacle.obstacle_id), ObjectClass.STATIC, float(getattr(shape, "length", 1.0)),
                      float(getattr(shape, "width", 1.0)), np.round(np.arange(n_steps) * dt, 6),
                      st.position[0] * ones, st.position[1] * ones, float(st.orientation) * ones,
                      0.0 * ones, 0.0 * ones)


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def load_commonroad(path: str | Path) -> Scenario:
    """Read one CommonRoad XML file (its first planning problem) as a ``Scenario``."""
    path = Path(path)
    cr, problems = open_commonroad(path)
    if abs(cr.dt - SIM_DT) > 1e-9:
        raise CommonRoadError(f"{path}: time step {cr.dt} s, the simulator needs {SIM_DT} s")
    if not problems.planning_problem_dict:
        raise CommonRoadError(f"{path}: no planning problem")
    pp_id = sorted(problems.planning_problem_dict)[0]
    pp = problems.planning_problem_dict[pp_id]
    graph = lane_graph_from_network(cr.lanelet_network)
    if not graph.lanes:
        raise CommonRoadError(f"{path}: the lanelet network is empty")

    goal_steps = [int(getattr(g.time_step, "end", 0)) for g in pp.goal.state_list if getattr(g, "time_step", None)]
    last_obstacle = 0
    for o in cr.dynamic_obstacles:
        if o.prediction is not None and hasattr(o.prediction, "trajectory"):
            last_obstacle = max(last_obstacle, int(o.prediction.trajectory.final_state.time_step))
    n_steps = max(goal_steps + [last_obstacle, 10]) + 1
    duration = round((n_steps - 1) * SIM_DT, 6)
    agents = [_dynamic_track(o, n_steps, SIM_DT) for o in cr.dynamic_obstacles]
    agents += [_static_track(o, n_steps, SIM_DT) for o in cr.static_obstacles]
    agents = [a for a in agents if np.isfinite(a.x).any()]

    init = pp.initial_state
    heading = float(init.orientation)
    v0 = float(getattr(init, "velocity", 0.0) or 0.0)
    rx, ry = VEHICLE.rear_axle_from_center(float(init.position[0]), float(init.position[1]), heading)
    lm = lane_map(graph)
    start = lm.nearest_lane(float(init.position[0]), float(init.position[1]), heading, max_distance=15.0)
    if start is None:
        raise CommonRoadError(f"{path}: the ego's initial position is not near any lanelet")

    goal_xy = None
    goal_lanes: set[str] = set()
    goal_state = pp.goal.state_list[0]
    pos = getattr(goal_state, "position", None)
    if pos is not None:
        shapes = getattr(pos, "shapes", [pos])
        centres = [np.asarray(sh.shapely_object.centroid.coords[0], dtype=np.float64) for sh in shapes
                   if getattr(sh, "shapely_object", None) is not None]
        if centres:
            goal_xy = np.mean(centres, axis=0)
            goal_lanes = {m.lane_id for m in lm.match_lanes(float(goal_xy[0]), float(goal_xy[1]), max_distance=3.0)}
    if pp.goal.lanelets_of_goal_position:
        for ids in pp.goal.lanelets_of_goal_position.values():
            goal_lanes |= {str(i) for i in ids}
    sequence = _route_lanes(graph, start.lane_id, goal_lanes - {start.lane_id} or goal_lanes) if goal_lanes \
        else _route_lanes(graph, start.lane_id, set())
    # Keep driving past the goal: extend the route along successors so planners have road ahead.
    tail = sequence[-1][0]
    for _ in range(5):
        succ = graph.lanes[tail].successors
        if not succ:
            break
        tail = succ[0]
        sequence.append((tail, False))
    road_ids = lm.route_roads([lane_id for lane_id, _ in sequence])

    drive = _expert_path(graph, sequence, np.array([rx, ry]))
    s0 = float(drive.project(np.array([rx, ry])).s)
    limit = graph.lanes[start.lane_id].speed_limit
    expert = _expert_track(drive, s0, v0, limit, agents, duration)
    ego = EgoState(0.0, rx, ry, heading, v0, float(getattr(init, "acceleration", 0.0) or 0.0),
                   float(getattr(init, "yaw_rate", 0.0) or 0.0))
    if goal_xy is not None:
        goal_heading = float(drive.interpolate(float(drive.project(goal_xy).s))[2])
        route = Route(0.0, road_ids, float(goal_xy[0]), float(goal_xy[1]), goal_heading)
    else:
        route = Route(0.0, road_ids)
    tags = sorted(getattr(t, "value", str(t)) for t in (getattr(cr, "tags", None) or ()))
    return Scenario(name=path.stem, scenario_type="commonroad", lane_graph=graph,
                    route=route, ego_initial=ego, expert=expert, agents=agents, duration=duration,
                    source="commonroad", vehicle=VEHICLE,
                    metadata={"file": path.name, "benchmark_id": str(cr.scenario_id), "planning_problem": pp_id,
                              "tags": tags, "expert": "IDM along the route (no ego log in CommonRoad)"})

