"""Progress monitor (LUNA-AD Sec. III-E1): collision and stall capture, failure tuple (Eq. 23-24).

Every decision period T_d the monitor checks the driving since its last check (the last T_d when on time):

* Collisions (Algorithm 1): the ego box and the tracked objects' boxes over the window
  ``(last check, now]`` (``(now - T_d, now]`` with the checks on time), aligned by stamp, go to
  :func:`luna_core.geometry.colliding_objects`. The time grid is the object frames' stamps (perception is
  the slower stream); the ego pose at each of those stamps is interpolated from the odometry buffer. An
  object absent from a frame is masked, not guessed. Because each window starts where the last check
  ended, consecutive windows partition time and every frame is checked once however the checks jitter:
  a check that a timer held up by load runs late covers all it missed (the buffers' history bounds how
  far back that reaches).
  Each contact is also classified by nuPlan's rules at its first frame (``luna_core.collision_kinds``:
  the monitor reports every overlap, the metrics count only the at-fault ones; the type says which).
* Stalls (Eq. 23): over the window W = {now - h T_d | h = 0..H-1}, Theta = 1 when the mean ego speed
  at those instants is below v_th and nothing held the ego at any of them. The paper names the light
  (Green or None permits progress); the scene descriptor at each instant also says whether a stopped or
  slower leader within the stopping distance or a crossing pedestrian held it (``luna_core.holds``):
  waiting for them is no failure. Instants without a scene count as nothing holding (Table I: an
  unknown light is None). Without ego samples for every instant (the start of a run, an odometry
  gap) Theta is 0: a stall is only claimed on evidence.
* Near misses: at each object frame of the collision window the ego (while it moves) and the objects
  ahead of it are projected at constant velocity by nuPlan's time-to-collision rule
  (``luna_core.ttc``; the scene descriptor says whether the ego is in a junction or off its lanes,
  where the rule looks wider); an object whose projected overlap comes within ``near_miss_ttc``
  (nuPlan's 0.95 s bound) is a near miss (``FailureEvent.near_misses``: id -> least TTC). The metrics
  fail a run for it as for a collision, so reflection should hear of it; an object that touched the
  ego is a collision instead, from its first contact on, as in the metric.
* Blocked: the same low progress while a stopped leader held the ego at every instant of W (and no
  light did) is reported as a failure of its own kind (``FailureEvent.blocked_by``, the leader's id):
  waiting behind a car that does not move for H T_d may call for going around it, which reflection
  decides; it is not a stall, and accelerating into it is never the answer.
* The failure tuple zeta_t = <a~, I_coll, Theta> (Eq. 24) with a~ the decision in force over the
  window, issued at about its start (now - T_d with the checks on time; see
  :meth:`ProgressMonitor.issued_decision`).

Pure Python for the ``progress_monitor`` node: feed it with ``update_ego``, ``update_objects``,
``update_scene`` and ``on_decision`` as messages arrive (any order; late stamps are inserted in order),
then call ``check(now)`` every T_d on the node clock. ``diagnostics`` describes the last check
(latency included). Invalid input raises :class:`MonitorInputError` naming what was wrong, except
objects with unknown fields inside a frame, which follow the shared rule ``usable_objects`` (kept with a
default footprint while their position is known) and are counted, so one bad track blinds nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from luna_core.collision_kinds import CollisionType, collision_type
from luna_core.geometry import TOUCH_TOLERANCE, boxes_overlap, colliding_objects
from luna_core.holds import LEADER, LIGHT, Hold, HoldParameters, hold_of
from luna_core.stamped import StampedBuffer
from luna_core.ttc import LEAST_MIN_TTC, TTC_STOPPED_SPEED, projected_ttc, projection_steps, relevant_tracks
from luna_core.types import (DecisionDistribution, EgoState, FailureEvent, ObjectClass, SceneDescriptor,
                             TrackedObject, TrackedObjects, VehicleParameters, box_corners, usable_objects)


class MonitorInputError(ValueError):
    """A message the monitor cannot use (non-finite ego state or stamp, malformed decision)."""


@dataclass(frozen=True)
class MonitorParameters:
    """Progress-monitor parameters (node parameters of ``progress_monitor``; defaults as below).

    The paper leaves H and v_th open; the defaults flag a vehicle that averaged under 0.5 m/s over the
    samples of the last 4 s (H = 3 cycles of T_d = 2 s) while nothing held it (``holds``: a red light, a
    leader, a VRU).
    """

    decision_period: float = 2.0  # T_d (s): check period and collision window length
    stall_window_cycles: int = 3  # H: decision cycles in the stall window (Eq. 23)
    stall_speed_threshold: float = 0.5  # v_th (m/s)
    max_sample_gap: float = 0.3  # s: how far from an instant an ego/light sample may be to stand for it
    collision_tolerance: float = TOUCH_TOLERANCE  # m: boxes this close count as touching
    near_miss_ttc: float = LEAST_MIN_TTC  # s: a projected time to collision below this is a near miss; 0 = off
    holds: HoldParameters = field(default_factory=HoldParameters)
    vehicle: VehicleParameters = field(default_factory=VehicleParameters)

    def __post_init__(self) -> None:
        for name in ("decision_period", "max_sample_gap"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"MonitorParameters.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.stall_speed_threshold) and self.stall_speed_threshold >= 0.0):
            raise ValueError("MonitorParameters.stall_speed_threshold must be >= 0, "
                             f"got {self.stall_speed_threshold!r}")
        if int(self.stall_window_cycles) != self.stall_window_cycles or self.stall_window_cycles < 1:
            raise ValueError("MonitorParameters.stall_window_cycles must be an integer >= 1, "
                             f"got {self.stall_window_cycles!r}")
        if not (math.isfinite(self.near_miss_ttc) and self.near_miss_ttc >= 0.0):
            raise ValueError(f"MonitorParameters.near_miss_ttc must be >= 0 s, got {self.near_miss_ttc!r}")
        if not (math.isfinite(self.collision_tolerance) and self.collision_tolerance >= 0.0):
            raise ValueError("MonitorParameters.collision_tolerance must be >= 0, "
                             f"got {self.collision_tolerance!r}")

    @property
    def history(self) -> float:
        """How much history (s) the buffers keep: the stall window plus a sample gap of margin."""
        return max(1, self.stall_window_cycles - 1) * self.decision_period + self.decision_period \
            + self.max_sample_gap


@dataclass
class MonitorDiagnostics:
    """What the last :meth:`ProgressMonitor.check` saw, for ``/diagnostics``."""

    stamp: float = math.nan
    latency: float = 0.0  # s, wall time of the check
    frames_checked: int = 0  # object frames in the collision window with an aligned ego pose
    objects_checked: int = 0  # distinct objects in the collision window
    stall_window_full: bool = False  # ego samples for all H instants of Eq. 23
    mean_speed: float = math.nan  # m/s over the stall window (NaN unless full)
    lights_permissive: bool = False  # no red or yellow light at any instant of the window
    hold: str = ""  # what held the ego at the latest instant ("" if nothing), e.g. "leader: vehicle v3 ..."
    collision_kinds: dict[str, str] = field(default_factory=dict)  # this check's colliding ids -> nuPlan type
    min_time_to_collision: float = math.inf  # s, least projected TTC in the window (nuPlan's rule)
    dropped_objects: int = 0  # objects without a usable position left out of frames since start
    assumed_objects: int = 0  # objects kept with assumed fields (default footprint...) since start
    failure: bool = False


class ProgressMonitor:
    """Buffers ego, objects, lights and decisions; ``check(now)`` returns zeta_t (Eq. 24) or None."""

    def __init__(self, params: MonitorParameters | None = None) -> None:
        self.params = params or MonitorParameters()
        self._ego = StampedBuffer()
        self._objects = StampedBuffer()
        self._scenes = StampedBuffer()
        self._decisions = StampedBuffer()
        self._contacts: dict[str, CollisionType] = {}  # objects overlapping in the last check: type at first contact
        self._collided: set[str] = set()  # every object that ever touched the ego: no near miss any more
        self.diagnostics = MonitorDiagnostics()

    # ------------------------------------------------------------------ inputs

    def update_ego(self, state: EgoState) -> None:
        """Add an odometry sample (rear-axle pose and speed)."""
        if not state.is_finite():
            raise MonitorInputError(f"ego state at stamp {state.stamp!r} has non-finite fields: {state}")
        self._ego.insert(state.stamp, state)

    def update_objects(self, frame: TrackedObjects) -> None:
        """Add a perception frame, its objects as ``usable_objects`` makes them (an unknown size gets the
        class's default footprint; objects without a usable position are left out); both are counted."""
        _check_stamp(frame.stamp, "objects frame")
        usable = usable_objects(frame.objects)
        self.diagnostics.dropped_objects += len(usable.dropped)
        self.diagnostics.assumed_objects += len(usable.assumed)
        self._objects.insert(frame.stamp, usable.objects)

    def update_scene(self, scene: SceneDescriptor) -> None:
        """Record the scene descriptor xi_t: its light phase lambda_t and the objects of the ego lane
        say what holds the ego (``luna_core.holds``). The monitor has no map: the scene descriptor
        decided which light governs the path and which objects are in the ego lane."""
        if not isinstance(scene, SceneDescriptor):
            raise MonitorInputError(f"update_scene needs a SceneDescriptor, got {type(scene).__name__}")
        _check_stamp(scene.stamp, "scene")
        self._scenes.insert(scene.stamp, scene)

    def on_decision(self, decision: DecisionDistribution | str, stamp: float | None = None) -> None:
        """Record an issued decision: a distribution (its top action and stamp) or a code + stamp."""
        if isinstance(decision, DecisionDistribution):
            code, stamp = decision.top_action, decision.stamp
        else:
            code = decision
            if stamp is None:
                raise MonitorInputError("on_decision with an action code needs its stamp")
        _check_stamp(stamp, "decision")
        self._decisions.insert(float(stamp), code)

    # ------------------------------------------------------------------ checks

    def check(self, now: float) -> FailureEvent | None:
        """Run the progress check for the window ending at ``now``; the failure tuple, or None.

        Sets :attr:`diagnostics` (latency, what was checked). Call every T_d on the node clock.
        """
        _check_stamp(now, "check time")
        started = time.perf_counter()
        self._prune(now)
        start = self._window_start(now)
        window = self._aligned_frames(start, now)  # the collision and near-miss checks read the same frames
        colliding = self._colliding_ids(*window)
        near_misses = self._near_misses(*window)
        stall, blocked_by = self.progress(now)
        event = None
        if colliding or near_misses or stall or blocked_by:
            code, decision_stamp = self.issued_decision(now, start)
            event = FailureEvent(stamp=now, issued_decision=code, decision_stamp=decision_stamp,
                                 colliding_ids=colliding, stall=stall, blocked_by=blocked_by,
                                 collision_kinds=dict(self.diagnostics.collision_kinds), near_misses=near_misses)
        self.diagnostics.stamp = now  # where the next check's window starts (``_window_start``)
        self.diagnostics.failure = event is not None
        self.diagnostics.latency = time.perf_counter() - started
        return event

    def _colliding_ids(self, frames: list[list[TrackedObject]], egos: list["_EgoAt"], stamps: list[float]) -> list[str]:
        """I_coll: ids of objects whose box overlapped the ego box in the collision window's frames
        (:meth:`_window_start`, :meth:`_aligned_frames`); the diagnostics get each one's collision type at
        first contact (``collision_kinds``)."""
        ego_boxes = [ego.box for ego in egos]
        ids = sorted({o.id for objects in frames for o in objects})
        self.diagnostics.frames_checked = len(frames)
        self.diagnostics.objects_checked = len(ids)
        self.diagnostics.collision_kinds = {}
        if not frames or not ids:
            self._contacts = {}
            return []
        column = {object_id: j for j, object_id in enumerate(ids)}
        n, steps = len(ids) + 1, len(frames)
        # Box parameters (x, y, heading, length, width) per (object, step); row 0 is the ego.
        params = np.zeros((n, steps, 5))
        valid = np.zeros((n, steps), dtype=bool)
        params[0] = np.asarray(ego_boxes)
        valid[0] = True
        for k, objects in enumerate(frames):  # one pass over the received messages, to pack arrays
            for o in objects:
                params[1 + column[o.id], k] = (o.x, o.y, o.heading, o.length, o.width)
                valid[1 + column[o.id], k] = True
        boxes = box_corners(*np.moveaxis(params, -1, 0))
        hits = [int(i) for i in colliding_objects(boxes, valid, self.params.collision_tolerance)]
        contacts = {}
        for i in hits:
            # A contact that went on from the last check keeps the type of its first frame.
            contacts[ids[i - 1]] = self._contacts.get(ids[i - 1]) or self._first_contact(
                ids[i - 1], boxes[0], boxes[i], valid[i], frames, ego_boxes, stamps)
        self._contacts = contacts
        self._collided.update(contacts)
        self.diagnostics.collision_kinds = {k: v.value for k, v in contacts.items()}
        return [ids[i - 1] for i in hits]

    def _near_misses(self, frames: list[list[TrackedObject]], egos: list["_EgoAt"],
                     stamps: list[float]) -> dict[str, float]:
        """Objects (id -> least projected TTC, s) whose time to collision by nuPlan's rule fell below
        ``near_miss_ttc`` at a frame of the window while the ego moved; objects that touched the ego are
        left out (call after :meth:`_colliding_ids` of the same window)."""
        steps = projection_steps()
        steps = steps[steps < self.params.near_miss_ttc]
        least: dict[str, float] = {}
        vehicle = self.params.vehicle
        for objects, ego, stamp in zip(frames, egos, stamps):
            if ego.speed <= TTC_STOPPED_SPEED or not len(steps):
                continue
            objects = [o for o in objects if o.id not in self._collided]
            if not objects:
                continue
            scene = self._scene_at(stamp)
            wide = scene is not None and (scene.in_junction or scene.ego_lane_index == 0)
            xy = np.array([(o.x, o.y) for o in objects])
            relevant = relevant_tracks(np.array([ego.rear_x, ego.rear_y]), ego.heading, xy, wide)
            if not relevant.any():
                continue
            near = [o for o, r in zip(objects, relevant) if r]
            ttc = projected_ttc(np.array(ego.box[:2]), ego.heading, ego.speed, vehicle.length, vehicle.width,
                                np.array([(o.x, o.y, o.heading) for o in near]),
                                np.array([0.0 if o.object_class is ObjectClass.STATIC else o.speed for o in near]),
                                np.array([(o.length, o.width) for o in near]), steps)
            for o, t in zip(near, ttc):
                if t < least.get(o.id, math.inf):
                    least[o.id] = float(t)
        self.diagnostics.min_time_to_collision = min(least.values(), default=math.inf)
        return dict(sorted(least.items()))

    def _first_contact(self, object_id: str, ego_corners: np.ndarray, corners: np.ndarray, valid: np.ndarray,
                       frames: list[list[TrackedObject]], ego_boxes: list[tuple[float, ...]],
                       stamps: list[float]) -> CollisionType:
        """nuPlan's collision type at the first frame of the window where the object touches the ego."""
        hit = boxes_overlap(ego_corners, corners, self.params.collision_tolerance, backend="numpy") & valid
        k = int(np.argmax(hit))
        obj = next(o for o in frames[k] if o.id == object_id)
        cx, cy, heading = ego_boxes[k][:3]
        rear_axle = np.array(self.params.vehicle.rear_axle_from_center(cx, cy, heading))
        ego = self._ego.nearest(stamps[k], self.params.max_sample_gap)  # exists: the frame had an ego pose
        return collision_type(ego_corners[k], rear_axle, heading, abs(ego.value.velocity), corners[k],
                              np.array([obj.x, obj.y]), obj.speed)

    def progress(self, now: float) -> tuple[bool, str]:
        """(Theta of Eq. 23, the id of the stopped leader the ego was blocked by or "") over
        W = {now - h T_d | h = 0..H-1}; see the module docstring."""
        instants = [now - h * self.params.decision_period for h in range(self.params.stall_window_cycles)]
        speeds = []
        for tau in instants:
            sample = self._ego.nearest(tau, self.params.max_sample_gap)
            if sample is None:
                self.diagnostics.stall_window_full = False
                self.diagnostics.mean_speed = math.nan
                return False, ""
            speeds.append(abs(sample.value.velocity))
        holds = [self._hold_at(tau) for tau in instants]
        mean_speed = float(np.mean(speeds))
        self.diagnostics.stall_window_full = True
        self.diagnostics.mean_speed = mean_speed
        self.diagnostics.lights_permissive = not any(h is not None and h.kind == LIGHT for h in holds)
        latest = holds[0]
        self.diagnostics.hold = f"{latest.kind}: {latest.detail}" if latest is not None else ""
        if mean_speed >= self.params.stall_speed_threshold:
            return False, ""
        if all(h is None for h in holds):
            return True, ""
        if all(h is not None and h.kind == LEADER and h.stopped for h in holds):
            return False, latest.object_id
        return False, ""

    def issued_decision(self, now: float, start: float | None = None) -> tuple[str, float]:
        """a~ of Eq. 24: the decision issued at about the window start (``start``, by default
        ``now - T_d``; a late check's window starts at the last check) and executed until ``now``.

        The latest decision issued no later than half a period after the window start (decisions
        come out with some latency after their tick); failing that, the earliest one issued inside
        the window; ("", 0.0) when there is none.
        """
        start = now - self.params.decision_period if start is None else start
        sample = self._decisions.at_or_before(start + 0.5 * self.params.decision_period)
        if sample is None:
            sample = self._decisions.after(start)
            if sample is not None and sample.stamp > now:
                sample = None
        return (str(sample.value), sample.stamp) if sample is not None else ("", 0.0)

    # ------------------------------------------------------------------ helpers

    def _window_start(self, now: float) -> float:
        """Where the collision window ending at ``now`` starts: the last check's time (its diagnostics'
        stamp), so that windows partition time however the checks jitter (a timer held up by load), no
        further back than the buffers' history; ``now - T_d`` at the first check and when the clock went
        back (a replay started again)."""
        last = self.diagnostics.stamp
        if math.isnan(last) or last >= now:
            return now - self.params.decision_period
        return max(last, now - self.params.history)

    def _aligned_frames(self, start: float, now: float
                        ) -> tuple[list[list[TrackedObject]], list["_EgoAt"], list[float]]:
        """The object frames of ``(start, now]`` that have an ego pose, those poses and the stamps."""
        frames, egos, stamps = [], [], []
        for sample in self._objects.between(start, now):
            ego = self._ego_at(sample.stamp)
            if ego is not None:
                frames.append(sample.value)
                egos.append(ego)
                stamps.append(sample.stamp)
        return frames, egos, stamps

    def _ego_at(self, stamp: float) -> "_EgoAt | None":
        """The ego at ``stamp`` (pose and speed interpolated between samples, or the sample within a gap)."""
        before = self._ego.at_or_before(stamp)
        after = self._ego.after(stamp)
        gap = self.params.max_sample_gap
        if before is not None and after is not None and after.stamp - before.stamp <= 2.0 * gap:
            w = (stamp - before.stamp) / (after.stamp - before.stamp)
            a, b = before.value, after.value
            x = a.x + w * (b.x - a.x)
            y = a.y + w * (b.y - a.y)
            heading = a.heading + w * math.remainder(b.heading - a.heading, 2.0 * math.pi)
            speed = abs(a.velocity) + w * (abs(b.velocity) - abs(a.velocity))
        elif before is not None and stamp - before.stamp <= gap:
            x, y, heading, speed = before.value.x, before.value.y, before.value.heading, abs(before.value.velocity)
        elif after is not None and after.stamp - stamp <= gap:
            x, y, heading, speed = after.value.x, after.value.y, after.value.heading, abs(after.value.velocity)
        else:
            return None
        vehicle = self.params.vehicle
        cx, cy = vehicle.center_from_rear_axle(x, y, heading)
        return _EgoAt(x, y, heading, speed, (cx, cy, heading, vehicle.length, vehicle.width))

    def _hold_at(self, tau: float) -> Hold | None:
        """What held the ego at ``tau`` (by the scene of :meth:`_scene_at`); nothing without a scene."""
        scene = self._scene_at(tau)
        return None if scene is None else hold_of(scene, self.params.stall_speed_threshold, self.params.holds)

    def _scene_at(self, tau: float) -> SceneDescriptor | None:
        """The scene in force at ``tau``: the latest up to a decision period (plus a sample gap) old,
        else the nearest within a sample gap."""
        sample = self._scenes.at_or_before(tau)
        if sample is None or tau - sample.stamp > self.params.decision_period + self.params.max_sample_gap:
            sample = self._scenes.nearest(tau, self.params.max_sample_gap)
        return None if sample is None else sample.value

    def _prune(self, now: float) -> None:
        """Forget what no check at or after ``now`` can need (pruning follows the check clock, so one
        message with a wild future stamp cannot wipe the buffers)."""
        oldest = now - self.params.history
        for buffer in (self._ego, self._objects, self._scenes):
            buffer.prune(oldest)
        # Keep the decision in force at the oldest instant we may still be asked about.
        keep = self._decisions.at_or_before(oldest)
        self._decisions.prune(keep.stamp if keep is not None else oldest)


@dataclass(frozen=True)
class _EgoAt:
    """The ego at an object frame's stamp: rear axle (m), heading (rad), speed (m/s) and its box."""

    rear_x: float
    rear_y: float
    heading: float
    speed: float
    box: tuple[float, float, float, float, float]  # centre x, y, heading, length, width


def _check_stamp(stamp: float | None, what: str) -> None:
    if stamp is None or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        raise MonitorInputError(f"{what}: stamp must be a finite number of seconds, got {stamp!r}")
