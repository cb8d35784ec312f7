"""The PDM-style trajectory scorer: J_gen of the LUNA planner and the PDM-Closed baseline's scorer.

Proposals are simulated ego states ``(P, T+1, 8)`` laid out by ``luna_core.control.StateIndex``
(rear axle x, y, heading, velocity, acceleration, steering, steering rate, yaw rate) every ``dt``
from now. They are scored against a ``ScoringContext``: forecast object boxes on the same time grid
(``planning.forecast``; red lights on the route arrive there as static obstacles), the lane map
(drivable area, lane membership, lane directions), the route centreline and a speed limit.

Per proposal (PDM-Closed, tuplan_garage; nuPlan's at-fault rules):

* multiplicative: ``no_at_fault_collision`` (1; 0 for an at-fault collision with an agent or a red
  light, 0.5 if the worst is a static object), ``drivable_area`` (0 if any footprint corner leaves
  the lanes at any step), ``driving_direction`` (oncoming progress over any 1 s window: 1 below
  2 m, 0.5 below 6 m, else 0);
* weighted: ``progress`` 5 (along the centreline, normalised by the best proposal that passes the
  multiplicative terms; all 1 if that best is <= 0.1 m; if none passes, by the best of all),
  ``ttc`` 5 (0 if the ego box projected at constant velocity by +0, 0.3, 0.6, 0.9 s overlaps, at
  that future time, an object ahead of it, or one not behind it while the ego straddles lanes,
  leaves them or is in a junction), ``comfort`` 2 (nuPlan's comfort bounds over the horizon), and ``speed_limit``
  (nuPlan's max(0, 1 - mean over-speed / 2.23 m/s) over the horizon) with weight 0 in ``PDM_WEIGHTS``
  (PDM-Closed has no such term) and 4 in ``CLS_WEIGHTS`` (nuPlan's CLS; the LUNA planner's J_gen);
* total = product x weighted sum / sum of weights.

At-fault classification at the first overlap of a proposal with an object (later overlaps with it
are ignored): ego stopped (<= 0.05 m/s) -> not at fault; object stopped (<= 0.05 m/s) -> at fault;
object behind (> 150 deg off the ego heading, seen from the rear axle) -> not at fault; the ego's
front edge touches it -> at fault; otherwise (lateral) at fault only if the ego straddles lanes or
leaves them at that step. Step 0 (the current state) is not scored for collisions: no proposal can
change it.

Everything is vectorised over proposals; boxes overlap via ``luna_core.geometry`` (SAT).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from luna_core.blas import single_threaded_blas
from luna_core.collision_kinds import BEHIND_ANGLE, STOPPED_SPEED
from luna_core.control import BicycleParameters, StateIndex
from luna_core.geometry import proposals_vs_objects
from luna_core.lanes import LaneMap, Polyline
from luna_core.types import VehicleParameters, box_corners, wrap_angle

TTC_STOPPED_SPEED = 0.005  # m/s, below which TTC is not evaluated
AHEAD_ANGLE = np.deg2rad(30.0)  # nuPlan's is_agent_ahead tolerance (TTC relevance)
TTC_PROJECTION_STEPS = (0, 3, 6, 9)  # x 0.1 s: the ego box at +0, 0.3, 0.6, 0.9 s
PROGRESS_EPSILON = 0.1  # m: if the best progress is below this, everybody gets 1
DIRECTION_HORIZON = 1.0  # s
DIRECTION_COMPLIANCE = 2.0  # m of oncoming progress fully tolerated
DIRECTION_VIOLATION = 6.0  # m beyond which the proposal scores 0
# m/s: a proposal whose simulated ego runs backwards faster than this (beyond what its own state carries,
# see ``_no_reversing``) is infeasible. nuPlan's stopped-speed threshold: below it the at-fault rules count
# the ego as stopped.
REVERSING_TOLERANCE = 0.05
MAX_OVERSPEED = 2.23  # m/s

# nuPlan's comfort bounds (also used by luna_bridge.metrics for ego_is_comfortable).
MIN_LON_ACCEL = -4.05  # m/s^2
MAX_LON_ACCEL = 2.40
MAX_ABS_LAT_ACCEL = 4.89
MAX_ABS_YAW_ACCEL = 1.93  # rad/s^2
MAX_ABS_YAW_RATE = 0.95  # rad/s
MAX_ABS_LON_JERK = 4.13  # m/s^3
MAX_ABS_JERK = 8.37
SAVGOL_WINDOW = 15
SAVGOL_ORDER = 2


# --------------------------------------------------------------------------------------------------
# Comfort (nuPlan's ego_is_comfortable quantities, vectorised over leading axes)
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _savgol_operator(n: int, order: int, dt: float) -> np.ndarray:
    """(n, n) matrix of the Savitzky-Golay derivative (edges fitted by polynomials, scipy's 'interp'
    mode): the filter is linear in the signal, so applying it to the identity once gives an operator
    that filters a whole batch of proposals with one matrix product."""
    # Imported here: scipy.signal takes 1-2 s to import, which the reflection client (which imports this
    # module through luna_core.hindsight) would otherwise pay at every restart before it can subscribe.
    from scipy.signal import savgol_filter

    window = min(SAVGOL_WINDOW, n if n % 2 else n - 1)
    return savgol_filter(np.eye(n), window, SAVGOL_ORDER, deriv=order, delta=dt, axis=0)


def _derivative(y: np.ndarray, dt: float, order: int) -> np.ndarray:
    return y @ _savgol_operator(y.shape[-1], order, float(dt)).T


def comfort_quantities(velocity: np.ndarray, heading: np.ndarray, dt: float) -> dict[str, np.ndarray]:
    """Savitzky-Golay (window 15, order 2, as nuPlan's extractors) estimates along the last axis
    (>= 4 samples): longitudinal acceleration (derivative of velocity), lateral acceleration
    (speed x yaw rate), yaw rate, yaw acceleration, longitudinal jerk and jerk magnitude."""
    h = np.unwrap(heading, axis=-1)
    lon_accel = _derivative(velocity, dt, 1)
    yaw_rate = _derivative(h, dt, 1)
    lat_accel = np.abs(velocity) * yaw_rate
    return {"lon_acceleration": lon_accel, "lat_acceleration": lat_accel, "yaw_rate": yaw_rate,
            "yaw_acceleration": _derivative(h, dt, 2), "lon_jerk": _derivative(lon_accel, dt, 1),
            "jerk": _derivative(np.hypot(lon_accel, lat_accel), dt, 1)}


def comfort_within_bounds(q: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per quantity, True where the whole series (last axis) is within nuPlan's bounds."""
    return {"lon_acceleration": np.all((q["lon_acceleration"] >= MIN_LON_ACCEL)
                                       & (q["lon_acceleration"] <= MAX_LON_ACCEL), axis=-1),
            "lat_acceleration": np.all(np.abs(q["lat_acceleration"]) <= MAX_ABS_LAT_ACCEL, axis=-1),
            "yaw_rate": np.all(np.abs(q["yaw_rate"]) <= MAX_ABS_YAW_RATE, axis=-1),
            "yaw_acceleration": np.all(np.abs(q["yaw_acceleration"]) <= MAX_ABS_YAW_ACCEL, axis=-1),
            "lon_jerk": np.all(np.abs(q["lon_jerk"]) <= MAX_ABS_LON_JERK, axis=-1),
            "jerk": np.all(np.abs(q["jerk"]) <= MAX_ABS_JERK, axis=-1)}


# --------------------------------------------------------------------------------------------------
# Lane occupancy (shared with luna_bridge.metrics)
# --------------------------------------------------------------------------------------------------


def lane_membership(lanes: LaneMap, points: np.ndarray) -> np.ndarray:
    """(..., L) bool: point (..., 2) inside lane ``lanes.ids[l]`` (polygon, border included)."""
    pts = np.asarray(points, dtype=np.float64)
    flat = pts.reshape(-1, 2)
    out = lanes.lane_raster.membership(flat[:, 0], flat[:, 1])
    return out.reshape(pts.shape[:-1] + (len(lanes.ids),))


def _connection_matrix(lanes: LaneMap) -> np.ndarray:
    """(L, L): lane l and lane m are the same lane or connected end to end."""
    index = {lane_id: j for j, lane_id in enumerate(lanes.ids)}
    c = np.eye(len(lanes.ids), dtype=bool)
    for j, lane_id in enumerate(lanes.ids):
        lane = lanes.graph.lanes[lane_id]
        for other in (*lane.successors, *lane.predecessors):
            if other in index:
                c[j, index[other]] = c[index[other], j] = True
    return c


def in_common_or_connected_lanes(lanes: LaneMap, corners: np.ndarray) -> np.ndarray:
    """(...,) True where all 4 footprint corners (..., 4, 2) lie in one lane or in lanes connected
    end to end (nuPlan's ego_lane_change test); False when straddling lanes or off the lanes."""
    if np.shape(corners)[-2:] != (4, 2):
        raise ValueError(f"footprint corners must be (..., 4, 2), got {np.shape(corners)}")
    member = lane_membership(lanes, corners)  # (..., 4, L)
    if member.shape[-1] == 0:
        return np.zeros(member.shape[:-2], dtype=bool)
    flat = member.reshape(-1, member.shape[-1])  # (corners, L)
    c = _connection_matrix(lanes)
    # Boolean rows, lane by lane, not a (corners x L) @ (L x L) product: only the lanes holding some
    # corner (a few of a junction map's L) put corners in families, each in its few connected lanes'.
    # A product costs L x L per corner, and NumPy runs it without BLAS for integers, or with
    # OpenBLAS threads for floats, which stall on the shared cores (15x slower than one thread).
    used = np.flatnonzero(flat.any(axis=0))
    families = np.flatnonzero(c[used].any(axis=0))
    row = np.zeros(len(c), dtype=int)
    row[families] = np.arange(len(families))
    in_family = np.zeros((len(families), len(flat)), dtype=bool)  # corner in lane families[f]'s family
    for lane, hits in zip(used, np.ascontiguousarray(flat[:, used].T)):
        for f in np.flatnonzero(c[lane]):
            in_family[row[f]] |= hits
    # A footprint's 4 corners are 4 consecutive bytes of a row: all in the family when their uint32
    # is 0x01010101 (one comparison instead of a reduction over an axis of length 4).
    all_four = in_family.view(np.uint32) == 0x01010101
    return np.any(all_four, axis=0).reshape(member.shape[:-2])


def oncoming_mask(lanes: LaneMap, points: np.ndarray, heading: np.ndarray) -> np.ndarray:
    """(...,) True where a point (..., 2) with ``heading`` lies in some lane but in none whose
    direction agrees with the heading (within 90 deg): driving against the traffic flow."""
    pts = np.asarray(points, dtype=np.float64)
    member = lane_membership(lanes, pts)
    flat = member.reshape(-1, member.shape[-1])
    xy, h = pts.reshape(-1, 2), np.broadcast_to(heading, member.shape[:-1]).reshape(-1)
    agree = np.zeros(len(flat), dtype=bool)
    lane, point = np.nonzero(flat.T)  # (lane, point) pairs, lane by lane: only the lanes holding points
    bounds = np.flatnonzero(np.diff(lane)) + 1
    for j, idx in zip(lane[np.r_[0, bounds]] if len(lane) else [], np.split(point, bounds)):
        idx = idx[~agree[idx]]  # a point that agrees with one lane needs no other
        if len(idx):
            proj = lanes.centerlines[lanes.ids[j]].project(xy[idx])
            agree[idx] = np.abs(wrap_angle(h[idx] - proj.heading)) < np.pi / 2
    return (flat.any(axis=-1) & ~agree).reshape(member.shape[:-1])


# --------------------------------------------------------------------------------------------------
# Context and results
# --------------------------------------------------------------------------------------------------


@dataclass
class ObjectBoxes:
    """Forecast object boxes on the proposals' time grid (what ``planning.forecast`` produces)."""

    ids: list[str]
    pose: np.ndarray  # (N, T+1, 3) box centre x, y, heading
    size: np.ndarray  # (N, 2) length, width
    speed: np.ndarray  # (N,) m/s along the heading
    static: np.ndarray  # (N,) bool: static object (a collision costs 0.5, not 0)
    red_light: np.ndarray  # (N,) bool: a red light turned obstacle (a collision costs 0)

    @property
    def num_objects(self) -> int:
        return len(self.ids)

    def corners(self) -> np.ndarray:
        """(N, T+1, 4, 2)."""
        p, s = self.pose, self.size
        return box_corners(p[..., 0], p[..., 1], p[..., 2], s[:, None, 0], s[:, None, 1])

    @classmethod
    def empty(cls, steps: int) -> "ObjectBoxes":
        return cls([], np.zeros((0, steps, 3)), np.zeros((0, 2)), np.zeros(0), np.zeros(0, dtype=bool),
                   np.zeros(0, dtype=bool))

    def window(self, start: int, stop: int | None = None) -> "ObjectBoxes":
        """The same objects over time steps [start, stop) only."""
        return ObjectBoxes(self.ids, self.pose[:, start:stop], self.size, self.speed, self.static, self.red_light)

    def subset(self, rows: np.ndarray) -> "ObjectBoxes":
        """The objects where ``rows`` (a boolean mask over objects) is true."""
        keep = np.flatnonzero(rows)
        return ObjectBoxes([self.ids[k] for k in keep], self.pose[keep], self.size[keep], self.speed[keep],
                           self.static[keep], self.red_light[keep])


@dataclass
class ScoringContext:
    lanes: LaneMap
    centerline: Polyline  # the route centreline progress is measured along
    objects: ObjectBoxes
    speed_limit: float = 0.0  # m/s; 0 = unknown (no speed-limit term)
    vehicle: VehicleParameters = VehicleParameters()
    dt: float = 0.1


@dataclass(frozen=True)
class ScorerWeights:
    progress: float = 5.0
    ttc: float = 5.0
    comfort: float = 2.0
    speed_limit: float = 0.0  # nuPlan's CLS uses 4; PDM-Closed has no speed-limit term

    @property
    def total(self) -> float:
        return self.progress + self.ttc + self.comfort + self.speed_limit


PDM_WEIGHTS = ScorerWeights()  # PDM-Closed's weighting: no speed-limit term
# nuPlan's closed-loop score weighs the speed limit 4 beside progress 5, TTC 5 and comfort 2: the LUNA
# planner's J_gen and the simulation-grounded teacher use it, so no plan trades the limit for progress.
CLS_WEIGHTS = ScorerWeights(speed_limit=4.0)


@dataclass
class ProposalScores:
    """Per-proposal terms (P,) and the total; ``best`` is the argmax of ``total`` (first on ties)."""

    no_at_fault_collision: np.ndarray
    drivable_area: np.ndarray
    driving_direction: np.ndarray
    no_reversing: np.ndarray  # 1 where the ego never drives backwards (``_no_reversing``), else 0
    progress: np.ndarray  # normalised
    raw_progress: np.ndarray  # m along the centreline
    ttc: np.ndarray
    comfort: np.ndarray
    speed_limit: np.ndarray
    multiplicative: np.ndarray
    weighted: np.ndarray  # weighted mean of the weighted terms
    total: np.ndarray
    time_to_at_fault_collision: np.ndarray  # s from now, inf if none

    @property
    def best(self) -> int:
        """argmax of ``total``; when every total is 0, the argmax of ``least_bad_key`` (e.g. every
        proposal clips the drivable area in a tight turn: the least bad one, not proposal 0)."""
        if np.max(self.total) > 0.0:
            return int(np.argmax(self.total))
        return int(np.argmax(self.least_bad_key()))

    def least_bad_key(self, weighted: np.ndarray | None = None) -> np.ndarray:
        """PDM-Closed's ranking when nothing is feasible, the larger the better: 0 with an at-fault
        collision; otherwise a proposal that does not drive backwards before one that does, then the
        weighted score (``weighted`` in [0, 1], default ``self.weighted``). Without the reversing rank a
        least-bad pick backed the ego into the traffic behind it (Session 21); IDM proposals never
        reverse, so PDM-Closed's own picks are unchanged."""
        w = self.weighted if weighted is None else weighted
        # forward keys lie in [3, 4], reversing ones in [1, 2]: the weighted score never crosses the rank
        return self.no_at_fault_collision * (1.0 + 2.0 * self.no_reversing + w)


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


def ego_corners(states: np.ndarray, vehicle: VehicleParameters) -> np.ndarray:
    """(P, T+1, 4, 2) footprints of rear-axle states (P, T+1, >=3)."""
    h = states[..., StateIndex.HEADING]
    d = vehicle.rear_axle_to_center
    cx = states[..., StateIndex.X] + d * np.cos(h)
    cy = states[..., StateIndex.Y] + d * np.sin(h)
    return box_corners(cx, cy, h, vehicle.length, vehicle.width)


def _relative_angle(states: np.ndarray, obj_xy: np.ndarray, pairs: tuple[np.ndarray, ...]) -> np.ndarray:
    """|angle| between the ego heading and the line of sight from the rear axle to the object
    centre, for the (proposal, object, step) index triples ``pairs`` only; ``states`` (P, T', >=3),
    ``obj_xy`` (N, T', 2). The rules need it only where boxes meet (a few of the P x N x T' pairs),
    and element by element it is the same arithmetic as over all pairs."""
    p, n, t = pairs
    rel = obj_xy[n, t] - states[p, t, :2]
    bearing = np.arctan2(rel[..., 1], rel[..., 0])
    return np.abs(wrap_angle(bearing - states[p, t, StateIndex.HEADING]))


def _collisions(states: np.ndarray, corners: np.ndarray, ctx: ScoringContext,
                multi_lane: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """No-at-fault-collision score (P,), time of the first at-fault collision (P,) and the
    any-collision-so-far mask (P, N, T+1) used to drop collided objects from TTC."""
    p, steps = states.shape[:2]
    obj = ctx.objects
    n = obj.num_objects
    if n == 0:
        return np.ones(p), np.full(p, np.inf), np.zeros((p, 0, steps), dtype=bool)
    obj_corners = obj.corners()
    # The ego boxes are box_corners of states checked finite on entry: no need to validate them.
    overlap = proposals_vs_objects(corners, obj_corners, backend="numpy", validate_proposals=False)  # (P, N, T+1)
    overlap[..., 0] = False
    first = overlap & (np.cumsum(overlap, axis=-1) == 1)
    collided = np.cumsum(overlap, axis=-1) > 0
    front_edge = corners[..., [0, 3, 3, 0], :]  # zero-width boxes: the front bumper segments
    front = proposals_vs_objects(front_edge, obj_corners, backend="numpy", validate_proposals=False)
    ego_stopped = states[..., StateIndex.VELOCITY] <= STOPPED_SPEED  # (P, T+1)
    obj_stopped = obj.speed <= STOPPED_SPEED  # (N,)
    pairs = np.nonzero(first & ~ego_stopped[:, None])  # the first contacts the ego drove into
    pi, ni, ti = pairs
    behind = _relative_angle(states, obj.pose[..., :2], pairs) > BEHIND_ANGLE
    at_fault = np.zeros_like(first)
    at_fault[pairs] = obj_stopped[ni] | (~behind & (front[pairs] | multi_lane[pi, ti]))
    penalty = np.where(obj.static & ~obj.red_light, 0.5, 0.0)  # score after an at-fault collision
    score = np.min(np.where(at_fault.any(-1), penalty[None], 1.0), axis=1)
    any_fault = at_fault.any(axis=1)  # (P, T+1)
    t_fault = np.where(any_fault.any(-1), np.argmax(any_fault, axis=-1) * ctx.dt, np.inf)
    return score, t_fault, collided


def in_junction(lanes: LaneMap, points: np.ndarray) -> np.ndarray:
    """(...,) True where a point (..., 2) lies in a junction lane (nuPlan's INTERSECTION layer)."""
    junction = [j for j, lane_id in enumerate(lanes.ids) if lanes.graph.lanes[lane_id].in_junction]
    return lane_membership(lanes, points)[..., junction].any(axis=-1)


def _ttc(states: np.ndarray, corners: np.ndarray, ctx: ScoringContext, collided: np.ndarray,
         multi_lane: np.ndarray) -> np.ndarray:
    """1 unless the ego box projected ahead at constant velocity meets a relevant object: one ahead
    (within 30 deg of the heading, seen from the rear axle), or, while the ego straddles lanes,
    leaves them (``multi_lane``, P x T+1) or is in a junction, any object not behind it (> 150 deg).
    PDM-Closed's and nuPlan's rule; the angle is taken from the unprojected ego state. The junction
    test (point in polygon for every junction lane) only runs for the proposal steps where an
    object beside the ego is hit: usually none."""
    p, steps = states.shape[:2]
    obj = ctx.objects
    ok = np.ones(p, dtype=bool)
    if obj.num_objects == 0:
        return ok.astype(np.float64)
    obj_corners = obj.corners()
    moving = states[..., StateIndex.VELOCITY] > TTC_STOPPED_SPEED  # (P, T+1)
    h = states[..., StateIndex.HEADING]
    direction = np.stack([np.cos(h), np.sin(h)], -1)  # (P, T+1, 2)
    for k in TTC_PROJECTION_STEPS:
        if k >= steps:
            break
        t_now = slice(1, steps - k)  # ego time steps t (step 0 is not scored) whose t + k exists
        shift = (states[:, t_now, StateIndex.VELOCITY] * k * ctx.dt)[..., None, None] * direction[:, t_now, None]
        ego_future = corners[:, t_now] + shift  # (P, T', 4, 2)
        fut = slice(1 + k, steps)
        hit = proposals_vs_objects(ego_future, obj_corners[:, fut], backend="numpy",
                                   validate_proposals=False)  # (P, N, T')
        hit &= ~collided[:, :, t_now] & moving[:, None, t_now]
        pairs = np.nonzero(hit)  # the angle rules only matter where the boxes meet
        pi, _, ti = pairs
        angle = _relative_angle(states[:, t_now], obj.pose[:, fut, :2], pairs)
        counts = angle <= BEHIND_ANGLE
        beside = counts & (angle >= AHEAD_ANGLE)
        if beside.any():  # proposal steps where only the wide rule can count
            bp, bt = pi[beside], ti[beside]
            wide = np.zeros(hit.shape[::2], dtype=bool)
            wide[bp, bt] = multi_lane[bp, bt + 1] | in_junction(ctx.lanes, states[bp, bt + 1, :2])
            counts &= (angle < AHEAD_ANGLE) | wide[pi, ti]
        ok[pi[counts]] = False
    return ok.astype(np.float64)


def _driving_direction(states: np.ndarray, ctx: ScoringContext) -> np.ndarray:
    h = states[..., StateIndex.HEADING]
    d = ctx.vehicle.rear_axle_to_center
    centre = np.stack([states[..., StateIndex.X] + d * np.cos(h), states[..., StateIndex.Y] + d * np.sin(h)], -1)
    oncoming = oncoming_mask(ctx.lanes, centre, h)  # (P, T+1)
    step = np.concatenate([np.zeros(states.shape[:1] + (1,)),
                           np.hypot(*np.diff(centre, axis=1).transpose(2, 0, 1))], axis=1)
    progress = np.where(oncoming, step, 0.0)
    n = int(round(DIRECTION_HORIZON / ctx.dt))
    csum = np.concatenate([np.zeros((len(states), 1)), np.cumsum(progress, axis=1)], axis=1)
    idx = np.arange(states.shape[1])
    window = csum[:, idx + 1] - csum[:, np.maximum(idx - n, 0)]
    worst = window.max(axis=1)
    return np.where(worst < DIRECTION_COMPLIANCE, 1.0, np.where(worst < DIRECTION_VIOLATION, 0.5, 0.0))


def _no_reversing(states: np.ndarray, accel_time_constant: float = BicycleParameters.accel_time_constant
                  ) -> np.ndarray:
    """1 for a proposal whose simulated velocity never falls below the floor below, else 0. The tracker
    follows the poses it is given, backwards too: a Diffusion-ES member whose waypoints fall back along
    the heading reversed the ego at up to 1 m/s into traffic behind and beside it (docs/benchmarks.md,
    "Session 20"). A car on the road waits instead; PDM-Closed's IDM proposals never reverse, so this
    term is a multiplier it always passes.

    The floor is what the ego's own state carries it to: the bicycle's first-order actuator lag (time
    constant tau) lets a braking ego (acceleration a0 < 0) lose a further |a0| tau of speed after a zero
    command, so an ego stopping hard rolls back a little even under a plan that stops (counted against
    the plan, that plan would be infeasible). An ego not yet rolling back is granted
    ``REVERSING_TOLERANCE`` below that; one already rolling back is not, or each cycle's plan could roll
    it back a little faster than the last (a creep seen at 0.11 m/s, Session 21)."""
    v = states[..., StateIndex.VELOCITY]
    v0 = v[:, 0]
    carried = v0 + np.minimum(states[:, 0, StateIndex.ACCELERATION], 0.0) * accel_time_constant
    floor = np.where(v0 >= 0.0, np.minimum(carried, 0.0) - REVERSING_TOLERANCE,
                     np.minimum(carried, -REVERSING_TOLERANCE))
    return np.all(v[:, 1:] >= floor[:, None], axis=1).astype(np.float64)


def score_proposals(states: np.ndarray, ctx: ScoringContext, weights: ScorerWeights = PDM_WEIGHTS,
                    drivable_area: np.ndarray | None = None) -> ProposalScores:
    """Score simulated proposals ``(P, T+1, 8)`` (``[:, 0]`` = the current state). ``drivable_area``
    (P,) in {0, 1}: the term as the caller judged it (the teacher's rollouts,
    ``action_outcomes.drivable_with_tolerance``); None: every footprint corner inside, as PDM-Closed."""
    with single_threaded_blas():  # the comfort derivatives are small products (luna_core.blas)
        return _score_proposals(states, ctx, weights, drivable_area)


def _score_proposals(states: np.ndarray, ctx: ScoringContext, weights: ScorerWeights,
                     drivable_area: np.ndarray | None) -> ProposalScores:
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 3 or states.shape[1] < 2 or states.shape[2] < len(StateIndex):
        raise ValueError(f"proposal states must be (P, T+1>=2, {len(StateIndex)}), got {states.shape}")
    if not np.all(np.isfinite(states)):
        bad = np.argwhere(~np.isfinite(states))[0]
        raise ValueError(f"proposal states contain non-finite values (proposal {bad[0]}, step {bad[1]})")
    if ctx.objects.pose.shape[1] != states.shape[1]:
        raise ValueError(f"forecast has {ctx.objects.pose.shape[1]} steps, proposals {states.shape[1]}")
    p = len(states)
    corners = ego_corners(states, ctx.vehicle)

    multi_lane = ~in_common_or_connected_lanes(ctx.lanes, corners)  # (P, T+1)
    no_collision, t_fault, collided = _collisions(states, corners, ctx, multi_lane)
    drivable = (np.all(ctx.lanes.in_drivable_area(corners[:, 1:]), axis=(1, 2)).astype(np.float64)
                if drivable_area is None else np.asarray(drivable_area, dtype=np.float64))
    direction = _driving_direction(states, ctx)
    forward = _no_reversing(states)
    multiplicative = no_collision * drivable * direction * forward

    ends = ctx.centerline.project(states[:, [0, -1], :2]).s  # (P, 2): progress needs the ends only
    raw_progress = ends[:, 1] - ends[:, 0]
    # Normalised by the best proposal passing the multiplicative terms; if none passes (every total
    # is 0 anyway) by the best of all, so that ``best``'s fallback still prefers progress.
    valid = multiplicative > 0
    best = float(np.max(raw_progress[valid] if valid.any() else raw_progress)) if p else 0.0
    progress = np.clip(raw_progress / best, 0.0, 1.0) if best > PROGRESS_EPSILON else np.ones(p)

    ttc = _ttc(states, corners, ctx, collided, multi_lane)
    if states.shape[1] >= SAVGOL_ORDER + 2:
        q = comfort_quantities(states[..., StateIndex.VELOCITY], states[..., StateIndex.HEADING], ctx.dt)
        comfort = np.all(np.stack(list(comfort_within_bounds(q).values())), axis=0).astype(np.float64)
    else:
        comfort = np.ones(p)
    if ctx.speed_limit > 0:
        over = np.maximum(np.abs(states[..., StateIndex.VELOCITY]) - ctx.speed_limit, 0.0)
        speed = np.maximum(0.0, 1.0 - over.mean(axis=1) / MAX_OVERSPEED)
    else:
        speed = np.ones(p)
    weighted = (weights.progress * progress + weights.ttc * ttc + weights.comfort * comfort
                + weights.speed_limit * speed) / weights.total
    return ProposalScores(no_collision, drivable, direction, forward, progress, raw_progress, ttc, comfort, speed,
                          multiplicative, weighted, multiplicative * weighted, t_fault)
