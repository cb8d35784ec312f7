"""Scripted traffic for the synthetic suite: the expert ego and the agents driven jointly.

Every vehicle follows a fixed path (its lanes, with any lane change blended in) and chooses its
speed along it with IDM behind whatever is ahead on that path (vehicles, pedestrians), stopping at
red lights and at scripted stop points, and yielding at path crossings to road users of higher
priority. A vehicle may instead follow a scripted speed profile (a lead that brakes hard, a
stalled car, a car reversing out of a pickup bay). Pedestrians walk scripted paths. The result is
sampled every 0.1 s from ``T_START`` (-2 s, so the ego log carries a history) to the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import shapely

from luna_core.idm import IDMParameters, idm_acceleration
from luna_core.lanes import Polyline, lane_map
from luna_core.types import LaneGraph, ObjectClass, TrafficLightPhase, VehicleParameters

from luna_bridge.scenario import SIM_DT, AgentTrack, TrafficLightTimeline

T_START = -2.0
#: A calm human driver (the expert) and ordinary traffic.
HUMAN = IDMParameters(target_velocity=13.0, min_gap=3.0, headway=1.4, accel_max=1.4, decel_max=2.5, exponent=4.0)
TRAFFIC = IDMParameters(target_velocity=13.0, min_gap=2.0, headway=1.2, accel_max=1.5, decel_max=3.0, exponent=4.0)
LEADER_RANGE = 80.0  # m of path searched for a leader
EMERGENCY_DECEL = 6.0  # m/s^2: the most a scripted driver brakes when IDM asks for more


def smoothstep(x: np.ndarray) -> np.ndarray:
    """Quintic 0 -> 1 with zero first and second derivatives at both ends."""
    x = np.clip(x, 0.0, 1.0)
    return x ** 3 * (10 - 15 * x + 6 * x ** 2)


def lane_path(graph: LaneGraph, lane_ids: list[str]) -> tuple[Polyline, dict[str, float]]:
    """The joined centreline of ``lane_ids`` and the arc length at which each lane starts."""
    lm = lane_map(graph)
    starts, s = {}, 0.0
    for lane_id in lane_ids:
        starts[lane_id] = s
        s += lm.centerlines[lane_id].length
    return lm.route_centerline(lane_ids), starts


def lane_change_path(source: Polyline, target: Polyline, s_start: float, length: float) -> Polyline:
    """``source`` until ``s_start``, a smooth lateral blend over ``length`` metres onto ``target``,
    then ``target`` onwards."""
    s = np.arange(0.0, s_start + length, 1.0)
    a = source.interpolate(s)[:, :2]
    b_proj = target.project(a)
    b = target.interpolate(b_proj.s)[:, :2]
    w = smoothstep((s - s_start) / length)[:, None]
    blended = (1 - w) * a + w * b
    s_b_end = float(b_proj.s[-1])
    rest = target.points[target.s > s_b_end + 0.5]
    return Polyline(np.vstack([blended, rest]))


@dataclass
class Vehicle:
    """A scripted vehicle. ``s0`` is the arc length of its reference point (box centre for agents,
    rear axle for the ego) on ``path`` at ``T_START``."""

    id: str
    path: Polyline
    s0: float
    v0: float
    length: float = 4.6
    width: float = 1.9
    target_velocity: float = 13.0
    params: IDMParameters = TRAFFIC
    priority: int = 1  # lower yields to higher at path crossings
    speed_profile: Callable[[float], float] | None = None  # scripted speed v(t) instead of IDM
    stops: list[tuple[float, float, float]] = field(default_factory=list)  # (s of the front, from t, until t)
    lights: list[tuple[float, TrafficLightTimeline]] = field(default_factory=list)  # (stop s, light)
    is_ego: bool = False
    rear_offset: float = 0.0  # for the ego: rear axle -> box centre distance
    appear: float = T_START  # the vehicle exists from this time
    object_class: ObjectClass = ObjectClass.VEHICLE
    reverse: bool = False  # moves backwards along its path (heading = path heading)
    lateral_accel_max: float = 3.0  # m/s^2: slows down for curves ahead to keep within this
    ignore: set[str] = field(default_factory=set)  # ids it is scripted to pass (not leaders)
    # state
    s: float = 0.0
    v: float = 0.0

    def centre_s(self) -> float:
        return self.s + self.rear_offset

    def front_s(self) -> float:
        return self.centre_s() + self.length / 2


@dataclass
class Pedestrian:
    id: str
    path: Polyline
    start_time: float  # starts walking
    speed: float = 1.3
    appear: float = T_START
    length: float = 0.6
    width: float = 0.6
    s: float = 0.0
    object_class: ObjectClass = ObjectClass.PEDESTRIAN


def _conflicts(a: Polyline, b: Polyline) -> tuple[float, float] | None:
    """Arc lengths on ``a`` and ``b`` of their first crossing at an angle (shared stretches of
    the same lane and tangent merges are not crossings), if any."""
    inter = shapely.LineString(a.points).intersection(shapely.LineString(b.points))
    if inter.is_empty:
        return None
    parts = getattr(inter, "geoms", [inter])
    pts = np.array([g.coords[0] for g in parts if g.geom_type == "Point"])
    if len(pts) == 0:
        return None
    pa, pb = a.project(pts), b.project(pts)
    crossing = np.abs(np.sin(pa.heading - pb.heading)) > 0.3
    if not crossing.any():
        return None
    k = int(np.flatnonzero(crossing)[np.argmin(pa.s[crossing])])
    return float(pa.s[k]), float(pb.s[k])


def curve_speed_caps(path: Polyline, lateral_accel_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Arc lengths every metre along ``path`` and the highest speed that keeps the lateral
    acceleration within ``lateral_accel_max`` there."""
    s = np.arange(0.0, path.length + 1.0, 1.0)
    h = np.unwrap(path.interpolate(s)[:, 2])
    kappa = np.abs(np.gradient(h, s)) if len(s) > 2 else np.zeros_like(s)
    return s, np.sqrt(lateral_accel_max / np.maximum(kappa, 1e-4))


def curve_speed(caps: tuple[np.ndarray, np.ndarray], here: float, decel: float = 2.0,
                horizon: float = 60.0) -> float:
    """Highest speed at arc length ``here`` from which every curve speed in the next ``horizon``
    metres can be reached braking at ``decel``."""
    s, cap = caps
    window = (s >= here) & (s <= here + horizon)
    if not window.any():
        return math.inf
    return float(np.min(np.sqrt(cap[window] ** 2 + 2.0 * decel * (s[window] - here))))


class TrafficScript:
    """Runs all scripted road users jointly; ``run(duration)`` returns their tracks."""

    def __init__(self, vehicles: list[Vehicle], pedestrians: list[Pedestrian] | None = None) -> None:
        self.vehicles = vehicles
        self.pedestrians = pedestrians or []
        for v in vehicles:
            v.s, v.v = v.s0, v.v0
        self._caps: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for p in self.pedestrians:
            p.s = 0.0
        users = list(vehicles) + list(self.pedestrians)
        # (i yields to j): conflict arc lengths on each path.
        self._yield: list[tuple[Vehicle, object, float, float]] = []
        for vi in vehicles:
            if vi.speed_profile is not None:
                continue
            for uj in users:
                if uj is vi:
                    continue
                pj = uj.priority if isinstance(uj, Vehicle) else 99
                if pj <= vi.priority:
                    continue
                c = _conflicts(vi.path, uj.path)
                if c is not None:
                    self._yield.append((vi, uj, c[0], c[1]))
        self._yield_by: dict[str, list[tuple[Vehicle, object, float, float]]] = {}
        for entry in self._yield:
            self._yield_by.setdefault(entry[0].id, []).append(entry)

    # -- per-step helpers ---------------------------------------------------------------------------

    def _poses(self) -> dict[str, tuple[float, float, float]]:
        """Box-centre poses of everyone, one interpolation per shared path (streams share lanes)."""
        groups: dict[int, list[Vehicle | Pedestrian]] = {}
        for u in self.vehicles + self.pedestrians:
            groups.setdefault(id(u.path), []).append(u)
        out = {}
        for members in groups.values():
            s = np.array([u.centre_s() if isinstance(u, Vehicle) else u.s for u in members])
            xyh = members[0].path.interpolate(s)
            for u, row in zip(members, xyh):
                out[u.id] = (float(row[0]), float(row[1]), float(row[2]))
        return out

    def _present(self, u: Vehicle | Pedestrian, t: float) -> bool:
        return t + 1e-9 >= u.appear

    def _leaders(self, t: float, poses: dict[str, tuple[float, float, float]]) -> dict[str, tuple[float, float]]:
        """Gap (front to rear, m) and speed of the nearest road user ahead on each IDM vehicle's
        path. Vehicles sharing a path (a lane's traffic) share one projection of everyone."""
        users = [u for u in self.vehicles + self.pedestrians if self._present(u, t)]
        drivers = [v for v in self.vehicles if self._present(v, t) and v.speed_profile is None]
        out: dict[str, tuple[float, float]] = {}
        if not users or not drivers:
            return out
        xyh = np.array([poses[u.id] for u in users])
        widths = np.array([u.width for u in users])
        lengths = np.array([u.length for u in users])
        speeds = np.array([u.v if isinstance(u, Vehicle) else 0.0 for u in users])
        pad = np.array([0.3 if isinstance(u, Pedestrian) else 0.0 for u in users])
        index = {u.id: k for k, u in enumerate(users)}
        groups: dict[int, list[Vehicle]] = {}
        for v in drivers:
            groups.setdefault(id(v.path), []).append(v)
        for members in groups.values():
            path = members[0].path
            p = path.project(xyh[:, :2])
            here = np.array([v.centre_s() for v in members])[:, None]  # (M, 1)
            ahead = p.s[None, :] - here  # (M, U)
            half_w = (widths[None, :] + np.array([v.width for v in members])[:, None]) / 2 + pad[None, :]
            ok = (np.abs(p.lateral)[None, :] <= half_w) & (ahead > 0.0) & (ahead <= LEADER_RANGE) & \
                 (p.distance[None, :] <= half_w + 0.5)
            for m, v in enumerate(members):
                ok[m, index[v.id]] = False
                for other in v.ignore:
                    if other in index:
                        ok[m, index[other]] = False
            gaps = np.where(ok, ahead - (lengths[None, :] + np.array([v.length for v in members])[:, None]) / 2,
                            np.inf)
            best = np.argmin(gaps, axis=1)
            for m, v in enumerate(members):
                k = int(best[m])
                if not np.isfinite(gaps[m, k]):
                    out[v.id] = (math.inf, 0.0)
                else:
                    out[v.id] = (float(gaps[m, k]), max(speeds[k] * math.cos(xyh[k, 2] - float(p.heading[k])), 0.0))
        return out

    def _curve_speed(self, v: Vehicle) -> float:
        caps = self._caps.get(v.id)
        if caps is None:
            caps = self._caps[v.id] = curve_speed_caps(v.path, v.lateral_accel_max)
        return curve_speed(caps, v.centre_s())

    def _stop_gap(self, v: Vehicle, t: float) -> float:
        """Distance from the front to the nearest active stop (light, scripted stop, yield)."""
        gap = math.inf
        front = v.front_s()
        for s_stop, light in v.lights:
            phase = light.phase_at(t)
            d = s_stop - front
            if phase is TrafficLightPhase.RED and d > -1.0:
                gap = min(gap, max(d, 0.0))
            elif phase is TrafficLightPhase.YELLOW and d > v.v ** 2 / (2 * 3.0):
                gap = min(gap, d)  # stop on yellow only when it can be done comfortably
        for s_stop, t_from, t_until in v.stops:
            if t_from <= t < t_until and s_stop - front > -1.0:
                gap = min(gap, max(s_stop - front, 0.0))
        for vi, uj, s_i, s_j in self._yield_by.get(v.id, ()):
            if not self._present(uj, t):
                continue
            stop_line = s_i - v.width / 2 - 2.5 - v.length / 2 - v.rear_offset
            d = stop_line - v.s
            if d < -0.5:
                continue  # already committed past the yield line
            if isinstance(uj, Pedestrian):
                dist_j = s_j - uj.s
                walking = t >= uj.start_time
                arrive = dist_j / uj.speed if walking else (uj.start_time - t) + dist_j / uj.speed
                conflict = -1.5 < dist_j and (arrive < 4.0)
            else:
                dist_j = s_j - uj.centre_s()
                arrive = dist_j / max(uj.v, 1.0)
                conflict = -(uj.length / 2 + v.width + 1.0) < dist_j and arrive < 5.0
            if conflict:
                gap = min(gap, max(d, 0.0))
        return gap

    # -- main loop ----------------------------------------------------------------------------------

    def run(self, duration: float) -> dict[str, np.ndarray]:
        """Simulate from T_START to ``duration``; returns id -> (T, 5) rows (x, y, heading, vx, vy)
        of the reference point (ego: rear axle; others: box centre), NaN before ``appear``."""
        n = int(round((duration - T_START) / SIM_DT)) + 1
        out = {u.id: np.full((n, 5), np.nan) for u in self.vehicles + self.pedestrians}
        for k in range(n):
            t = T_START + k * SIM_DT
            poses = self._poses()
            for u in self.vehicles + self.pedestrians:
                if not self._present(u, t):
                    continue
                if isinstance(u, Vehicle):
                    s_ref = u.s
                    x, y, h = u.path.interpolate(s_ref)
                    sign = -1.0 if u.reverse else 1.0
                    out[u.id][k] = (x, y, h, sign * u.v * math.cos(h), sign * u.v * math.sin(h))
                    if not u.is_ego:
                        out[u.id][k, :3] = poses[u.id]
                else:
                    x, y, h = poses[u.id]
                    speed = u.speed if t >= u.start_time and u.s < u.path.length else 0.0
                    out[u.id][k] = (x, y, h, speed * math.cos(h), speed * math.sin(h))
            # advance
            accels = {}
            leaders = self._leaders(t, poses)
            for v in self.vehicles:
                if v.id not in leaders:
                    continue
                gap, lead_v = leaders[v.id]
                stop = self._stop_gap(v, t)
                if stop < gap:
                    gap, lead_v = stop, 0.0
                target = min(v.target_velocity, self._curve_speed(v))
                a = float(idm_acceleration(v.v, gap, lead_v, v.params, target))
                if gap < math.inf and a <= -v.params.decel_max + 1e-9:
                    # IDM clips at b; a human brakes harder when it must: solve for a stop at the gap.
                    need = v.v ** 2 / (2 * max(gap - 0.5, 0.3))
                    a = -min(max(need, v.params.decel_max), EMERGENCY_DECEL)
                accels[v.id] = a
            for v in self.vehicles:
                if not self._present(v, t):
                    continue
                if v.speed_profile is not None:
                    v_next = v.speed_profile(t + SIM_DT)
                    v.s += (-1.0 if v.reverse else 1.0) * 0.5 * (v.v + v_next) * SIM_DT
                    v.v = v_next
                else:
                    v_next = max(v.v + accels[v.id] * SIM_DT, 0.0)
                    v.s += 0.5 * (v.v + v_next) * SIM_DT
                    v.v = v_next
            for p in self.pedestrians:
                if t >= p.start_time and p.s < p.path.length:
                    p.s = min(p.s + p.speed * SIM_DT, p.path.length)
        return out


def to_track(rows: np.ndarray, track_id: str, object_class: ObjectClass, length: float, width: float,
             t0: float = T_START, start: float | None = None) -> AgentTrack:
    """An ``AgentTrack`` from ``run`` rows, optionally cut to begin at time ``start``."""
    t = t0 + SIM_DT * np.arange(len(rows))
    if start is not None:
        keep = t >= start - 1e-9
        rows, t = rows[keep], t[keep]
    t = np.round(t, 6)
    return AgentTrack(track_id, object_class, length, width, t, rows[:, 0].copy(), rows[:, 1].copy(),
                      rows[:, 2].copy(), rows[:, 3].copy(), rows[:, 4].copy())


def ego_vehicle(path: Polyline, s0: float, v0: float, vehicle: VehicleParameters = VehicleParameters(),
                **kwargs: object) -> Vehicle:
    """The expert ego as a scripted vehicle (its path is followed by the rear axle)."""
    return Vehicle("ego", path, s0, v0, length=vehicle.length, width=vehicle.width, is_ego=True,
                   rear_offset=vehicle.rear_axle_to_center, params=HUMAN, **kwargs)  # type: ignore[arg-type]
