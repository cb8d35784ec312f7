"""Data types shared by every part of the stack.

Conventions (REP-103): x forward / east, y left / north, z up; angles in radians, counter-clockwise
positive, wrapped to [-pi, pi]; SI units everywhere (m, s, m/s, m/s^2); times are float seconds on the
stack's clock (the node clock, which is simulation time under ``use_sim_time``).

Ego poses refer to the rear axle (as in nuPlan and Autoware's ``base_link``); object poses refer to
the bounding-box centre. ``VehicleParameters`` converts between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Protocol, Sequence

import numpy as np

# --------------------------------------------------------------------------------------------------
# Action space (LUNA-AD Sec. III-B, DESIGN Sec. 4)
# --------------------------------------------------------------------------------------------------


class Longitudinal(str, Enum):
    ACCELERATE = "A"
    CRUISE = "C"
    DECELERATE = "D"
    STOP = "S"


class Lateral(str, Enum):
    LEFT_LANE_CHANGE = "L"
    LANE_KEEP = "K"
    RIGHT_LANE_CHANGE = "R"


#: The 10 action classes in their canonical order (index = class id everywhere: heads, messages, files).
ACTION_CODES: tuple[str, ...] = ("AK", "AL", "AR", "CK", "CL", "CR", "DK", "DL", "DR", "SK")
NUM_ACTIONS = len(ACTION_CODES)
ACTION_INDEX: dict[str, int] = {code: i for i, code in enumerate(ACTION_CODES)}

_LON_NAMES = {"A": "Accelerate", "C": "Cruise", "D": "Decelerate", "S": "Stop"}
_LAT_NAMES = {"L": "Left Lane-Change", "K": "Lane Keep", "R": "Right Lane-Change"}


@dataclass(frozen=True)
class Action:
    """One discrete driving decision: a longitudinal x lateral pair (linguistic notation Xi(a))."""

    longitudinal: Longitudinal
    lateral: Lateral

    @property
    def code(self) -> str:
        return self.longitudinal.value + self.lateral.value

    @property
    def index(self) -> int:
        return ACTION_INDEX[self.code]

    @property
    def description(self) -> str:
        return f"{_LON_NAMES[self.longitudinal.value]} x {_LAT_NAMES[self.lateral.value]}"

    @classmethod
    def from_code(cls, code: str) -> "Action":
        if code not in ACTION_INDEX:
            raise ValueError(f"unknown action code {code!r}; valid codes: {', '.join(ACTION_CODES)}")
        return cls(Longitudinal(code[0]), Lateral(code[1]))

    @classmethod
    def from_index(cls, index: int) -> "Action":
        if not 0 <= index < NUM_ACTIONS:
            raise ValueError(f"action index {index} out of range 0..{NUM_ACTIONS - 1}")
        return cls.from_code(ACTION_CODES[index])


ACTIONS: tuple[Action, ...] = tuple(Action.from_code(c) for c in ACTION_CODES)


def action_mask(has_left_lane: bool, has_right_lane: bool, in_junction: bool) -> np.ndarray:
    """Boolean mask over ACTION_CODES of the actions possible here.

    Inside a junction the lateral choice is restricted to following navigation (K); a lane change is
    impossible towards a side without a lane in the same direction.
    """
    mask = np.ones(NUM_ACTIONS, dtype=bool)
    for i, code in enumerate(ACTION_CODES):
        lat = code[1]
        if lat == "L" and (in_junction or not has_left_lane):
            mask[i] = False
        if lat == "R" and (in_junction or not has_right_lane):
            mask[i] = False
    return mask


def mask_and_renormalise(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Zero the masked actions and renormalise; if nothing allowed has mass, spread it uniformly."""
    p = np.where(mask, np.asarray(probs, dtype=np.float64), 0.0)
    total = p.sum()
    if not np.isfinite(total) or total <= 0.0:
        p = mask.astype(np.float64)
        total = p.sum()
    return p / total


# --------------------------------------------------------------------------------------------------
# Geometry helpers
# --------------------------------------------------------------------------------------------------


def wrap_angle(angle: float | np.ndarray) -> float | np.ndarray:
    """Wrap an angle (rad) to [-pi, pi]."""
    wrapped = np.arctan2(np.sin(angle), np.cos(angle))
    return float(wrapped) if np.ndim(wrapped) == 0 else wrapped


@dataclass(frozen=True)
class VehicleParameters:
    """Ego geometry relative to the rear axle; defaults are nuPlan's Chrysler Pacifica."""

    width: float = 2.297
    front_length: float = 4.049  # rear axle -> front bumper (m)
    rear_length: float = 1.127  # rear axle -> rear bumper (m)
    wheelbase: float = 3.089
    cog_position_from_rear_axle: float = 1.67

    @property
    def length(self) -> float:
        return self.front_length + self.rear_length

    @property
    def rear_axle_to_center(self) -> float:
        """Distance (m) from the rear axle forward to the bounding-box centre."""
        return (self.front_length - self.rear_length) / 2.0

    def center_from_rear_axle(self, x: float, y: float, heading: float) -> tuple[float, float]:
        d = self.rear_axle_to_center
        return x + d * math.cos(heading), y + d * math.sin(heading)

    def rear_axle_from_center(self, x: float, y: float, heading: float) -> tuple[float, float]:
        d = self.rear_axle_to_center
        return x - d * math.cos(heading), y - d * math.sin(heading)


def box_corners(x: np.ndarray | float, y: np.ndarray | float, heading: np.ndarray | float,
                length: np.ndarray | float, width: np.ndarray | float) -> np.ndarray:
    """Corners (..., 4, 2) of centred boxes, counter-clockwise from front-left."""
    x, y, heading, length, width = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                                        for v in (x, y, heading, length, width)))
    c, s = np.cos(heading)[..., None], np.sin(heading)[..., None]
    hl, hw = length / 2.0, width / 2.0
    lx = np.stack([hl, -hl, -hl, hl], -1)  # (..., 4) corners in the box frame
    ly = np.stack([hw, hw, -hw, -hw], -1)
    # The rotation written out (the same products and sums as a rotation-matrix product, which
    # costs more as an einsum over axes of length 2).
    return np.stack([c * lx + (-s) * ly + x[..., None], s * lx + c * ly + y[..., None]], -1)


# --------------------------------------------------------------------------------------------------
# Perception, map, route
# --------------------------------------------------------------------------------------------------


class ObjectClass(str, Enum):
    VEHICLE = "vehicle"
    PEDESTRIAN = "pedestrian"
    BICYCLE = "bicycle"
    STATIC = "static"  # cones, barriers, parked/broken-down objects reported as static

    @property
    def is_vru(self) -> bool:
        return self in (ObjectClass.PEDESTRIAN, ObjectClass.BICYCLE)


class TrafficLightPhase(str, Enum):
    GREEN = "Green"
    YELLOW = "Yellow"
    RED = "Red"
    NONE = "None"  # no light, or unknown


class Navigation(str, Enum):
    NONE = "None"
    LEFT = "Left"
    RIGHT = "Right"
    STRAIGHT = "Straight"


class RoadSection(str, Enum):
    NORMAL_MULTI_LANE = "Normal Multi-Lane"
    NEAR_JUNCTION = "Multi-Lane Near Junction"
    JUNCTION = "Junction"


@dataclass
class EgoState:
    """Ego state at the rear axle in the map frame."""

    stamp: float
    x: float
    y: float
    heading: float
    velocity: float  # longitudinal speed (m/s), negative when reversing
    acceleration: float = 0.0  # longitudinal (m/s^2)
    yaw_rate: float = 0.0  # rad/s
    steering_angle: float | None = None  # rad, front wheels; None: not measured (odometry carries none)
    lateral_velocity: float = 0.0  # m/s

    def is_finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.stamp, self.x, self.y, self.heading, self.velocity,
                                               self.acceleration, self.yaw_rate, self.lateral_velocity,
                                               0.0 if self.steering_angle is None else self.steering_angle))


@dataclass
class TrackedObject:
    """A perceived object: box centre, heading and velocity in the map frame."""

    id: str
    object_class: ObjectClass
    x: float
    y: float
    heading: float
    vx: float  # map-frame velocity (m/s)
    vy: float
    length: float
    width: float

    @property
    def speed(self) -> float:
        return math.hypot(self.vx, self.vy)

    def is_finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.x, self.y, self.heading, self.vx, self.vy,
                                               self.length, self.width))


@dataclass
class TrackedObjects:
    stamp: float
    objects: list[TrackedObject] = field(default_factory=list)


#: Footprint (length, width) in m assumed for an object whose reported size is unknown (NaN, inf, zero or
#: negative): a large member of its class, so the safety logic keeps a margin around an object whose
#: position it knows instead of losing it. STATIC covers barriers and debris, not parked cars (vehicles).
DEFAULT_FOOTPRINT: dict[ObjectClass, tuple[float, float]] = {
    ObjectClass.VEHICLE: (5.5, 2.3),
    ObjectClass.BICYCLE: (2.2, 1.0),
    ObjectClass.PEDESTRIAN: (1.0, 1.0),
    ObjectClass.STATIC: (2.0, 2.0),
}


@dataclass
class UsableObjects:
    """The result of :func:`usable_objects`: what the safety logic may use, and what was done to get it."""

    objects: list[TrackedObject]  # finite, positive size; repaired copies where needed; input order
    assumed: dict[str, str] = field(default_factory=dict)  # object id -> what was assumed for it
    dropped: dict[str, str] = field(default_factory=dict)  # object id -> why it was left out
    beyond_cap: int = 0  # objects left out by the distance cap (the farthest)
    cap: int | None = None  # the cap that applied
    capped_by_distance: bool = True  # False: no origin was given, the first ``cap`` were kept
    total: int = 0  # objects in the input

    def problems(self) -> str:
        """One line for diagnostics ('' when every object was usable as reported)."""
        parts = []
        if self.assumed:
            ids = ", ".join(sorted(self.assumed)[:5])
            parts.append(f"{len(self.assumed)} object(s) kept with assumed fields ({ids}): "
                         f"{next(iter(self.assumed.values()))}")
        if self.dropped:
            parts.append(f"{len(self.dropped)} object(s) without a usable position left out "
                         f"({', '.join(sorted(self.dropped)[:5])})")
        if self.beyond_cap:
            if self.capped_by_distance:
                parts.append(f"{self.total} objects in one message: kept the {self.cap} nearest, left out the "
                             f"{self.beyond_cap} farthest")
            else:
                parts.append(f"{self.total} objects in one message: kept the first {self.cap} (no ego position "
                             f"yet), left out {self.beyond_cap}")
        return "; ".join(parts)


def usable_objects(objects: Iterable[TrackedObject], origin: tuple[float, float] | None = None,
                   max_count: int | None = None) -> UsableObjects:
    """The one rule for tracked objects with unknown fields, shared by the scene descriptor, the planners
    and the progress monitor (an object is never lost while its position is known):

    * unknown position (x or y not finite): cannot be placed, so it is left out (reported);
    * unknown size (length or width not finite, or not positive): the class's ``DEFAULT_FOOTPRINT``;
    * unknown heading: heading 0 and a square as wide as the box's diagonal (covers every heading);
    * unknown velocity: standing still at its position.

    With ``max_count``, only the ``max_count`` objects nearest ``origin`` (x, y) are kept, the first ones
    without an origin (the rest counted in ``beyond_cap``): a flood of objects must not starve the stack.
    """
    out = UsableObjects([])
    for obj in objects:
        out.total += 1
        if not (math.isfinite(obj.x) and math.isfinite(obj.y)):
            out.dropped[obj.id] = "unknown position"
            continue
        if obj.is_finite() and obj.length > 0.0 and obj.width > 0.0:
            out.objects.append(obj)
            continue
        assumed = []
        length, width = obj.length, obj.width
        if not (math.isfinite(length) and length > 0.0 and math.isfinite(width) and width > 0.0):
            default = DEFAULT_FOOTPRINT[obj.object_class]
            length = length if math.isfinite(length) and length > 0.0 else default[0]
            width = width if math.isfinite(width) and width > 0.0 else default[1]
            assumed.append(f"size {length:g} x {width:g} m")
        heading = obj.heading
        if not math.isfinite(heading):
            heading = 0.0
            length = width = math.hypot(length, width)
            assumed.append(f"heading unknown: {length:.1f} m square")
        vx, vy = obj.vx, obj.vy
        if not (math.isfinite(vx) and math.isfinite(vy)):
            vx = vy = 0.0
            assumed.append("standing still")
        out.assumed[obj.id] = ", ".join(assumed)
        out.objects.append(TrackedObject(obj.id, obj.object_class, obj.x, obj.y, heading, vx, vy, length, width))
    if max_count is not None and len(out.objects) > max_count:
        out.beyond_cap, out.cap, out.capped_by_distance = len(out.objects) - max_count, max_count, origin is not None
        if origin is None:  # no ego position yet: the first ones, a flood must not wait for odometry
            out.objects = out.objects[:max_count]
        else:
            d = np.hypot([o.x - origin[0] for o in out.objects], [o.y - origin[1] for o in out.objects])
            keep = np.sort(np.argsort(d, kind="stable")[:max_count])  # the nearest, in input order
            out.objects = [out.objects[k] for k in keep]
    return out


@dataclass
class TrafficLightState:
    """Phase of the light that controls entering ``lane_id`` (a junction connector lane)."""

    lane_id: str
    phase: TrafficLightPhase


@dataclass
class TrafficLights:
    stamp: float
    lights: list[TrafficLightState] = field(default_factory=list)


@dataclass
class Lane:
    """One lane of the lane graph. Polylines are (N, 2) arrays in the map frame (m)."""

    id: str
    centerline: np.ndarray
    left_boundary: np.ndarray
    right_boundary: np.ndarray
    speed_limit: float  # m/s; 0 = unknown
    road_id: str = ""  # lanes with the same road_id form one road section (nuPlan roadblock)
    successors: list[str] = field(default_factory=list)
    predecessors: list[str] = field(default_factory=list)
    left_neighbor: str = ""  # same-direction lane to the left, "" if none
    right_neighbor: str = ""
    in_junction: bool = False

    @property
    def width(self) -> float:
        """Mean lane width (m) from the boundaries."""
        n = min(len(self.left_boundary), len(self.right_boundary))
        if n == 0:
            return 0.0
        li = np.linspace(0, len(self.left_boundary) - 1, n).round().astype(int)
        ri = np.linspace(0, len(self.right_boundary) - 1, n).round().astype(int)
        return float(np.mean(np.linalg.norm(self.left_boundary[li] - self.right_boundary[ri], axis=1)))


@dataclass
class LaneGraph:
    lanes: dict[str, Lane] = field(default_factory=dict)
    frame_id: str = "map"
    stamp: float = 0.0

    def add(self, lane: Lane) -> None:
        self.lanes[lane.id] = lane


@dataclass
class Route:
    """The navigation route: road sections (roadblocks) to follow in order, and the goal pose."""

    stamp: float
    road_ids: list[str] = field(default_factory=list)
    goal_x: float = math.nan
    goal_y: float = math.nan
    goal_heading: float = math.nan

    def starts_mission(self, previous: "Route | None") -> bool:
        """Whether this route starts a new mission after ``previous``, rather than being the same route again
        (a latched message delivered twice: the same stamp and road sections). A new mission starts the
        stack afresh, as ``luna-bridge eval`` starts each scenario: no recent decisions in the scene, no
        retrieved items kept from the last decision, no warm start of the search. The first route a node
        hears (``previous`` None) starts none: the node holds nothing of an earlier mission, and what it
        did before the latched route reached it (a first decision, a first plan) is this mission's."""
        return previous is not None and (previous.stamp, previous.road_ids) != (self.stamp, self.road_ids)


# --------------------------------------------------------------------------------------------------
# Scene descriptor (Table I)
# --------------------------------------------------------------------------------------------------


@dataclass
class ObjectDescription:
    """An object as the scene descriptor states it: ego-centred polar frame at the ego box centre.

    ``distance`` (m) and ``bearing`` (rad, line-of-sight angle, zero along the ego heading, positive
    to the left); ``heading`` relative to the ego heading (rad); ``speed`` (m/s).
    """

    id: str
    object_class: ObjectClass
    distance: float
    bearing: float
    heading: float
    speed: float
    length: float
    width: float
    lane_relation: str = ""  # e.g. "same lane", "left lane", "right lane", "junction", "target road"
    cutting_in: bool = False  # in an adjacent lane and moving sideways into the ego lane


@dataclass
class SceneDescriptor:
    """xi_t of LUNA-AD Eq. 4 / Table I."""

    stamp: float
    road_section: RoadSection
    num_lanes: int  # N_c, lanes of the current road
    ego_lane_index: int  # j_c, 1-based from the left; 0 if unknown
    lanes_connect_to_target: list[bool] = field(default_factory=list)  # I_{j_c}, left to right
    exit_points: list[tuple[float, float]] = field(default_factory=list)  # (distance m, bearing rad)
    ego_speed: float = 0.0
    ego_acceleration: float = 0.0
    ego_length: float = VehicleParameters().length
    ego_width: float = VehicleParameters().width
    objects: list[ObjectDescription] = field(default_factory=list)
    traffic_light: TrafficLightPhase = TrafficLightPhase.NONE
    navigation: Navigation = Navigation.NONE
    recent_decisions: list[str] = field(default_factory=list)  # last decisions, oldest first
    has_left_lane: bool = False
    has_right_lane: bool = False
    junction_distance: float = math.inf  # m along the route to the next junction; 0 inside one
    dropped_objects: dict[str, str] = field(default_factory=dict)  # object id -> why it was dropped

    @property
    def in_junction(self) -> bool:
        return self.road_section is RoadSection.JUNCTION

    def action_mask(self) -> np.ndarray:
        return action_mask(self.has_left_lane, self.has_right_lane, self.in_junction)


# --------------------------------------------------------------------------------------------------
# Decisions, failures, explanations, reflection, memory
# --------------------------------------------------------------------------------------------------


@dataclass
class DecisionDistribution:
    """pi_hat(.|xi_t) over ACTION_CODES with the candidate set C_t (Eq. 19) and provenance."""

    stamp: float
    probabilities: np.ndarray  # (10,), sums to 1
    candidate_set: list[str] = field(default_factory=list)  # codes sorted by probability, descending
    query: str = ""  # Q_md without the retrieved context
    retrieved_ids: list[str] = field(default_factory=list)
    latency: float = 0.0  # s, model forward pass incl. retrieval
    scene_stamp: float = 0.0
    memory_version: int = 0
    # How the prompt was shortened to fit the student's context window (luna_core.student.context):
    examples_dropped: int = 0  # retrieved items left out (retrieved_ids lists only the ones used)
    objects_dropped: int = 0  # farthest objects left out of the current traffic state
    retrieved_similarities: list[float] = field(default_factory=list)  # cosine, one per retrieved id
    # pi_hat as the student gave it, when retrieved reflection lessons were weighted into
    # ``probabilities`` (luna_core.lessons); None when the distribution is the student's.
    student_probabilities: np.ndarray | None = None

    @property
    def top_action(self) -> str:
        return ACTION_CODES[int(np.argmax(self.probabilities))]


def candidate_set(probabilities: Sequence[float] | np.ndarray, gamma_p: float = 0.1) -> list[str]:
    """C_t = {a : pi_hat(a) >= gamma_p} (Eq. 19), sorted by probability descending (Eq. 25).

    Never empty: if no action reaches gamma_p, the most likely action is kept.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    order = np.argsort(-p, kind="stable")
    chosen = [ACTION_CODES[i] for i in order if p[i] >= gamma_p]
    return chosen or [ACTION_CODES[int(order[0])]]


def validate_distribution(probabilities: Iterable[float], tolerance: float = 1e-3) -> np.ndarray:
    """Return a float64 copy of a 10-action distribution, or raise ValueError saying what is wrong."""
    p = np.asarray(list(probabilities), dtype=np.float64)
    if p.shape != (NUM_ACTIONS,):
        raise ValueError(f"decision distribution has {p.size} entries, expected {NUM_ACTIONS}")
    if not np.all(np.isfinite(p)):
        raise ValueError("decision distribution contains NaN or inf")
    if np.any(p < 0.0):
        raise ValueError("decision distribution has negative probabilities")
    if abs(p.sum() - 1.0) > tolerance:
        raise ValueError(f"decision distribution sums to {p.sum():.4f}, not 1")
    return p


@dataclass
class FailureEvent:
    """zeta_t = <a~, I_coll, Theta> of Eq. 24, with the kind of each collision and two more failure kinds.

    ``near_misses`` are the objects whose projected time to collision fell below nuPlan's 0.95 s
    bound (id -> least TTC in s; ``luna_core.ttc``): no contact, but a failure the metrics count.
    ``stall`` is Theta of Eq. 23 (low progress while nothing holds the ego); ``blocked_by`` names the
    stopped leader the ego stood behind for the whole stall window (low progress that a stopped car
    explains: no stall, but a failure to make progress that reflection may solve by going around).
    ``collision_kinds`` gives nuPlan's collision type at first contact for each colliding id
    (``luna_core.collision_kinds``), so that a collision the metrics do not count as at fault says so.
    """

    stamp: float
    issued_decision: str  # action code of the decision executed since t - T_d ("" if none)
    decision_stamp: float = 0.0  # stamp of that decision
    colliding_ids: list[str] = field(default_factory=list)
    stall: bool = False
    blocked_by: str = ""  # id of the stopped leader that held the ego over the stall window ("" if none)
    collision_kinds: dict[str, str] = field(default_factory=dict)  # colliding id -> CollisionType value
    near_misses: dict[str, float] = field(default_factory=dict)  # object id -> least projected TTC (s)

    @property
    def collision(self) -> bool:
        return bool(self.colliding_ids)

    @property
    def near_miss(self) -> bool:
        return bool(self.near_misses)

    @property
    def conflict(self) -> bool:
        """An object hit or nearly hit the ego (a collision or a near miss), as opposed to no progress."""
        return self.collision or self.near_miss

    @property
    def blocked(self) -> bool:
        return bool(self.blocked_by)


@dataclass
class DecisionExplanation:
    """A_md of Eq. 28 for the decision that was being executed when a failure occurred."""

    stamp: float
    decision_stamp: float
    failure_stamp: float
    query: str  # Q_md (without retrieval context)
    candidate_set: list[str]
    text: str  # the full explanation, starting with the ranked action codes
    latency: float = 0.0  # s, generation time
    # How generation went (kept where the explanation is made; luna_msgs carries text and latency only):
    stop_reason: str = ""  # "eos" | "max_tokens" | "max_time" | "stop_requested"
    names_repaired: int = 0  # actions the student named wrongly, renamed from their codes


@dataclass
class ReflectionResult:
    stamp: float
    failure_stamp: float
    normal: bool  # the reflection answered 'normal' (no revision)
    revised_answer: str = ""  # A_refl when not normal
    memory_item_id: str = ""
    memory_version: int = 0
    error: str = ""  # non-empty when the reflection failed validation
    hindsight: str = ""  # the hindsight check's verdict in one line (kept locally; not in luna_msgs)


@dataclass
class MemoryItem:
    """v = <Q_md, e, pi, A> (Eq. 12); reflection items carry no distribution (pi is None)."""

    id: str
    query: str
    answer: str
    embedding: np.ndarray | None = None
    distribution: np.ndarray | None = None
    source: str = "teacher"  # "teacher" | "reflection"
    created: float = 0.0  # wall-clock seconds since the epoch
    scene_vector: np.ndarray | None = None


# --------------------------------------------------------------------------------------------------
# Trajectories
# --------------------------------------------------------------------------------------------------


@dataclass
class Trajectory:
    """Planned ego trajectory at the rear axle. Arrays of shape (N,), time from ``stamp`` in s."""

    stamp: float
    t: np.ndarray
    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    velocity: np.ndarray
    acceleration: np.ndarray
    frame_id: str = "map"

    def __len__(self) -> int:
        return len(self.t)

    @classmethod
    def from_poses(cls, stamp: float, t: np.ndarray, poses: np.ndarray) -> "Trajectory":
        """Build from (N, 3) poses (x, y, heading), deriving velocity and acceleration by differences."""
        t = np.asarray(t, dtype=np.float64)
        poses = np.asarray(poses, dtype=np.float64)
        if len(t) < 2:
            v = np.zeros(len(t))
            a = np.zeros(len(t))
        else:
            d = np.hypot(np.diff(poses[:, 0]), np.diff(poses[:, 1])) / np.maximum(np.diff(t), 1e-6)
            v = np.concatenate([d, d[-1:]])
            a = np.gradient(v, t)
        return cls(stamp, t, poses[:, 0].copy(), poses[:, 1].copy(), poses[:, 2].copy(), v, a)

    def is_finite(self) -> bool:
        return all(np.all(np.isfinite(a)) for a in (self.t, self.x, self.y, self.heading,
                                                      self.velocity, self.acceleration))


# --------------------------------------------------------------------------------------------------
# Planner interface (shared by the LUNA planner, the baselines, the simulator and the ROS nodes)
# --------------------------------------------------------------------------------------------------


@dataclass
class PlannerInput:
    """Everything a planner may use at one call (no access to the future or to logged ego states)."""

    time: float
    ego_history: list[EgoState]  # oldest first; the last entry is the current state
    objects: TrackedObjects
    traffic_lights: TrafficLights
    lane_graph: LaneGraph
    route: Route
    decision: DecisionDistribution | None = None  # latest decision, if a decision source runs
    vehicle: VehicleParameters = field(default_factory=VehicleParameters)

    @property
    def ego(self) -> EgoState:
        return self.ego_history[-1]


class Planner(Protocol):
    """A motion planner: ``plan`` returns a trajectory starting at the current ego state (t[0] = 0)."""

    name: str

    def reset(self) -> None:
        """Forget any state kept between calls (new scenario or new route)."""

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        ...
