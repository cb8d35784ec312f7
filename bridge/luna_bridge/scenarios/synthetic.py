"""The synthetic scenario suite: nuPlan's 14 Test14 scenario types on procedural roads.

Each generator draws one scene from a seeded ``numpy.random.Generator``: a road layout, the expert
ego's plan (lanes, lane changes, speed) and the other road users' scripts. ``hard`` draws the
long-tail variants (stalled or slow vehicles that need a lane change, cut-ins, pedestrians stepping
out, a vehicle reversing out of a pickup bay, dense junction traffic, deadlocks); otherwise the
ordinary variant. ``realise`` drives everyone jointly (``traffic``), cuts the logs to 0..15 s and
checks the expert: no collision with anyone and every ego corner within 0.3 m of the drivable area;
a draw that fails is rejected and the next seed offset is tried (the accepted offset is recorded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import shapely

from luna_core.lanes import Polyline, lane_map
from luna_core.types import (EgoState, LaneGraph, ObjectClass, Route, TrafficLightPhase, VehicleParameters,
                             box_corners)

from luna_bridge.scenario import SIM_DT, Scenario, TrafficLightTimeline
from luna_bridge.scenarios.roads import LANE_WIDTH, Junction, Road, four_way_junction, multilane_road
from luna_bridge.scenarios.traffic import (T_START, Pedestrian, TrafficScript, Vehicle, ego_vehicle,
                                           lane_change_path, lane_path, to_track)

SCENARIO_TYPES: tuple[str, ...] = (
    "behind_long_vehicle", "changing_lane", "following_lane_with_lead", "high_lateral_acceleration",
    "high_magnitude_speed", "low_magnitude_speed", "near_multiple_vehicles", "starting_left_turn",
    "starting_right_turn", "starting_straight_traffic_light_intersection_traversal",
    "stationary_in_traffic", "stopping_with_lead", "traversing_pickup_dropoff",
    "waiting_for_pedestrian_to_cross")
# Seed bases, kept apart: hard and random are the evaluation splits; train feeds the teacher (memory bank,
# distillation); reflect is for reflection rounds (failures found there update the bank before evaluation).
SPLITS: dict[str, int] = {"hard": 1000, "random": 2000, "train": 3000, "reflect": 4000}
MAX_ATTEMPTS = 30
# Seeds of a split stay inside [base * 1000, base * 1000 + 14 * 100 * MAX_ATTEMPTS): index < 100.
MAX_INDEX = 99
DURATION = 15.0
VEHICLE = VehicleParameters()
DRIVABLE_TOLERANCE = 0.3  # m, nuPlan's drivable-area tolerance
RELEVANT_RADIUS = 100.0  # m; agents never this close to the ego are left out of the files


class GenerationError(RuntimeError):
    """No valid draw was found for a scenario within the allowed attempts."""


@dataclass
class Draft:
    graph: LaneGraph
    route: list[str]
    vehicles: list[Vehicle]
    pedestrians: list[Pedestrian] = field(default_factory=list)
    lights: list[TrafficLightTimeline] = field(default_factory=list)
    description: str = ""


# --------------------------------------------------------------------------------------------------
# Helpers shared by the generators
# --------------------------------------------------------------------------------------------------


def _road_path(road: Road, lane: int) -> Polyline:
    return lane_path(road.graph, road.lane_sequence(lane))[0]


def _car(rng: np.random.Generator, vid: str, path: Polyline, s: float, v: float, **kw: object) -> Vehicle:
    length = float(rng.uniform(4.2, 5.2))
    kw.setdefault("target_velocity", max(v, 0.1))
    return Vehicle(vid, path, s, v, length=length, width=float(rng.uniform(1.8, 2.0)), **kw)  # type: ignore[arg-type]


def _stream(rng: np.random.Generator, prefix: str, path: Polyline, s_from: float, s_to: float, v: float,
            spacing: tuple[float, float], avoid: list[tuple[float, float]] = (), **kw: object) -> list[Vehicle]:
    """Cars along ``path`` between arc lengths s_from..s_to at random spacing, skipping ``avoid``
    intervals (to leave gaps around scripted users)."""
    out, s, k = [], s_from, 0
    while s < s_to:
        if not any(a <= s <= b for a, b in avoid):
            out.append(_car(rng, f"{prefix}{k}", path, s, v * float(rng.uniform(0.9, 1.05)), **kw))
            k += 1
        s += float(rng.uniform(*spacing))
    return out


def _const(v: float) -> Callable[[float], float]:
    return lambda t: v


def _brake_profile(v0: float, t_brake: float, decel: float, v_end: float = 0.0) -> Callable[[float], float]:
    return lambda t: v0 if t < t_brake else max(v0 - decel * (t - t_brake), v_end)


def _light_cycle(green_first: bool, switch: float, yellow: float = 3.0, all_red: float = 1.0) -> tuple[
        list[float], list[TrafficLightPhase], list[float], list[TrafficLightPhase]]:
    """Two-phase timelines (phase A, phase B): A starts green and turns yellow at ``switch``
    (B green after the all-red), or the reverse when ``green_first`` is False."""
    g, y, r = TrafficLightPhase.GREEN, TrafficLightPhase.YELLOW, TrafficLightPhase.RED
    a_times, a_phases = [T_START, switch, switch + yellow], [g, y, r]
    b_times, b_phases = [T_START, switch + yellow + all_red], [r, g]
    if green_first:
        return a_times, a_phases, b_times, b_phases
    return b_times, b_phases, a_times, a_phases


def _junction_lights(j: Junction, ns_green_first: bool, switch: float) -> list[TrafficLightTimeline]:
    ns_t, ns_p, ew_t, ew_p = _light_cycle(ns_green_first, switch)
    out = []
    for (src, _dst), lanes in sorted(j.connectors.items()):
        times, phases = (ns_t, ns_p) if src in ("S", "N") else (ew_t, ew_p)
        out += [TrafficLightTimeline(lane, list(times), list(phases)) for lane in lanes]
    return out


def _light_stops(j: Junction, lanes: list[str], lights: list[TrafficLightTimeline],
                 starts: dict[str, float]) -> list[tuple[float, TrafficLightTimeline]]:
    by_lane = {tl.lane_id: tl for tl in lights}
    return [(starts[lane], by_lane[lane]) for lane in lanes if lane in by_lane]


def _junction_vehicle(rng: np.random.Generator, vid: str, j: Junction, lights: list[TrafficLightTimeline],
                      src: str, turn: str, lane: int, s: float, v: float, priority: int = 2, ego: bool = False,
                      **kw: object) -> Vehicle:
    """A vehicle approaching the junction from ``src`` (``s`` m along its incoming lane at T_START)
    making movement ``turn`` from incoming lane ``lane``; it stops for red at the connector."""
    dst = j.movement(src, turn)
    connectors = [c for c in j.connectors[(src, dst)] if c.endswith(str(lane))]
    if not connectors:
        raise ValueError(f"no {turn} connector from {src} lane {lane}")
    conn = connectors[0]
    out_lane = j.graph.lanes[conn].successors[0]
    lanes = [j.incoming[src][lane], conn, out_lane]
    path, starts = lane_path(j.graph, lanes)
    stops = _light_stops(j, lanes, lights, starts)
    if ego:
        return ego_vehicle(path, s, v, VEHICLE, lights=stops, priority=priority, target_velocity=kw.pop("target_velocity", 12.0),
                           **kw)
    return _car(rng, vid, path, s, v, lights=stops, priority=priority, **kw)


def _straight_road(rng: np.random.Generator, n_lanes: int, speed_limit: float, length: float = 500.0,
                   curve: float = 0.0, oncoming: int = 0, pickup: tuple[float, float] | None = None) -> Road:
    pieces = [(length, 0.0)] if curve == 0.0 else [(120.0, 0.0), (abs(1.2 / curve), curve), (length, 0.0)]
    return multilane_road(n_lanes, length, speed_limit, pieces, oncoming_lanes=oncoming, pickup=pickup)


# --------------------------------------------------------------------------------------------------
# The 14 scenario types
# --------------------------------------------------------------------------------------------------


def following_lane_with_lead(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(2, 4))
    road = _straight_road(rng, n, 15.6, curve=float(rng.choice([0.0, 0.0, 1 / 200])))
    lane = int(rng.integers(0, n))
    path = _road_path(road, lane)
    v = float(rng.uniform(7.0, 12.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=14.0)
    gap = float(rng.uniform(18.0, 35.0))
    lead_s = 40.0 + gap + 6.0
    vehicles = [ego]
    if hard:
        # The lead brakes hard to a stop and stays (a breakdown); the expert changes lanes around it.
        side = lane - 1 if lane > 0 else lane + 1
        t_brake = float(rng.uniform(1.0, 3.0))
        vehicles.append(_car(rng, "lead", path, lead_s, v, speed_profile=_brake_profile(v, t_brake, 4.5)))
        lc_start = 40.0 + v * (t_brake + 2.5) - 10.0
        ego.path = lane_change_path(path, _road_path(road, side), lc_start, 45.0)
        ego.target_velocity = v
        vehicles += _stream(rng, "adj", _road_path(road, side), 0.0, 400.0, v, (30.0, 50.0),
                            avoid=[(lc_start - 50.0, lc_start + 120.0)], target_velocity=v)
        desc = "lead vehicle brakes hard and stalls; the expert changes lanes around it"
    else:
        vehicles.append(_car(rng, "lead", path, lead_s, v * 0.95, target_velocity=v * float(rng.uniform(0.85, 1.0))))
        for other in range(n):
            if other != lane:
                vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 0.0, 350.0, v, (25.0, 45.0),
                                    target_velocity=v)
        desc = "following a lead vehicle in the same lane"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def stopping_with_lead(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(2, 4))
    road = _straight_road(rng, n, 13.4)
    lane = int(rng.integers(0, n))
    path = _road_path(road, lane)
    v = float(rng.uniform(7.0, 11.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=13.0)
    lead_s = 40.0 + float(rng.uniform(20.0, 30.0)) + 6.0
    t_brake = float(rng.uniform(1.0, 4.0))
    decel = float(rng.uniform(4.0, 5.5)) if hard else float(rng.uniform(1.5, 2.5))
    vehicles = [ego, _car(rng, "lead", path, lead_s, v, speed_profile=_brake_profile(v, t_brake, decel))]
    if hard:
        # A second car stops right in front of the lead: a queue building fast.
        vehicles.append(_car(rng, "lead2", path, lead_s + 12.0, v, speed_profile=_brake_profile(v, t_brake - 0.5, decel)))
    for other in range(n):
        if other != lane:
            vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 0.0, 300.0, v, (25.0, 45.0),
                                target_velocity=v)
    return Draft(road.graph, road.road_ids(), vehicles,
                 description="lead vehicle brakes " + ("hard " if hard else "") + "to a stop; the expert stops behind")


def behind_long_vehicle(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(2, 4))
    road = _straight_road(rng, n, 13.4)
    lane = int(rng.integers(0, n))
    path = _road_path(road, lane)
    v = float(rng.uniform(6.0, 9.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=11.0)
    truck_len = float(rng.uniform(11.0, 18.0))
    truck_s = 40.0 + float(rng.uniform(15.0, 22.0)) + truck_len / 2 + 3.0
    vehicles = [ego]
    if hard:
        # A bus stops at a stop for longer than the scenario: the expert overtakes in the next lane.
        side = lane - 1 if lane > 0 else lane + 1
        t_stop = float(rng.uniform(0.5, 2.0))
        vehicles.append(Vehicle("truck", path, truck_s, v, length=truck_len, width=2.6,
                                speed_profile=_brake_profile(v, t_stop, 2.0)))
        lc = 40.0 + v * (t_stop + 3.0) - 5.0
        ego.path = lane_change_path(path, _road_path(road, side), lc, 40.0)
        ego.target_velocity = v
        vehicles += _stream(rng, "adj", _road_path(road, side), 0.0, 300.0, v, (35.0, 55.0),
                            avoid=[(lc - 50.0, lc + 110.0)], target_velocity=v)
        desc = "a bus stops ahead for a long time; the expert overtakes it"
    else:
        vehicles.append(Vehicle("truck", path, truck_s, v, length=truck_len, width=2.6,
                                target_velocity=v * float(rng.uniform(0.8, 1.0))))
        for other in range(n):
            if other != lane:
                vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 0.0, 300.0, v * 1.1, (25.0, 45.0),
                                    target_velocity=v * 1.1)
        desc = "following a long vehicle"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def changing_lane(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(2, 4))
    road = _straight_road(rng, n, 15.6)
    lane = int(rng.integers(0, n))
    side = lane - 1 if lane > 0 and (lane == n - 1 or rng.random() < 0.5) else lane + 1
    v = float(rng.uniform(8.0, 13.0))
    lc = 40.0 + v * float(rng.uniform(3.0, 5.0))
    length = float(rng.uniform(40, 60))
    ego = ego_vehicle(lane_change_path(_road_path(road, lane), _road_path(road, side), lc, length), 40.0, v,
                      target_velocity=v)
    vehicles = [ego]
    t_merge = (lc - 40.0) / v  # from T_START; the target-lane gap has to be there then
    if hard:
        # Dense target lane: the expert merges into the one gap, away from a slow car ahead.
        v_tgt = v * 0.9
        shift = v_tgt * t_merge
        vehicles += _stream(rng, "tgt", _road_path(road, side), 0.0, 400.0, v_tgt, (14.0, 20.0),
                            avoid=[(lc - 25.0 - shift, lc + length + 15.0 - shift)], target_velocity=v_tgt)
        vehicles.append(_car(rng, "slow", _road_path(road, lane), 40.0 + float(rng.uniform(45, 60)), v * 0.6,
                             target_velocity=v * 0.6))
        desc = "lane change into a gap of a dense lane, away from a slow car"
    else:
        shift = v * t_merge
        vehicles += _stream(rng, "tgt", _road_path(road, side), 0.0, 400.0, v, (35.0, 60.0),
                            avoid=[(lc - 40.0 - shift, lc + length + 30.0 - shift)], target_velocity=v)
        desc = "a lane change on a multi-lane road"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def high_lateral_acceleration(rng: np.random.Generator, hard: bool) -> Draft:
    radius = float(rng.uniform(35.0, 60.0))
    sign = float(rng.choice([-1.0, 1.0]))
    n = int(rng.integers(1, 3))
    road = multilane_road(n, 400.0, 15.6, [(60.0, 0.0), (radius * 1.5, sign / radius), (300.0, 0.0)])
    lane = int(rng.integers(0, n))
    path = _road_path(road, lane)
    v = math.sqrt(float(rng.uniform(2.0, 3.2)) * radius)  # 2..3.2 m/s^2 lateral in the curve
    ego = ego_vehicle(path, 20.0, v, target_velocity=v, lateral_accel_max=4.0)
    vehicles = [ego]
    if hard:
        # A slow vehicle hidden in the curve.
        vehicles.append(_car(rng, "slow", path, 20.0 + float(rng.uniform(70.0, 95.0)), v * 0.4, target_velocity=v * 0.4))
        desc = "a sharp curve with a slow vehicle inside it"
    else:
        vehicles.append(_car(rng, "lead", path, 20.0 + float(rng.uniform(45.0, 70.0)), v, target_velocity=v))
        desc = "a sharp curve at speed"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def high_magnitude_speed(rng: np.random.Generator, hard: bool) -> Draft:
    n = 3
    road = _straight_road(rng, n, 29.0, length=700.0, curve=float(rng.choice([0.0, 1 / 600])))
    lane = int(rng.integers(0, n))
    v = float(rng.uniform(20.0, 26.0))
    path = _road_path(road, lane)
    ego = ego_vehicle(path, 60.0, v, target_velocity=v)
    vehicles = [ego]
    if hard:
        side = lane - 1 if lane > 0 else lane + 1
        stall_s = 60.0 + float(rng.uniform(150.0, 200.0))
        vehicles.append(_car(rng, "stalled", path, stall_s, 0.0, speed_profile=_const(0.0)))
        lc = stall_s - float(rng.uniform(110.0, 130.0))
        ego.path = lane_change_path(path, _road_path(road, side), lc, 70.0)
        vehicles += _stream(rng, "adj", _road_path(road, side), 0.0, 650.0, v, (60.0, 90.0),
                            avoid=[(lc - 120.0, lc + 250.0)], target_velocity=v)
        desc = "a stalled vehicle in the lane at highway speed; the expert changes lanes early"
    else:
        for other in range(n):
            if other != lane:
                vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 0.0, 650.0, v, (50.0, 80.0),
                                    target_velocity=v)
        vehicles.append(_car(rng, "lead", path, 60.0 + float(rng.uniform(50.0, 70.0)), v, target_velocity=v))
        desc = "highway driving at high speed"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def low_magnitude_speed(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(2, 4))
    road = _straight_road(rng, n, 13.4, length=300.0)
    lane = int(rng.integers(0, n))
    path = _road_path(road, lane)
    v = float(rng.uniform(1.0, 3.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=4.0)
    vehicles = [ego]
    period = float(rng.uniform(5.0, 8.0))
    creep = (lambda t: max(0.0, v * 1.2 * math.sin(2 * math.pi * (t + 2.0) / period))) if hard else _const(v)
    vehicles.append(_car(rng, "lead", path, 40.0 + 12.0, v, speed_profile=creep))
    for other in range(n):
        if other != lane:
            vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 10.0, 200.0, v, (9.0, 13.0),
                                target_velocity=v * 1.2)
    return Draft(road.graph, road.road_ids(), vehicles,
                 description="stop-and-go congestion" if hard else "slow congested traffic")


def near_multiple_vehicles(rng: np.random.Generator, hard: bool) -> Draft:
    n = 3
    road = _straight_road(rng, n, 15.6)
    lane = 1
    path = _road_path(road, lane)
    v = float(rng.uniform(5.0, 9.0))
    ego = ego_vehicle(path, 60.0, v, target_velocity=v)
    vehicles = [ego]
    vehicles += _stream(rng, "same", path, 0.0, 300.0, v, (14.0, 20.0), avoid=[(45.0, 78.0)], target_velocity=v)
    for other in (0, 2):
        vehicles += _stream(rng, f"l{other}_", _road_path(road, other), 0.0, 300.0, v, (11.0, 16.0),
                            target_velocity=v)
    if hard:
        # A car from the left lane cuts in just ahead of the ego.
        t_cut = float(rng.uniform(1.0, 3.0))
        s_cut = 60.0 + 12.0 + v * (t_cut + 2.0)
        cut_path = lane_change_path(_road_path(road, 0), path, s_cut, 25.0)
        vehicles = [u for u in vehicles if not (u.id.startswith("l0_") and abs(u.s0 - 72.0) < 14.0)]
        vehicles.append(_car(rng, "cutin", cut_path, 72.0, v * 1.15, target_velocity=v * 1.15))
        desc = "dense traffic on all lanes with a close cut-in"
    else:
        desc = "dense traffic on all lanes"
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def _junction_traffic(rng: np.random.Generator, j: Junction, lights: list[TrafficLightTimeline], dense: bool,
                      exclude: set[str]) -> list[Vehicle]:
    """Cross and oncoming traffic queued or flowing on the arms other than ``exclude``."""
    out: list[Vehicle] = []
    for arm in ("S", "E", "N", "W"):
        if arm in exclude:
            continue
        for lane in range(2):
            count = int(rng.integers(2, 5)) if dense else int(rng.integers(0, 3))
            s = j.arm_length - float(rng.uniform(5.0, 15.0)) - 6.0
            for k in range(count):
                turn = "straight" if rng.random() < 0.7 else ("left" if lane == 0 else "right")
                v = float(rng.uniform(6.0, 10.0))
                out.append(_junction_vehicle(rng, f"{arm}{lane}_{k}", j, lights, arm, turn, lane, s, v,
                                             priority=1 if turn == "left" else 2, target_velocity=10.0))
                s -= float(rng.uniform(12.0, 22.0))
    return out


def starting_left_turn(rng: np.random.Generator, hard: bool) -> Draft:
    j = four_way_junction()
    lights = _junction_lights(j, True, switch=12.0)
    v = float(rng.uniform(0.0, 6.0))
    ego = _junction_vehicle(rng, "ego", j, lights, "S", "left", 0, j.arm_length - 25.0 - v * 2.0, v,
                            priority=1, ego=True, target_velocity=9.0)
    oncoming = []
    s = j.arm_length - float(rng.uniform(10.0, 40.0))
    for k in range(int(rng.integers(4, 7)) if hard else int(rng.integers(1, 3))):
        oncoming.append(_junction_vehicle(rng, f"on{k}", j, lights, "N", "straight", int(rng.integers(0, 2)), s,
                                          10.0, priority=2, target_velocity=11.0))
        s -= float(rng.uniform(12.0, 20.0)) if hard else float(rng.uniform(30.0, 50.0))
    return Draft(j.graph, j.route("S", j.movement("S", "left")), [ego] + oncoming, lights=lights,
                 description="unprotected left turn through " + ("dense " if hard else "") + "oncoming traffic")


def starting_right_turn(rng: np.random.Generator, hard: bool) -> Draft:
    j = four_way_junction()
    lights = _junction_lights(j, True, switch=12.0)
    v = float(rng.uniform(0.0, 6.0))
    ego = _junction_vehicle(rng, "ego", j, lights, "S", "right", 1, j.arm_length - 25.0 - v * 2.0, v,
                            priority=1, ego=True, target_velocity=8.0)
    vehicles: list[Vehicle] = [ego]
    peds = []
    if hard:
        # A pedestrian crosses the exit arm just as the ego turns; a car waits beyond it.
        x = j.half_size + 3.0
        peds.append(Pedestrian("ped0", Polyline([[x, -12.0], [x, 2.0]]), start_time=float(rng.uniform(0.0, 2.5)),
                               speed=float(rng.uniform(1.1, 1.5))))
        desc = "right turn across a pedestrian crossing the exit"
    else:
        desc = "right turn at a signalised junction"
    vehicles += _junction_traffic(rng, j, lights, dense=hard, exclude={"S", "E"})
    return Draft(j.graph, j.route("S", j.movement("S", "right")), vehicles, peds, lights, desc)


def starting_straight_traffic_light_intersection_traversal(rng: np.random.Generator, hard: bool) -> Draft:
    j = four_way_junction()
    switch = float(rng.uniform(1.0, 4.0))
    green_first = rng.random() < 0.5 and not hard
    # Either green throughout the approach, or red turning green after ``switch`` + 4 s.
    lights = _junction_lights(j, green_first, switch=12.0 if green_first else switch)
    v = float(rng.uniform(6.0, 10.0))
    ego = _junction_vehicle(rng, "ego", j, lights, "S", "straight", int(rng.integers(0, 2)),
                            j.arm_length - 30.0 - v * 2.0, v, priority=2, ego=True, target_velocity=11.0)
    vehicles = [ego] + _junction_traffic(rng, j, lights, dense=hard, exclude={"S"})
    return Draft(j.graph, j.route("S", "N"), vehicles, lights=lights,
                 description=("dense " if hard else "") + "straight traversal of a signalised junction")


def stationary_in_traffic(rng: np.random.Generator, hard: bool) -> Draft:
    j = four_way_junction()
    green_at = float(rng.uniform(3.0, 7.0))
    lights = _junction_lights(j, False, switch=green_at - 4.0)  # S red until green_at
    lane = int(rng.integers(0, 2))
    queue = int(rng.integers(2, 5))
    stop_line = j.arm_length
    vehicles: list[Vehicle] = []
    s = stop_line - 3.5
    for k in range(queue):
        car = _junction_vehicle(rng, f"q{k}", j, lights, "S", "straight", lane, s, 0.0, priority=2,
                                target_velocity=10.0)
        if hard and k == queue - 1:
            # The car right in front of the ego has broken down: it never moves again.
            car.id = "broken_down"
            car.speed_profile = _const(0.0)
        vehicles.append(car)
        s -= car.length + float(rng.uniform(2.0, 3.0))
    # The expert stopped further back behind a car it could see was not moving.
    ego_s = s - VEHICLE.rear_axle_to_center - (10.0 if hard else 0.5)
    side = 1 - lane
    ego = _junction_vehicle(rng, "ego", j, lights, "S", "straight", lane, ego_s, 0.0, priority=2, ego=True,
                            target_velocity=10.0)
    side_route = [j.incoming["S"][side], j.connectors[("S", "N")][side], j.outgoing["N"][side]]
    side_path, side_starts = lane_path(j.graph, side_route)
    if hard:
        src, _ = lane_path(j.graph, [j.incoming["S"][lane]])
        ego.path = lane_change_path(src, side_path, ego_s, 12.0)
        ego.lights = _light_stops(j, side_route, lights, side_starts)
        ego.target_velocity = 6.0
        ego.ignore = {"broken_down"}
        ego.stops = [(ego_s + VEHICLE.front_length + 0.5, T_START, green_at + 1.5)]
        desc = "queued at a red light behind a broken-down car; the expert changes lanes once it is green"
    else:
        desc = "stationary in a queue at a red light that turns green"
    vehicles.append(ego)
    adjacent = _stream(rng, "adj", side_path, 20.0, stop_line - 4.0, 0.0, (9.0, 12.0), target_velocity=10.0,
                       lights=_light_stops(j, side_route, lights, side_starts))
    if hard:  # leave the gap the expert merges into
        adjacent = [u for u in adjacent if not (ego_s - 45.0 < u.s0 < ego_s + 30.0)]
    vehicles += adjacent
    return Draft(j.graph, j.route("S", "N"), vehicles, lights=lights, description=desc)


def _trapezoid(t_go: float, distance: float, accel: float = 0.8, v_max: float = 1.5) -> tuple[Callable[[float], float], float]:
    """Speed profile covering ``distance`` from rest to rest from ``t_go``; returns it and its end time."""
    v_top = min(v_max, math.sqrt(accel * distance))
    t_ramp = v_top / accel
    t_cruise = max((distance - v_top * t_ramp) / v_top, 0.0)
    t_end = t_go + 2 * t_ramp + t_cruise

    def v(t: float) -> float:
        if t <= t_go or t >= t_end:
            return 0.0
        return min(v_top, accel * (t - t_go), accel * (t_end - t))
    return v, t_end


def traversing_pickup_dropoff(rng: np.random.Generator, hard: bool) -> Draft:
    road = multilane_road(2, 400.0, 11.2, pickup=(90.0, 170.0))
    lane = 1
    path = _road_path(road, lane)
    v = float(rng.uniform(5.0, 8.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=v)
    vehicles = [ego]
    bay = lane_map(road.graph).centerlines[road.pickup]
    parked = [_car(rng, f"parked{k}", bay, s, 0.0, speed_profile=_const(0.0))
              for k, s in enumerate(np.arange(6.0, 75.0, float(rng.uniform(11.0, 14.0))))]
    if hard:
        # A car reverses out of the pickup bay and stops across the ego's lane; the expert waits
        # for it, then passes it in the left lane.
        k_out = int(np.argmin([abs(p.s0 - (40.0 + v * 4.0 - 90.0)) for p in parked]))
        out_car = parked.pop(k_out)
        start = bay.interpolate(out_car.s0)
        end_s = float(path.project(start[:2]).s) - 7.0
        end = path.interpolate(end_s)
        rev_path = Polyline(_reverse_arc(end, start))
        profile, t_end = _trapezoid(float(rng.uniform(0.0, 1.5)), rev_path.length)
        vehicles.append(Vehicle("reversing", rev_path, rev_path.length, 0.0, length=out_car.length,
                                width=out_car.width, reverse=True, speed_profile=profile))
        wait_s = end_s - out_car.length / 2 - 4.0
        ego.stops = [(wait_s, T_START, t_end + 0.5)]
        lc = wait_s - VEHICLE.front_length - 16.0
        ego.path = lane_change_path(path, _road_path(road, 0), lc, 25.0)
        ego.ignore = {"reversing"}
        vehicles += _stream(rng, "l0_", _road_path(road, 0), 0.0, 300.0, v, (30.0, 45.0), target_velocity=v,
                            avoid=[(lc - 60.0, lc + 60.0)])
        desc = "a car reverses out of the pickup bay across the lane ahead; the expert waits and passes"
    else:
        vehicles += [_car(rng, "pull_in", path, 40.0 + float(rng.uniform(25.0, 35.0)), v, target_velocity=v)]
        vehicles += _stream(rng, "l0_", _road_path(road, 0), 0.0, 300.0, v, (30.0, 45.0), target_velocity=v)
        desc = "passing a pickup/drop-off zone with parked cars"
    vehicles += parked
    return Draft(road.graph, road.road_ids(), vehicles, description=desc)


def _reverse_arc(lane_pose: np.ndarray, bay_pose: np.ndarray) -> np.ndarray:
    """Forward-facing path from a pose in the lane back to the bay pose (driven in reverse it
    goes bay -> lane): an S-shaped blend between the two parallel lines."""
    s = np.linspace(0.0, 1.0, 30)
    h = lane_pose[2]
    along = np.array([math.cos(h), math.sin(h)])
    dx = np.dot(bay_pose[:2] - lane_pose[:2], along)
    lat = bay_pose[:2] - lane_pose[:2] - dx * along
    w = s ** 3 * (10 - 15 * s + 6 * s ** 2)
    return lane_pose[:2] + np.outer(s * dx, along) + np.outer(w, lat)


def waiting_for_pedestrian_to_cross(rng: np.random.Generator, hard: bool) -> Draft:
    n = int(rng.integers(1, 3))
    road = _straight_road(rng, n, 11.2, length=300.0, oncoming=1)
    lane = n - 1
    path = _road_path(road, lane)
    v = float(rng.uniform(6.0, 9.0))
    ego = ego_vehicle(path, 40.0, v, target_velocity=v)
    cross_s = 40.0 + float(rng.uniform(40.0, 55.0))
    x, y, h = path.interpolate(cross_s)
    normal = np.array([-math.sin(h), math.cos(h)])
    right_edge = np.array([x, y]) - normal * 2.5
    left_edge = np.array([x, y]) + normal * (LANE_WIDTH * (n + 1) + 2.0)
    vehicles = [ego]
    peds = []
    if hard:
        # Steps out from between two parked vans on the right, late.
        t0 = float(rng.uniform(2.0, 3.5))
        peds.append(Pedestrian("ped0", Polyline([right_edge, left_edge]), start_time=t0, speed=float(rng.uniform(1.4, 1.8))))
        bay_line = path.offset(-(LANE_WIDTH / 2 + 1.6))
        for k, ds in enumerate((-9.0, 5.0)):
            vehicles.append(Vehicle(f"van{k}", bay_line, cross_s + ds, 0.0, length=5.5, width=2.1,
                                    speed_profile=_const(0.0), object_class=ObjectClass.STATIC))
        desc = "a pedestrian steps out from between parked vans"
    else:
        for k in range(int(rng.integers(1, 4))):
            peds.append(Pedestrian(f"ped{k}", Polyline([left_edge + 0.8 * k * np.array([math.cos(h), math.sin(h)]),
                                                        right_edge]),
                                   start_time=float(rng.uniform(-1.0, 1.5)), speed=float(rng.uniform(1.0, 1.4))))
        desc = "pedestrians cross in front at a crosswalk"
    return Draft(road.graph, road.road_ids(), vehicles, peds, description=desc)


GENERATORS: dict[str, Callable[[np.random.Generator, bool], Draft]] = {
    "behind_long_vehicle": behind_long_vehicle,
    "changing_lane": changing_lane,
    "following_lane_with_lead": following_lane_with_lead,
    "high_lateral_acceleration": high_lateral_acceleration,
    "high_magnitude_speed": high_magnitude_speed,
    "low_magnitude_speed": low_magnitude_speed,
    "near_multiple_vehicles": near_multiple_vehicles,
    "starting_left_turn": starting_left_turn,
    "starting_right_turn": starting_right_turn,
    "starting_straight_traffic_light_intersection_traversal": starting_straight_traffic_light_intersection_traversal,
    "stationary_in_traffic": stationary_in_traffic,
    "stopping_with_lead": stopping_with_lead,
    "traversing_pickup_dropoff": traversing_pickup_dropoff,
    "waiting_for_pedestrian_to_cross": waiting_for_pedestrian_to_cross,
}
assert tuple(sorted(GENERATORS)) == tuple(sorted(SCENARIO_TYPES))


# --------------------------------------------------------------------------------------------------
# Realisation and validation
# --------------------------------------------------------------------------------------------------


def _boxes(rows: np.ndarray, length: float, width: float, rear_offset: float = 0.0) -> np.ndarray:
    x = rows[:, 0] + rear_offset * np.cos(rows[:, 2])
    y = rows[:, 1] + rear_offset * np.sin(rows[:, 2])
    return box_corners(x, y, rows[:, 2], length, width)


def _check(draft: Draft, tracks: dict[str, np.ndarray], steps: slice) -> str:
    """Empty if the expert log is clean, else the first problem found."""
    ego_rows = tracks["ego"][steps]
    ego_boxes = _boxes(ego_rows, VEHICLE.length, VEHICLE.width, VEHICLE.rear_axle_to_center)
    lm = lane_map(draft.graph)
    dist = lm.distance_to_drivable_area(ego_boxes)
    if np.nanmax(dist) > DRIVABLE_TOLERANCE:
        k = int(np.nanargmax(dist.max(axis=1)))
        return f"ego leaves the drivable area by {np.nanmax(dist):.2f} m at step {k}"
    users = [(v.id, v.length, v.width) for v in draft.vehicles if not v.is_ego] + \
            [(p.id, p.length, p.width) for p in draft.pedestrians]
    ego_polys = shapely.polygons(ego_boxes)
    for uid, length, width in users:
        rows = tracks[uid][steps]
        ok = np.isfinite(rows[:, 0])
        if not ok.any():
            continue
        polys = shapely.polygons(_boxes(rows[ok], length, width))
        hit = shapely.intersects(ego_polys[ok], polys)
        if hit.any():
            return f"ego collides with {uid} at step {int(np.flatnonzero(ok)[np.argmax(hit)])}"
    return ""


def realise(draft: Draft, name: str, scenario_type: str, split: str, seed: int) -> tuple[Scenario | None, str]:
    """Run the scripted traffic, validate the expert, and build the ``Scenario`` (or say why not)."""
    tracks = TrafficScript(draft.vehicles, draft.pedestrians).run(DURATION)
    k0 = int(round(-T_START / SIM_DT))
    problem = _check(draft, tracks, slice(k0, None))
    if problem:
        return None, problem
    ego_rows = tracks["ego"]
    expert = to_track(ego_rows, "ego", ObjectClass.VEHICLE, VEHICLE.length, VEHICLE.width)
    agents = []
    ego_xy = ego_rows[k0:, :2]
    for u in list(draft.vehicles) + list(draft.pedestrians):
        if isinstance(u, Vehicle) and u.is_ego:
            continue
        rows = tracks[u.id][k0:]
        near = np.hypot(rows[:, 0] - ego_xy[:, 0], rows[:, 1] - ego_xy[:, 1])
        if not np.any(near[np.isfinite(near)] < RELEVANT_RADIUS):
            continue  # never near the ego: irrelevant to planners, metrics and reactive agents
        cls = u.object_class if isinstance(u, Vehicle) else ObjectClass.PEDESTRIAN
        agents.append(to_track(tracks[u.id], u.id, cls, u.length, u.width, start=0.0))
    x, y, h, vx, vy = ego_rows[k0]
    v = vx * math.cos(h) + vy * math.sin(h)
    v_next = float(ego_rows[k0 + 1, 3] * math.cos(h) + ego_rows[k0 + 1, 4] * math.sin(h))
    h_next = float(ego_rows[k0 + 1, 2])
    yaw_rate = math.remainder(h_next - h, 2 * math.pi) / SIM_DT
    steering = math.atan(VEHICLE.wheelbase * yaw_rate / v) if abs(v) > 0.5 else 0.0
    ego0 = EgoState(0.0, float(x), float(y), float(h), float(v), (v_next - v) / SIM_DT, yaw_rate, steering)
    end = expert.state_at(DURATION)
    route = Route(0.0, list(draft.route), end.x if end else math.nan, end.y if end else math.nan,
                  end.heading if end else math.nan)
    lights = [TrafficLightTimeline(tl.lane_id, list(tl.times), list(tl.phases)) for tl in draft.lights]
    scenario = Scenario(name=name, scenario_type=scenario_type, lane_graph=draft.graph, route=route,
                        ego_initial=ego0, expert=expert, agents=agents, traffic_lights=lights,
                        duration=DURATION, split=split, source="synthetic", vehicle=VEHICLE,
                        metadata={"seed": seed, "description": draft.description, "generator_version": 1})
    # The expert row must be clean in closed loop too: replay it through the LQR + bicycle.
    problem = check_log_replay(scenario)
    return (None, "log replay: " + problem) if problem else (scenario, "")


def check_log_replay(scenario: Scenario) -> str:
    """Empty if the non-reactive log replay neither collides nor leaves the drivable area."""
    from luna_bridge.sim import LogReplayPlanner, simulate  # the simulator imports scenario types only

    log = simulate(scenario, LogReplayPlanner(scenario))
    e = log.ego_array()
    v = scenario.vehicle
    boxes = _boxes(e[:, :3], v.length, v.width, v.rear_axle_to_center)
    dist = lane_map(scenario.lane_graph).distance_to_drivable_area(boxes)
    if dist.max() > DRIVABLE_TOLERANCE:
        return f"leaves the drivable area by {dist.max():.2f} m at t={log.t[int(np.argmax(dist.max(axis=1)))]:.1f}s"
    ego_polys = shapely.polygons(boxes)
    for k, objs in enumerate(log.objects):
        if not objs.objects:
            continue
        o = objs.objects
        polys = shapely.polygons(box_corners([a.x for a in o], [a.y for a in o], [a.heading for a in o],
                                             [a.length for a in o], [a.width for a in o]))
        hit = shapely.intersects(ego_polys[k], polys)
        if hit.any():
            return f"collides with {o[int(np.argmax(hit))].id} at t={log.t[k]:.1f}s"
    return ""


def generate(scenario_type: str, split: str, index: int, max_attempts: int = MAX_ATTEMPTS) -> Scenario:
    """Scenario ``index`` of ``scenario_type`` in ``split`` (deterministic: fixed seed per slot)."""
    if scenario_type not in GENERATORS:
        raise ValueError(f"unknown scenario type {scenario_type!r}; known: {', '.join(SCENARIO_TYPES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if not 0 <= index <= MAX_INDEX or max_attempts > MAX_ATTEMPTS:
        # A larger index or more attempts would reach the seeds of the next type or split.
        raise ValueError(f"scenario index must be in 0..{MAX_INDEX} and max_attempts <= {MAX_ATTEMPTS}, "
                         f"got {index} and {max_attempts}")
    hard = split == "hard"
    type_index = SCENARIO_TYPES.index(scenario_type)
    problems = []
    for attempt in range(max_attempts):
        seed = SPLITS[split] * 1000 + type_index * 100 * MAX_ATTEMPTS + index * MAX_ATTEMPTS + attempt
        rng = np.random.default_rng(seed)
        # Train and reflect mix both variants so the memory bank sees the long tail too.
        variant_hard = hard or (split in ("train", "reflect") and index % 2 == 1)
        draft = GENERATORS[scenario_type](rng, variant_hard)
        scenario, problem = realise(draft, f"{split}_{scenario_type}_{index:02d}", scenario_type, split, seed)
        if scenario is not None:
            scenario.metadata["attempt"] = attempt
            scenario.metadata["variant"] = "hard" if variant_hard else "ordinary"
            return scenario
        problems.append(problem)
    raise GenerationError(f"{scenario_type}/{split}/{index}: no valid draw in {max_attempts} attempts; "
                          f"last problems: {problems[-3:]}")
