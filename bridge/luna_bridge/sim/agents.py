"""Reactive agents: logged vehicles handed to IDM (nuPlan's reactive agents).

A vehicle becomes reactive the first time it is present within ``radius`` of the ego (100 m, as in
nuPlan); until then, and for pedestrians, bicycles, static objects and vehicles that reverse in their
log, the log is replayed (open loop). A reactive vehicle keeps to the path it drove in its log
(its lanes, including any lane change it made; the logged positions that move it forward: see
``driven_path``), and IDM sets its speed along that path, with
target velocity = its highest logged speed (so an unobstructed agent keeps its logged pace and a
parked one stays parked). Leaders are the ego and every other object whose centre lies ahead on
that path within the two half-widths; a red light on a lane the path enters is a stopped leader at
the lane's start. It leaves the scene when its log ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from luna_core.idm import NUPLAN_AGENT, IDMParameters, idm_step
from luna_core.lanes import MIN_SEGMENT, Polyline
from luna_core.types import (LaneGraph, ObjectClass, TrackedObject, TrafficLightPhase, TrafficLights,
                             VehicleParameters, wrap_angle)

from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario

LOOKAHEAD = 60.0  # m of path searched for a leader
_MIN_PATH = 1.0  # m; logs shorter than this are parked vehicles: replayed
END_CHORD = 0.5  # m: a path's last segment follows its chord over at least this much of it
END_TOLERANCE = math.radians(10.0)  # a last segment further off that heading is jitter


@dataclass
class _IDMAgent:
    track: AgentTrack
    path: Polyline
    target_velocity: float
    stop_lines: list[tuple[str, float]]  # (light lane id, s on the path)
    s: float = 0.0
    v: float = 0.0
    active: bool = False


def _reverses(track: AgentTrack) -> bool:
    ok = np.isfinite(track.x)
    along = track.vx[ok] * np.cos(track.heading[ok]) + track.vy[ok] * np.sin(track.heading[ok])
    return bool(np.any(along < -0.3))


def driven_path(track: AgentTrack, min_step: float = MIN_SEGMENT) -> Polyline | None:
    """The path a vehicle drove, or None for a parked one (less than ``_MIN_PATH``): its logged
    positions in order, each kept only if it lies at least ``min_step`` metres ahead of the last kept
    one along its logged heading, and its end straightened (``straight_end``).

    Recorded positions jitter by centimetres around a standstill, sometimes backwards or sideways (19
    of the 27 CommonRoad files step backwards). On the raw points such a step turns the path round, and
    past the path's end IDM extrapolates along the last segment: an agent whose log ended on one drove
    backwards into the traffic behind it (USA_US101-4_1_T-1, reactive: two agents turned round). A
    driven log moves forward at every step and ends straight, so its points all stay (the synthetic
    suites' paths are unchanged, bit for bit)."""
    ok = np.isfinite(track.x)
    xy = np.column_stack([track.x[ok], track.y[ok]])
    heading = track.heading[ok]
    kept = [0]
    for i in range(1, len(xy)):
        d = xy[i] - xy[kept[-1]]
        if d[0] * math.cos(heading[i]) + d[1] * math.sin(heading[i]) >= min_step:
            kept.append(i)
    if len(kept) < 2:
        return None
    path = straight_end(Polyline(xy[kept]))
    return path if path.length >= _MIN_PATH else None


def straight_end(path: Polyline, chord: float = END_CHORD, tolerance: float = END_TOLERANCE) -> Polyline:
    """``path`` with its last vertices dropped back to the last one at least ``chord`` metres before the
    end where the last segment deviates from that chord by more than ``tolerance`` rad: a stop's
    centimetre step of jitter, which would set the heading past the end (extrapolation follows the last
    segment). A path whose last segment follows its chord is returned as it is."""
    back = max(int(np.searchsorted(path.s, path.length - chord, side="right")) - 1, 0)
    d = path.points[-1] - path.points[back]
    last = path.points[-1] - path.points[-2]
    if abs(wrap_angle(math.atan2(last[1], last[0]) - math.atan2(d[1], d[0]))) <= tolerance:
        return path
    return Polyline(np.vstack([path.points[:back + 1], path.points[-1:]]))


def _stop_lines(path: Polyline, graph: LaneGraph, light_lanes: set[str]) -> list[tuple[str, float]]:
    """Where the path enters each light-controlled lane (start within 1.5 m and same heading)."""
    out = []
    for lane_id in light_lanes:
        start = graph.lanes[lane_id].centerline[0]
        p = path.project(start)
        lane_heading = math.atan2(*(graph.lanes[lane_id].centerline[1] - start)[::-1])
        if float(p.distance) < 1.5 and math.cos(float(p.heading) - lane_heading) > 0.7 and float(p.s) > 0:
            out.append((lane_id, float(p.s)))
    return out


class ReactiveAgents:
    """Steps the scenario's agents in reactive mode; call ``objects(t, ego)`` once per 0.1 s step."""

    def __init__(self, scenario: Scenario, params: IDMParameters = NUPLAN_AGENT, radius: float = 100.0) -> None:
        self.scenario = scenario
        self.params = params
        self.radius = radius
        light_lanes = {tl.lane_id for tl in scenario.traffic_lights}
        self._agents: dict[str, _IDMAgent] = {}
        for track in scenario.agents:
            if track.object_class is not ObjectClass.VEHICLE or _reverses(track):
                continue
            path = driven_path(track)
            if path is None:
                continue
            ok = np.isfinite(track.x)
            speeds = np.hypot(track.vx[ok], track.vy[ok])
            self._agents[track.id] = _IDMAgent(track, path, float(speeds.max()),
                                               _stop_lines(path, scenario.lane_graph, light_lanes))
        self._last_t: float | None = None
        self._current: dict[str, TrackedObject] = {}

    def objects(self, t: float, ego_box: TrackedObject, lights: TrafficLights) -> list[TrackedObject]:
        """Objects at time ``t`` (advancing reactive agents from the previous call by one step)."""
        logged = {a.id: a.state_at(t) for a in self.scenario.agents}
        current: dict[str, TrackedObject] = {}
        if self._last_t is not None:
            self._advance(ego_box, lights)
        self._last_t = t
        for agent_id, state in logged.items():
            agent = self._agents.get(agent_id)
            if agent is None:
                if state is not None:
                    current[agent_id] = state
                continue
            if state is None and not agent.active:
                continue
            if agent.track.index_at(t) is None and agent.track.t[-1] < t:
                continue  # its log has ended: it leaves the scene
            if not agent.active and state is not None and \
                    math.hypot(state.x - ego_box.x, state.y - ego_box.y) <= self.radius:
                agent.active = True
                agent.s = float(agent.path.project(np.array([state.x, state.y])).s)
                agent.v = state.speed
            if agent.active:
                x, y, h = agent.path.interpolate(agent.s)
                current[agent_id] = TrackedObject(agent_id, ObjectClass.VEHICLE, float(x), float(y), float(h),
                                                  agent.v * math.cos(h), agent.v * math.sin(h),
                                                  agent.track.length, agent.track.width)
            elif state is not None:
                current[agent_id] = state
        self._current = current
        return list(current.values())

    def _advance(self, ego_box: TrackedObject, lights: TrafficLights) -> None:
        """One IDM step for every active agent, leaders taken from the previous step's scene."""
        others = list(self._current.values()) + [ego_box]
        red = {tl.lane_id for tl in lights.lights if tl.phase is TrafficLightPhase.RED}
        active = [a for a in self._agents.values() if a.active]
        if not active:
            return
        centres = np.array([[o.x, o.y] for o in others])
        gaps, lead_v = np.full(len(active), np.inf), np.zeros(len(active))
        for k, agent in enumerate(active):
            p = agent.path.project(centres)
            ahead = p.s - agent.s
            widths = np.array([o.width for o in others]) / 2 + agent.track.width / 2
            lengths = np.array([o.length for o in others]) / 2 + agent.track.length / 2
            mask = (ahead > 0.0) & (ahead < LOOKAHEAD) & (np.abs(p.lateral) < widths) & \
                   np.array([o.id != agent.track.id for o in others])
            if np.any(mask):
                j = np.flatnonzero(mask)[np.argmin(ahead[mask])]
                gaps[k] = ahead[j] - lengths[j]
                o = others[j]
                lead_v[k] = max(o.vx * math.cos(p.heading[j]) + o.vy * math.sin(p.heading[j]), 0.0)
            for lane_id, s_stop in agent.stop_lines:
                # Stop for red unless the front is already past the line (then clearing is safer).
                gap = s_stop - agent.s - agent.track.length / 2
                if lane_id in red and gap > -0.5 and gap < gaps[k]:
                    gaps[k], lead_v[k] = max(gap, 0.0), 0.0
        s, v = idm_step(np.array([a.s for a in active]), np.array([a.v for a in active]), gaps, lead_v,
                        self.params, SIM_DT, np.array([a.target_velocity for a in active]))
        for agent, s_k, v_k in zip(active, s, v):
            agent.s, agent.v = float(s_k), float(v_k)


def ego_box(x: float, y: float, heading: float, velocity: float, vehicle: VehicleParameters) -> TrackedObject:
    """The ego as a tracked object (box centre), for agents that react to it."""
    cx, cy = vehicle.center_from_rear_axle(x, y, heading)
    return TrackedObject("ego", ObjectClass.VEHICLE, cx, cy, heading, velocity * math.cos(heading),
                         velocity * math.sin(heading), vehicle.length, vehicle.width)
