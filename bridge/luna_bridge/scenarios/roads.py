"""Procedural road layouts for the synthetic suite: multi-lane roads (straight or curved, with
clothoid transitions so curvature is continuous), an optional oncoming carriageway, an optional
pickup/drop-off strip, and 4-way signalised junctions with connector lanes.

Geometry is right-hand traffic; lanes of one road are parallel offsets of a reference line, so a
lane change between them is a lateral blend. Every layout returns a ``LaneGraph`` plus the handles
scenario generators need (lane ids per road section, connectors per movement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import shapely

from luna_core.lanes import Polyline, make_lane
from luna_core.types import Lane, LaneGraph

LANE_WIDTH = 3.5  # m
TURN_LANE_WIDTH = 5.0  # m, junction turning connectors
SHOULDER = 1.0  # m of paved shoulder beyond the rightmost lane line (drivable, up to the kerb)


def _lane(lane_id: str, centre: np.ndarray, speed_limit: float, road_id: str, shoulder: bool,
          left_shoulder: bool = False, **fields: object) -> Lane:
    """A lane of width LANE_WIDTH; the outermost lanes of a road carry the shoulder in their
    polygon, as nuPlan's drivable area reaches the kerb, not the lane line."""
    lane = make_lane(lane_id, centre, LANE_WIDTH, speed_limit, road_id, **fields)
    if shoulder:
        lane.right_boundary = Polyline(centre).offset(-(LANE_WIDTH / 2 + SHOULDER)).points.copy()
    if left_shoulder:
        lane.left_boundary = Polyline(centre).offset(LANE_WIDTH / 2 + SHOULDER).points.copy()
    return lane


def _rotate(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return points @ np.array([[c, s], [-s, c]])


def reference_line(pieces: list[tuple[float, float]], start=(0.0, 0.0, 0.0), ds: float = 1.0,
                   transition: float = 20.0) -> Polyline:
    """A reference line from ``pieces`` of (length m, curvature 1/m); curvature ramps linearly
    over ``transition`` metres between pieces (a clothoid), so a tracked vehicle has no step."""
    kappa = np.concatenate([np.full(max(int(round(length / ds)), 1), k) for length, k in pieces])
    n_ramp = max(int(round(transition / ds)), 1)
    kernel = np.ones(n_ramp) / n_ramp
    padded = np.concatenate([np.full(n_ramp, kappa[0]), kappa, np.full(n_ramp, kappa[-1])])
    kappa = np.convolve(padded, kernel, mode="same")[n_ramp:-n_ramp]
    heading = start[2] + np.concatenate([[0.0], np.cumsum(kappa[:-1] * ds)])
    xy = np.column_stack([np.cumsum(np.cos(heading) * ds), np.cumsum(np.sin(heading) * ds)])
    xy = np.vstack([[0.0, 0.0], xy]) + np.array(start[:2])
    return Polyline(xy)


def _simplify(line: Polyline, tolerance: float = 0.01) -> np.ndarray:
    """Drop vertices that lie within ``tolerance`` of the simplified line (keeps files small)."""
    return np.asarray(shapely.LineString(line.points).simplify(tolerance).coords)


@dataclass
class Road:
    """A multi-lane one-way road split into sections; ``lanes[k][i]`` = lane i (0 = leftmost) of
    section k."""

    graph: LaneGraph
    reference: Polyline  # the left edge of the leftmost lane, in the travel direction
    lanes: list[list[str]]
    section_length: float
    oncoming: list[list[str]] = field(default_factory=list)  # oncoming lanes, [section][i], 0 = next to centre
    pickup: str = ""  # the pickup/drop-off strip lane id, if any

    def road_ids(self) -> list[str]:
        return [self.graph.lanes[sec[0]].road_id for sec in self.lanes]

    def lane_sequence(self, index: int) -> list[str]:
        return [sec[index] for sec in self.lanes]

    def lane_offset(self, index: int) -> float:
        """Lateral offset of lane ``index``'s centreline from the reference line (negative = right)."""
        return -(index + 0.5) * LANE_WIDTH


def multilane_road(n_lanes: int, length: float, speed_limit: float, curvature: list[tuple[float, float]] | None = None,
                   section_length: float = 100.0, oncoming_lanes: int = 0, pickup: tuple[float, float] | None = None,
                   prefix: str = "r") -> Road:
    """A one-way road of ``n_lanes`` lanes (plus optional oncoming lanes on the left and a pickup
    strip on the right between arc lengths ``pickup = (start, end)``)."""
    ref = reference_line(curvature or [(length, 0.0)])
    graph = LaneGraph()
    n_sec = max(int(math.ceil(ref.length / section_length - 1e-6)), 1)
    bounds = np.linspace(0.0, ref.length, n_sec + 1)
    lanes: list[list[str]] = []
    oncoming: list[list[str]] = []
    for k in range(n_sec):
        s = np.linspace(bounds[k], bounds[k + 1], max(int((bounds[k + 1] - bounds[k]) / 1.0), 1) + 1)
        piece = Polyline(ref.interpolate(s)[:, :2])
        sec = []
        for i in range(n_lanes):
            lane_id = f"{prefix}{k}_l{i}"
            centre = Polyline(_simplify(piece.offset(-(i + 0.5) * LANE_WIDTH)))
            graph.add(_lane(lane_id, centre.points, speed_limit, f"{prefix}{k}", i == n_lanes - 1,
                                i == 0 and oncoming_lanes == 0, left_neighbor=f"{prefix}{k}_l{i - 1}" if i > 0 else "",
                                right_neighbor=f"{prefix}{k}_l{i + 1}" if i < n_lanes - 1 else ""))
            sec.append(lane_id)
        lanes.append(sec)
        osec = []
        for i in range(oncoming_lanes):
            lane_id = f"{prefix}{k}_o{i}"
            centre = Polyline(_simplify(piece.offset((i + 0.5) * LANE_WIDTH)).copy()[::-1])
            graph.add(_lane(lane_id, centre.points, speed_limit, f"{prefix}o{k}", i == oncoming_lanes - 1,
                                left_neighbor=f"{prefix}{k}_o{i - 1}" if i > 0 else "",
                                right_neighbor=f"{prefix}{k}_o{i + 1}" if i < oncoming_lanes - 1 else ""))
            osec.append(lane_id)
        oncoming.append(osec)
    for k in range(n_sec - 1):
        for i in range(n_lanes):
            graph.lanes[lanes[k][i]].successors.append(lanes[k + 1][i])
            graph.lanes[lanes[k + 1][i]].predecessors.append(lanes[k][i])
        for i in range(oncoming_lanes):
            graph.lanes[oncoming[k + 1][i]].successors.append(oncoming[k][i])
            graph.lanes[oncoming[k][i]].predecessors.append(oncoming[k + 1][i])
    road = Road(graph, ref, lanes, section_length, oncoming)
    if pickup is not None:
        s = np.linspace(pickup[0], pickup[1], int(pickup[1] - pickup[0]) + 1)
        piece = Polyline(ref.interpolate(s)[:, :2])
        centre = piece.offset(-(n_lanes + 0.5) * LANE_WIDTH)
        # A parking strip: its own road, no lane-change links (pulling in is not a lane change).
        graph.add(make_lane(f"{prefix}_pickup", _simplify(centre), LANE_WIDTH, 4.0, f"{prefix}_pickup"))
        road.pickup = f"{prefix}_pickup"
    return road


# --------------------------------------------------------------------------------------------------
# 4-way junction
# --------------------------------------------------------------------------------------------------

ARMS = ("S", "E", "N", "W")  # arm k is arm S rotated by k * 90 deg counter-clockwise


def _bezier(points: np.ndarray, n: int = 60) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n)[:, None]
    deg = len(points) - 1
    out = np.zeros((n, 2))
    for i, p in enumerate(points):
        out += math.comb(deg, i) * t ** i * (1 - t) ** (deg - i) * p
    return out


def _turn(p0: np.ndarray, h0: float, p1: np.ndarray, h1: float) -> np.ndarray:
    """A smooth connector between two poses: a quintic Bezier whose first and last three control
    points lie on the end tangents (zero curvature at both ends, so it joins straight lanes
    without a curvature step)."""
    u0 = np.array([math.cos(h0), math.sin(h0)])
    u1 = np.array([math.cos(h1), math.sin(h1)])
    # Corner: intersection of the two tangent lines.
    a = np.column_stack([u0, u1])  # p0 + d0 u0 = corner = p1 - d1 u1
    lam = np.linalg.solve(a, p1 - p0)
    d0, d1 = lam[0], lam[1]
    ctrl = np.array([p0, p0 + 0.35 * d0 * u0, p0 + 0.7 * d0 * u0, p1 - 0.7 * d1 * u1, p1 - 0.35 * d1 * u1, p1])
    return Polyline(_bezier(ctrl, 80)).resample(1.0).points


@dataclass
class Junction:
    graph: LaneGraph
    incoming: dict[str, list[str]]  # arm -> incoming lane ids (0 = leftmost)
    outgoing: dict[str, list[str]]  # arm -> outgoing lane ids (0 = leftmost)
    connectors: dict[tuple[str, str], list[str]]  # (from arm, to arm) -> connector lane ids
    half_size: float
    arm_length: float

    def movement(self, arm: str, turn: str) -> str:
        """The destination arm of a movement ('straight', 'left', 'right') from ``arm``."""
        k = ARMS.index(arm)
        return ARMS[(k + {"straight": 2, "right": 1, "left": 3}[turn]) % 4]

    def route(self, src: str, dst: str) -> list[str]:
        return [self.graph.lanes[self.incoming[src][0]].road_id,
                self.graph.lanes[self.connectors[(src, dst)][0]].road_id,
                self.graph.lanes[self.outgoing[dst][0]].road_id]


def four_way_junction(n_lanes: int = 2, arm_length: float = 150.0, speed_limit: float = 13.4,
                      turn_speed_limit: float = 8.0) -> Junction:
    """A signalised 4-way junction centred at the origin, ``n_lanes`` in and out on every arm.

    Movements: straight from every incoming lane to the same-index outgoing lane; left turn from
    the leftmost lane; right turn from the rightmost lane.
    """
    w = LANE_WIDTH
    half = n_lanes * w + 8.0  # room for right-turn radii of ~10 m
    graph = LaneGraph()
    incoming: dict[str, list[str]] = {}
    outgoing: dict[str, list[str]] = {}
    ends: dict[tuple[str, int], tuple[np.ndarray, float]] = {}
    starts: dict[tuple[str, int], tuple[np.ndarray, float]] = {}
    for k, arm in enumerate(ARMS):
        rot = k * math.pi / 2
        incoming[arm], outgoing[arm] = [], []
        for i in range(n_lanes):
            x = (i + 0.5) * w
            pts = _rotate(np.array([[x, -half - arm_length], [x, -half]]), rot)
            lane_id = f"{arm}_in{i}"
            graph.add(_lane(lane_id, pts, speed_limit, f"{arm}_in", i == n_lanes - 1,
                                left_neighbor=f"{arm}_in{i - 1}" if i > 0 else "",
                                right_neighbor=f"{arm}_in{i + 1}" if i < n_lanes - 1 else ""))
            incoming[arm].append(lane_id)
            ends[(arm, i)] = (pts[-1], math.pi / 2 + rot)
            pts = _rotate(np.array([[-x, -half], [-x, -half - arm_length]]), rot)
            lane_id = f"{arm}_out{i}"
            graph.add(_lane(lane_id, pts, speed_limit, f"{arm}_out", i == n_lanes - 1,
                                left_neighbor=f"{arm}_out{i - 1}" if i > 0 else "",
                                right_neighbor=f"{arm}_out{i + 1}" if i < n_lanes - 1 else ""))
            outgoing[arm].append(lane_id)
            starts[(arm, i)] = (pts[0], -math.pi / 2 + rot)
    connectors: dict[tuple[str, str], list[str]] = {}

    def connect(src: str, i: int, dst: str, j: int, limit: float) -> None:
        p0, h0 = ends[(src, i)]
        p1, h1 = starts[(dst, j)]
        if abs(math.sin(h1 - h0)) < 1e-6:
            centre, width = np.array([p0, p1]), w
        else:
            # Turning lanes are painted wider (swept-path widening): a car's overhangs and a
            # tracking controller's lag in a ~10 m radius turn take more than 3.5 m.
            centre, width = _turn(p0, h0, p1, h1), TURN_LANE_WIDTH
        lane_id = f"J_{src}{dst}{i}"
        graph.add(make_lane(lane_id, centre, width, limit, f"J_{src}{dst}", successors=[outgoing[dst][j]],
                            predecessors=[incoming[src][i]], in_junction=True))
        graph.lanes[incoming[src][i]].successors.append(lane_id)
        graph.lanes[outgoing[dst][j]].predecessors.append(lane_id)
        connectors.setdefault((src, dst), []).append(lane_id)

    for k, arm in enumerate(ARMS):
        straight, right, left = ARMS[(k + 2) % 4], ARMS[(k + 1) % 4], ARMS[(k + 3) % 4]
        for i in range(n_lanes):
            connect(arm, i, straight, i, speed_limit)
        connect(arm, n_lanes - 1, right, n_lanes - 1, turn_speed_limit)
        connect(arm, 0, left, 0, turn_speed_limit)
    return Junction(graph, incoming, outgoing, connectors, half, arm_length)
