"""The scene descriptor xi_t (LUNA-AD Eq. 4, Table I; CALMM-Drive Table I) and its two renderings.

``build_scene`` turns the ego state, tracked objects, traffic lights, route and lane graph into a
``SceneDescriptor``; ``render_traffic_state`` writes it as the traffic-state text of the prompts and
``scene_vector`` as a fixed-length numeric vector for retrieval. ``object_timing`` adds the described
objects' closest approach and path crossings, which a decision head may read beside xi_t
(``head_scene_values``, ``HEAD_SCENE_PARTS``); ``read_described_objects`` reads the objects back from the
text, where only the text is kept. ``scene_to_dict`` / ``scene_from_dict`` give a JSON-safe form (frame
files, memory items).

Road-section category from the distance d along the route to the next junction (CALMM-Drive Sec.
III-A): d = 0 junction, 0 < d <= 20 m near a junction, else normal multi-lane. Object selection per
category (CALMM-Drive Table I): normal: same lane, adjacent lanes; near a junction: same lane,
adjacent lanes, junction; in a junction: junction, target road. VRUs in the 30 m, +-75 deg field of
view always. Static objects follow the vehicle rules (they matter where they block a lane).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from luna_core.lanes import LaneMap, lane_map, route_lanes_from_pose
from luna_core.types import (ACTION_CODES, ACTION_INDEX, EgoState, LaneGraph, MemoryItem, Navigation, ObjectClass,
                             ObjectDescription, RoadSection, Route, SceneDescriptor, TrackedObject,
                             TrackedObjects, TrafficLightPhase, TrafficLights, VehicleParameters, usable_objects,
                             wrap_angle)

# Lane relations (ObjectDescription.lane_relation)
SAME_LANE = "same lane"
LEFT_LANE = "left lane"
RIGHT_LANE = "right lane"
JUNCTION = "junction"
TARGET_ROAD = "target road"
FIELD_OF_VIEW = "field of view"

_SELECTED_RELATIONS = {
    RoadSection.NORMAL_MULTI_LANE: (SAME_LANE, LEFT_LANE, RIGHT_LANE),
    RoadSection.NEAR_JUNCTION: (SAME_LANE, LEFT_LANE, RIGHT_LANE, JUNCTION),
    RoadSection.JUNCTION: (JUNCTION, TARGET_ROAD),
}


class SceneInputError(ValueError):
    """The inputs cannot describe a scene (e.g. a non-finite ego state)."""


@dataclass(frozen=True)
class SceneConfig:
    near_junction_distance: float = 20.0  # d-bar of CALMM-Drive (m)
    vru_range: float = 30.0  # field of view radius (m)
    vru_half_angle: float = math.radians(75.0)
    max_object_distance: float = 80.0  # vehicles / static objects further away are not described (m)
    max_objects: int = 12  # cap on described objects (closest kept), bounds the prompt length
    light_range: float = 60.0  # a junction's light and distance are stated up to this distance (m)
    turn_threshold: float = math.radians(30.0)  # connector heading change that counts as a turn
    lane_match_slack: float = 0.5  # m beyond half the lane width still counted as on the lane
    cut_in_lateral_speed: float = 0.5  # m/s sideways towards the ego lane that counts as cutting in


# --------------------------------------------------------------------------------------------------
# Building xi_t
# --------------------------------------------------------------------------------------------------


def _polar(cx: float, cy: float, heading: float, x: float, y: float) -> tuple[float, float]:
    """(distance, line-of-sight angle) of (x, y) from the ego centre, zero azimuth along the heading."""
    dx, dy = x - cx, y - cy
    return math.hypot(dx, dy), float(wrap_angle(math.atan2(dy, dx) - heading))


def _road_of(lm: LaneMap, lane_id: str) -> list[str]:
    """The lanes of a lane's road, left to right: the road_id group, or the neighbour chain."""
    road_id = lm.graph.lanes[lane_id].road_id
    if road_id:
        return lm.road_lanes(road_id)
    chain = [lane_id]
    left, right = lm.neighbours(lane_id)
    while left and left not in chain:
        chain.insert(0, left)
        left = lm.neighbours(left)[0]
    while right and right not in chain:
        chain.append(right)
        right = lm.neighbours(right)[1]
    return chain


def _turn(lm: LaneMap, connector: str, threshold: float) -> Navigation:
    h = lm.centerlines[connector].vertex_headings
    change = float(wrap_angle(h[-1] - h[0]))
    if change > threshold:
        return Navigation.LEFT
    if change < -threshold:
        return Navigation.RIGHT
    return Navigation.STRAIGHT


def _reaches(lm: LaneMap, start: str, targets: set[str], max_depth: int = 6) -> bool:
    """Whether successor edges lead from ``start`` to one of ``targets`` within ``max_depth`` lanes."""
    frontier, seen = [start], {start}
    for _ in range(max_depth):
        nxt = []
        for lane_id in frontier:
            for s in lm.graph.lanes[lane_id].successors:
                if s in targets:
                    return True
                if s in lm.graph.lanes and s not in seen:
                    seen.add(s)
                    nxt.append(s)
        frontier = nxt
    return False


@dataclass
class _Topology:
    """What the route and the lane graph say about the ego's surroundings."""

    section: RoadSection = RoadSection.NORMAL_MULTI_LANE
    junction_distance: float = math.inf
    road: tuple[str, ...] = ()  # current road lanes, left to right
    ego_lane: str = ""
    connector: str = ""  # the next (or current) junction lane on the route
    target_road: tuple[str, ...] = ()  # lanes of the road after the junction, left to right
    corridor: frozenset[str] = frozenset()  # lanes counted as the ego lane (ahead up to the junction, behind)
    left: frozenset[str] = frozenset()
    right: frozenset[str] = frozenset()


def _topology(lm: LaneMap, route: Route, ego: EgoState, cfg: SceneConfig) -> _Topology:
    located = route_lanes_from_pose(lm.graph, route, ego.x, ego.y, ego.heading)
    if located is None:
        return _Topology()
    seq, match = located
    lanes = lm.graph.lanes
    d = lm.distance_to_junction(seq, match.s)
    section = (RoadSection.JUNCTION if d <= 0.0 else
               RoadSection.NEAR_JUNCTION if d <= cfg.near_junction_distance else RoadSection.NORMAL_MULTI_LANE)
    k_junction = next((k for k, i in enumerate(seq) if lanes[i].in_junction), None)
    connector = seq[k_junction] if k_junction is not None else ""
    target: tuple[str, ...] = ()
    if k_junction is not None:
        after = next((i for i in seq[k_junction:] if not lanes[i].in_junction), None)
        if after is not None:
            target = tuple(_road_of(lm, after))
    ahead = seq[:k_junction] if k_junction is not None else seq
    if section is RoadSection.JUNCTION:
        ahead = [i for i in seq if lanes[i].in_junction][:1] or seq[:1]
    corridor = set(ahead) | {p for p in lanes[seq[0]].predecessors if p in lanes}
    left, right = set(), set()
    for lane_id in corridor:
        lft, rgt = lm.neighbours(lane_id)
        left |= {lft} if lft else set()
        right |= {rgt} if rgt else set()
    road = () if section is RoadSection.JUNCTION else tuple(_road_of(lm, seq[0]))
    return _Topology(section, d, road, seq[0], connector, target, frozenset(corridor),
                     frozenset(left - corridor), frozenset(right - corridor))


def _relation(lm: LaneMap, topo: _Topology, obj: TrackedObject, cfg: SceneConfig) -> tuple[str, bool]:
    """The lane relation of an object to the ego ("" when it is on no relevant lane), and whether it
    is cutting in: in an adjacent lane, moving sideways towards the ego lane faster than
    ``cut_in_lateral_speed``."""
    lanes = lm.graph.lanes
    on = [m for m in lm.match_lanes(obj.x, obj.y, obj.heading, max_distance=6.0)
          if abs(m.lateral) <= lanes[m.lane_id].width / 2 + cfg.lane_match_slack]
    for m in on:  # best match first; the first relevant lane decides
        if m.lane_id in topo.corridor:
            return SAME_LANE, False
        if m.lane_id in topo.left or m.lane_id in topo.right:
            lane_heading = obj.heading - m.heading_error
            lateral_speed = -obj.vx * math.sin(lane_heading) + obj.vy * math.cos(lane_heading)  # + left
            if m.lane_id in topo.left:
                return LEFT_LANE, lateral_speed < -cfg.cut_in_lateral_speed
            return RIGHT_LANE, lateral_speed > cfg.cut_in_lateral_speed
        if lanes[m.lane_id].in_junction:
            return JUNCTION, False
        if m.lane_id in topo.target_road:
            return TARGET_ROAD, False
    return "", False


def build_scene(ego: EgoState, objects: TrackedObjects | None, lights: TrafficLights | None,
                route: Route, graph: LaneGraph, recent_decisions: Sequence[str] = (),
                vehicle: VehicleParameters | None = None, config: SceneConfig | None = None) -> SceneDescriptor:
    """xi_t from the stack's inputs. Raises ``SceneInputError`` for a non-finite ego state. Objects follow
    ``usable_objects``: unknown sizes get their class's default footprint; objects without a usable
    position are listed in ``dropped_objects`` with the reason."""
    cfg = config or SceneConfig()
    veh = vehicle or VehicleParameters()
    if not ego.is_finite():
        raise SceneInputError(f"ego state at t={ego.stamp} has non-finite fields: {ego}")
    bad = [c for c in recent_decisions if c not in ACTION_INDEX]
    if bad:
        raise SceneInputError(f"recent decisions contain unknown action codes {bad}")
    cx, cy = veh.center_from_rear_axle(ego.x, ego.y, ego.heading)
    lm = lane_map(graph)
    topo = _topology(lm, route, ego, cfg) if graph.lanes else _Topology()

    left_n, right_n = lm.neighbours(topo.ego_lane) if topo.ego_lane else (None, None)
    navigation = Navigation.NONE
    if topo.section is not RoadSection.NORMAL_MULTI_LANE and topo.connector:
        navigation = _turn(lm, topo.connector, cfg.turn_threshold)

    light = TrafficLightPhase.NONE
    if topo.connector and topo.junction_distance <= cfg.light_range and lights is not None:
        phases = [s.phase for s in lights.lights if s.lane_id == topo.connector]
        light = phases[-1] if phases else TrafficLightPhase.NONE

    connects: list[bool] = []
    exits: list[tuple[float, float]] = []
    if topo.section is not RoadSection.NORMAL_MULTI_LANE and topo.target_road:
        targets = set(topo.target_road)
        if topo.section is RoadSection.NEAR_JUNCTION:
            connects = [_reaches(lm, lane_id, targets) for lane_id in topo.road]
        exits = [_polar(cx, cy, ego.heading, *lm.centerlines[t].points[0]) for t in topo.target_road]

    described, dropped = _select_objects(lm, topo, objects, cx, cy, ego.heading, cfg)
    return SceneDescriptor(
        stamp=ego.stamp, road_section=topo.section, num_lanes=len(topo.road),
        ego_lane_index=topo.road.index(topo.ego_lane) + 1 if topo.ego_lane in topo.road else 0,
        lanes_connect_to_target=connects, exit_points=exits, ego_speed=ego.velocity,
        ego_acceleration=ego.acceleration, ego_length=veh.length, ego_width=veh.width, objects=described,
        traffic_light=light, navigation=navigation, recent_decisions=list(recent_decisions)[-2:],
        has_left_lane=left_n is not None, has_right_lane=right_n is not None,
        junction_distance=topo.junction_distance, dropped_objects=dropped)


def _select_objects(lm: LaneMap, topo: _Topology, objects: TrackedObjects | None, cx: float, cy: float,
                    heading: float, cfg: SceneConfig) -> tuple[list[ObjectDescription], dict[str, str]]:
    usable = usable_objects(objects.objects if objects is not None else [])
    dropped = dict(usable.dropped)
    finite = usable.objects
    if not finite:
        return [], dropped
    # Vectorised range pre-filter first: huge object lists cost one numpy pass, not a lane query each.
    xy = np.array([[o.x, o.y] for o in finite])
    dist = np.hypot(xy[:, 0] - cx, xy[:, 1] - cy)
    keep = np.flatnonzero(dist <= max(cfg.max_object_distance, cfg.vru_range))
    wanted = _SELECTED_RELATIONS[topo.section]
    selected: list[ObjectDescription] = []
    for k in keep[np.argsort(dist[keep], kind="stable")]:
        obj = finite[k]
        d, bearing = _polar(cx, cy, heading, obj.x, obj.y)
        if d < 1e-6:
            bearing = 0.0
        relation, cutting_in = "", False
        if obj.object_class.is_vru:
            if d <= cfg.vru_range and abs(bearing) <= cfg.vru_half_angle:
                relation = _relation(lm, topo, obj, cfg)[0] or FIELD_OF_VIEW
        elif d <= cfg.max_object_distance and lm.ids:
            relation, cutting_in = _relation(lm, topo, obj, cfg)
            relation = relation if relation in wanted else ""
        if not relation:
            continue
        if len(selected) >= cfg.max_objects:  # sorted by distance, so the closest ones are kept
            dropped[obj.id] = f"beyond the cap of {cfg.max_objects} described objects"
            continue
        speed = 0.0 if obj.object_class is ObjectClass.STATIC else obj.speed
        selected.append(ObjectDescription(obj.id, obj.object_class, d, bearing,
                                          float(wrap_angle(obj.heading - heading)), speed,
                                          obj.length, obj.width, relation, cutting_in))
    return selected, dropped


# --------------------------------------------------------------------------------------------------
# Text rendering
# --------------------------------------------------------------------------------------------------

CLASS_WORD = {ObjectClass.VEHICLE: "vehicle", ObjectClass.PEDESTRIAN: "pedestrian",
              ObjectClass.BICYCLE: "cyclist", ObjectClass.STATIC: "static object"}
SAFE_ID_CHARS = "A-Za-z0-9_.:-"  # the characters an object id keeps in a prompt (a regex class body)
CUTTING_IN_TEXT = ", moving into the ego lane"  # after the lane relation of an object cutting in


def safe_id(object_id: str) -> str:
    """An object id as it may appear in a prompt: no control characters or markup, at most 24 chars
    (ids come from perception and must not inject text into prompts)."""
    cleaned = re.sub(f"[^{SAFE_ID_CHARS}]", "_", str(object_id))[:24]
    return cleaned or "_"


# The traffic-state text's object and ego lines, read back where only the text is kept: a reflection item's
# cause (luna_core.lessons) and the objects' timing of a teacher item (``item_head_values``).
OBJECT_LINE = re.compile(r"^- (?P<id>\S+) (?P<kind>vehicle|pedestrian|cyclist|static object), (?P<relation>[^:]+): "
                         r"(?P<distance>[0-9.]+) m, (?P<bearing>-?\d+) deg, heading (?P<heading>-?\d+) deg"
                         r"(?:, (?P<speed>[0-9.]+) m/s)?, (?P<length>[0-9.]+) x (?P<width>[0-9.]+) m\.$", re.MULTILINE)
EGO_LINE = re.compile(r"^Ego: speed (?P<speed>-?[0-9.]+) m/s, ", re.MULTILINE)
_CLASS_OF_WORD = {word: cls for cls, word in CLASS_WORD.items()}


def read_described_objects(text: str) -> tuple[float, list[ObjectDescription]]:
    """The ego speed (m/s) and the objects of a traffic-state text (``render_traffic_state``), to its
    precision (0.01 m and m/s, whole degrees). ``SceneInputError`` when the text has no ego line, or an
    object line that does not read."""
    ego = EGO_LINE.search(text)
    if ego is None:
        raise SceneInputError("traffic-state text: no 'Ego: speed ... m/s' line")
    objects = []
    for m in OBJECT_LINE.finditer(text):
        relation = m["relation"].removesuffix(CUTTING_IN_TEXT)
        objects.append(ObjectDescription(
            m["id"], _CLASS_OF_WORD[m["kind"]], float(m["distance"]), math.radians(int(m["bearing"])),
            math.radians(int(m["heading"])), float(m["speed"] or 0.0), float(m["length"]), float(m["width"]),
            relation, relation != m["relation"]))
    listed = sum(1 for line in text.splitlines() if line.startswith("- "))
    if listed != len(objects):
        raise SceneInputError(f"traffic-state text: {listed - len(objects)} of {listed} object line(s) do not "
                              "read as 'id kind, relation: distance m, angle deg, heading angle deg[, speed m/s], "
                              "length x width m.'")
    return float(ego["speed"]), objects


def _deg(angle: float) -> str:
    return f"{round(math.degrees(angle)):d} deg"


def render_traffic_state(scene: SceneDescriptor) -> str:
    """The traffic-state text of xi_t: distances to 0.01 m, angles in whole degrees."""
    lines = []
    section = scene.road_section
    road = f"Road section: {section.value}"
    if section is not RoadSection.JUNCTION and math.isfinite(scene.junction_distance):
        road += f" (junction ahead in {scene.junction_distance:.2f} m)"
    lines.append(road + ".")
    if section is not RoadSection.JUNCTION and scene.num_lanes > 0:
        lines.append(f"Lanes: {scene.num_lanes}, ego in lane {scene.ego_lane_index} counted from the left.")
    if section is RoadSection.NEAR_JUNCTION and scene.lanes_connect_to_target:
        conn = ", ".join(f"lane {i} {'yes' if ok else 'no'}"
                         for i, ok in enumerate(scene.lanes_connect_to_target, start=1))
        lines.append(f"Lanes leading to the target road: {conn}.")
    if section is not RoadSection.NORMAL_MULTI_LANE and scene.exit_points:
        pts = "; ".join(f"lane {i} at {d:.2f} m, {_deg(b)}" for i, (d, b) in enumerate(scene.exit_points, 1))
        lines.append(f"Exit points of the target road lanes (left to right): {pts}.")
    lines.append(f"Traffic light: {scene.traffic_light.value}.")
    lines.append(f"Navigation: {scene.navigation.value}.")
    lines.append(f"Ego: speed {scene.ego_speed:.2f} m/s, acceleration {scene.ego_acceleration:.2f} m/s^2, "
                 f"length {scene.ego_length:.2f} m, width {scene.ego_width:.2f} m.")
    if scene.objects:
        lines.append("Objects (id, type, relation: distance, line-of-sight angle, heading, speed, length x width):")
        for o in scene.objects:
            speed = "" if o.object_class is ObjectClass.STATIC else f", {o.speed:.2f} m/s"
            relation = o.lane_relation + (CUTTING_IN_TEXT if o.cutting_in else "")
            lines.append(f"- {safe_id(o.id)} {CLASS_WORD[o.object_class]}, {relation}: "
                         f"{o.distance:.2f} m, {_deg(o.bearing)}, heading {_deg(o.heading)}{speed}, "
                         f"{o.length:.2f} x {o.width:.2f} m.")
    else:
        lines.append("Objects: none relevant.")
    recent = ", ".join(scene.recent_decisions) if scene.recent_decisions else "none"
    lines.append(f"Recent decisions: {recent}.")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Numeric scene vector (retrieval)
# --------------------------------------------------------------------------------------------------

# Object slots: the nearest object of each kind of relation, ahead (+) and behind (-) where it matters.
_SLOTS = (("same lane", 1), ("same lane", -1), ("left lane", 1), ("left lane", -1), ("right lane", 1),
          ("right lane", -1), ("junction", 0), ("target road", 0), ("vru", 0), ("static", 0))
_SLOT_FEATURES = 6  # present, distance/50, cos(bearing), sin(bearing), speed/20, cos(rel. heading)
_SECTIONS = tuple(RoadSection)
_LIGHTS = tuple(TrafficLightPhase)
_NAVS = tuple(Navigation)
SCENE_VECTOR_DIM = (len(_SECTIONS) + 6 + len(_LIGHTS) + len(_NAVS) + 2 * len(ACTION_CODES)
                    + len(_SLOTS) * _SLOT_FEATURES)
# xi_t's leading values: road section, lanes, junction distance, ego speed, light and navigation; the last two
# decisions and the object slots follow.
SCENE_VECTOR_EGO_ROAD_DIM = len(_SECTIONS) + 6 + len(_LIGHTS) + len(_NAVS)

# The objects' timing (``object_timing``): per slot, under constant velocities with the ego going straight
# along its heading, the time (s) and distance (m) of the closest approach, and when (s) and where (m along
# the ego's heading, + ahead) the object's path crosses the ego's heading line.
TIMING_HORIZON = 8.0  # s, the teacher's and the planner's horizon
_TIMING_FEATURES = 4  # t_ca / T, min(d_ca, 50) / 50, t_cross / T, clip(x_cross / 50, -1, 1)
_NO_CONFLICT = (1.0, 1.0, 1.0, 0.0)  # an empty slot, or a path that does not cross within the horizon
SCENE_TIMING_DIM = len(_SLOTS) * _TIMING_FEATURES

# What a decision head may read beside h_{i*} (StudentConfig.head_scene_dim), as indices into
# ``head_scene_values``: xi_t followed by the objects' timing. Each part has its own length, so a head's
# scene_dim names its part. "ego-road" leaves out the recent decisions (the teacher's top action repeats
# the last decision on about two thirds of its items) and the objects; "ego-road-timing" adds the
# objects' timing to it (docs/student.md, sessions 38 and 39); "all-timing" is every value, what an
# ensemble of heads reads, each member taking its own part of it (``luna_core.student.head.HeadEnsemble``).
HEAD_SCENE_VALUES_DIM = SCENE_VECTOR_DIM + SCENE_TIMING_DIM
HEAD_SCENE_PARTS: dict[str, tuple[int, ...]] = {
    "all": tuple(range(SCENE_VECTOR_DIM)),
    "ego-road": tuple(range(SCENE_VECTOR_EGO_ROAD_DIM)),
    "ego-road-timing": (*range(SCENE_VECTOR_EGO_ROAD_DIM),
                        *range(SCENE_VECTOR_DIM, SCENE_VECTOR_DIM + SCENE_TIMING_DIM)),
    "all-timing": tuple(range(HEAD_SCENE_VALUES_DIM)),
}


def head_scene_part(scene_dim: int) -> tuple[int, ...]:
    """The indices into ``head_scene_values`` a head with ``scene_dim`` scene values reads; ValueError
    when no part has that length."""
    for part in HEAD_SCENE_PARTS.values():
        if len(part) == scene_dim:
            return part
    raise ValueError(f"no head scene part has {scene_dim} values (parts: "
                     f"{ {name: len(p) for name, p in HEAD_SCENE_PARTS.items()} })")


def _slot_of(o: ObjectDescription) -> tuple[str, int]:
    if o.object_class.is_vru:
        return "vru", 0
    if o.object_class is ObjectClass.STATIC:
        return "static", 0
    if o.lane_relation in (JUNCTION, TARGET_ROAD):
        return o.lane_relation, 0
    return o.lane_relation, 1 if math.cos(o.bearing) >= 0.0 else -1


def _slotted(objects: Sequence[ObjectDescription]) -> list[ObjectDescription | None]:
    """The nearest object of each slot of ``_SLOTS`` (None where a slot is empty)."""
    slots: dict[tuple[str, int], ObjectDescription] = {}
    for o in sorted(objects, key=lambda o: o.distance):
        slots.setdefault(_slot_of(o), o)
    return [slots.get(key) for key in _SLOTS]


def scene_vector(scene: SceneDescriptor) -> np.ndarray:
    """A fixed-length (SCENE_VECTOR_DIM,) float32 summary of xi_t, roughly unit-scaled per feature."""
    v: list[float] = [float(scene.road_section is s) for s in _SECTIONS]
    jd = scene.junction_distance
    v += [min(scene.num_lanes, 6) / 6.0, min(scene.ego_lane_index, 6) / 6.0, float(scene.has_left_lane),
          float(scene.has_right_lane), min(jd if math.isfinite(jd) else 100.0, 100.0) / 100.0,
          float(np.clip(scene.ego_speed / 20.0, -1.0, 2.0))]
    v += [float(scene.traffic_light is p) for p in _LIGHTS]
    v += [float(scene.navigation is n) for n in _NAVS]
    recent = list(scene.recent_decisions)[-2:]
    recent = [""] * (2 - len(recent)) + recent
    for code in recent:
        v += [float(code == c) for c in ACTION_CODES]
    for o in _slotted(scene.objects):
        if o is None:
            v += [0.0] * _SLOT_FEATURES
        else:
            v += [1.0, min(o.distance, 100.0) / 50.0, math.cos(o.bearing), math.sin(o.bearing),
                  min(o.speed, 40.0) / 20.0, math.cos(o.heading)]
    out = np.asarray(v, dtype=np.float32)
    assert out.shape == (SCENE_VECTOR_DIM,)
    return out


def _timing(ego_speed: float, o: ObjectDescription) -> tuple[float, float, float, float]:
    px, py = o.distance * math.cos(o.bearing), o.distance * math.sin(o.bearing)  # ego frame, x ahead, y left
    ux, uy = o.speed * math.cos(o.heading), o.speed * math.sin(o.heading)
    wx, wy = ux - ego_speed, uy  # velocity relative to the ego
    w2 = wx * wx + wy * wy
    t_ca = 0.0 if w2 < 1e-6 else min(max(-(px * wx + py * wy) / w2, 0.0), TIMING_HORIZON)
    d_ca = math.hypot(px + wx * t_ca, py + wy * t_ca)
    t_cross, x_cross = TIMING_HORIZON, 0.0
    if abs(uy) > 1e-3 and py * uy < 0.0 and -py / uy < TIMING_HORIZON:  # moving towards the heading line
        t_cross = -py / uy
        x_cross = px + ux * t_cross
    return (t_ca / TIMING_HORIZON, min(d_ca, 50.0) / 50.0, t_cross / TIMING_HORIZON,
            float(np.clip(x_cross / 50.0, -1.0, 1.0)))


def object_timing(ego_speed: float, objects: Sequence[ObjectDescription]) -> np.ndarray:
    """(SCENE_TIMING_DIM,) float32: for the nearest object of each slot of the scene vector, its closest
    approach to the ego (time, distance) and its path's crossing of the ego's heading line (time, place),
    under constant velocities with the ego going straight at ``ego_speed`` (m/s). Empty slots and paths that
    do not cross within ``TIMING_HORIZON`` read as no conflict."""
    v: list[float] = []
    for o in _slotted(objects):
        v += _NO_CONFLICT if o is None else _timing(ego_speed, o)
    return np.asarray(v, dtype=np.float32)


def _head_values(xi: np.ndarray, ego_speed: float, objects: Sequence[ObjectDescription]) -> np.ndarray:
    return np.concatenate([np.asarray(xi, dtype=np.float32).reshape(-1), object_timing(ego_speed, objects)])


def head_scene_values(scene: SceneDescriptor) -> np.ndarray:
    """(HEAD_SCENE_VALUES_DIM,) float32: xi_t's vector followed by the objects' timing, what
    ``HEAD_SCENE_PARTS`` index (the decision path)."""
    return _head_values(scene_vector(scene), scene.ego_speed, scene.objects)


def item_head_values(item: MemoryItem) -> np.ndarray | None:
    """``head_scene_values`` of a memory item: its stored xi_t, and the objects' timing read back from its
    query (a teacher item keeps the text, not the scene; to the text's precision). None where the item
    stores no scene vector."""
    if item.scene_vector is None:
        return None
    return _head_values(item.scene_vector, *read_described_objects(item.query))


# --------------------------------------------------------------------------------------------------
# JSON-safe form
# --------------------------------------------------------------------------------------------------


def scene_to_dict(scene: SceneDescriptor) -> dict[str, Any]:
    d = asdict(scene)
    d["road_section"] = scene.road_section.value
    d["traffic_light"] = scene.traffic_light.value
    d["navigation"] = scene.navigation.value
    d["exit_points"] = [list(p) for p in scene.exit_points]
    d["junction_distance"] = scene.junction_distance if math.isfinite(scene.junction_distance) else None
    for o in d["objects"]:
        o["object_class"] = o["object_class"].value
    return d


def scene_from_dict(d: dict[str, Any]) -> SceneDescriptor:
    """Inverse of ``scene_to_dict``; raises ``SceneInputError`` naming the bad field."""
    try:
        objects = [ObjectDescription(**{**o, "object_class": ObjectClass(o["object_class"])})
                   for o in d.get("objects", [])]
        jd = d.get("junction_distance")
        fields = {**d, "road_section": RoadSection(d["road_section"]),
                  "traffic_light": TrafficLightPhase(d.get("traffic_light", "None")),
                  "navigation": Navigation(d.get("navigation", "None")),
                  "exit_points": [tuple(p) for p in d.get("exit_points", [])],
                  "junction_distance": math.inf if jd is None else float(jd), "objects": objects}
        scene = SceneDescriptor(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise SceneInputError(f"invalid scene record: {exc}") from exc
    bad = [c for c in scene.recent_decisions if c not in ACTION_INDEX]
    if bad:
        raise SceneInputError(f"invalid scene record: unknown recent decisions {bad}")
    return scene
