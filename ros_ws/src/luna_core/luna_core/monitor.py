"""Progress monitor (LUNA-AD Sec. III-E1): collision and stall capture, failure tuple (Eq. 23-24).

Every decision period T_d the monitor checks the last T_d of driving:

* Collisions (Algorithm 1): the ego box and the tracked objects' boxes over the window
  ``(now - T_d, now]``, aligned by stamp, go to :func:`luna_core.geometry.colliding_objects`. The time
  grid is the object frames' stamps (perception is the slower stream); the ego pose at each of those
  stamps is interpolated from the odometry buffer. An object absent from a frame is masked, not
  guessed. Consecutive windows partition time, so with regular checks each frame is checked once.
* Stalls (Eq. 23): over the window W = {now - h T_d | h = 0..H-1}, Theta = 1 when the mean ego speed
  at those instants is below v_th and the traffic light phase at every one of them is Green or None.
  Without ego samples for every instant (the start of a run, an odometry gap) Theta is 0: a stall is
  only claimed on evidence.
* The failure tuple zeta_t = <a~, I_coll, Theta> (Eq. 24) with a~ the decision in force over the
  window, issued at about now - T_d (see :meth:`ProgressMonitor.issued_decision`).

Pure Python for the ``progress_monitor`` node: feed it with ``update_ego``, ``update_objects``,
``update_light`` and ``on_decision`` as messages arrive (any order; late stamps are inserted in order),
then call ``check(now)`` every T_d on the node clock. ``diagnostics`` describes the last check
(latency included). Invalid input raises :class:`MonitorInputError` naming what was wrong, except
non-finite objects inside a frame, which are dropped and counted so that one bad track does not blind
the monitor.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from luna_core.geometry import TOUCH_TOLERANCE, colliding_objects
from luna_core.types import (DecisionDistribution, EgoState, FailureEvent, TrackedObjects,
                             TrafficLightPhase, VehicleParameters, box_corners)

#: Light phases under which forward progress is permitted (Eq. 23).
PERMISSIVE_PHASES = frozenset({TrafficLightPhase.GREEN, TrafficLightPhase.NONE})


class MonitorInputError(ValueError):
    """A message the monitor cannot use (non-finite ego state or stamp, malformed decision)."""


@dataclass(frozen=True)
class MonitorParameters:
    """Progress-monitor parameters (node parameters of ``progress_monitor``; defaults as below).

    The paper leaves H and v_th open; the defaults flag a vehicle that averaged under 0.5 m/s over the
    samples of the last 4 s (H = 3 cycles of T_d = 2 s) while no light asked it to stop.
    """

    decision_period: float = 2.0  # T_d (s): check period and collision window length
    stall_window_cycles: int = 3  # H: decision cycles in the stall window (Eq. 23)
    stall_speed_threshold: float = 0.5  # v_th (m/s)
    max_sample_gap: float = 0.3  # s: how far from an instant an ego/light sample may be to stand for it
    collision_tolerance: float = TOUCH_TOLERANCE  # m: boxes this close count as touching
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
    lights_permissive: bool = False
    dropped_objects: int = 0  # non-finite objects dropped from frames since start
    failure: bool = False


@dataclass
class _Stamped:
    stamp: float
    value: object

    def __lt__(self, other: "_Stamped") -> bool:
        return self.stamp < other.stamp


class _Buffer:
    """Samples sorted by stamp; a repeated stamp replaces the earlier sample (a re-sent message).

    Pruned by :meth:`ProgressMonitor.check`; capped at ``MAX_SAMPLES`` (oldest dropped) so that a
    node whose checks stop does not grow without bound.
    """

    MAX_SAMPLES = 10_000

    def __init__(self) -> None:
        self.items: list[_Stamped] = []

    def insert(self, stamp: float, value: object) -> None:
        i = bisect.bisect_left(self.items, _Stamped(stamp, None))
        if i < len(self.items) and self.items[i].stamp == stamp:
            self.items[i] = _Stamped(stamp, value)
        else:
            self.items.insert(i, _Stamped(stamp, value))
            if len(self.items) > self.MAX_SAMPLES:
                del self.items[0]

    def prune(self, oldest: float) -> None:
        i = bisect.bisect_left(self.items, _Stamped(oldest, None))
        del self.items[:i]

    def at_or_before(self, stamp: float) -> _Stamped | None:
        i = bisect.bisect_right(self.items, _Stamped(stamp, None))
        return self.items[i - 1] if i > 0 else None

    def after(self, stamp: float) -> _Stamped | None:
        i = bisect.bisect_right(self.items, _Stamped(stamp, None))
        return self.items[i] if i < len(self.items) else None

    def between(self, start: float, end: float) -> list[_Stamped]:
        """Samples with start < stamp <= end."""
        lo = bisect.bisect_right(self.items, _Stamped(start, None))
        hi = bisect.bisect_right(self.items, _Stamped(end, None))
        return self.items[lo:hi]


class ProgressMonitor:
    """Buffers ego, objects, lights and decisions; ``check(now)`` returns zeta_t (Eq. 24) or None."""

    def __init__(self, params: MonitorParameters | None = None) -> None:
        self.params = params or MonitorParameters()
        self._ego = _Buffer()
        self._objects = _Buffer()
        self._lights = _Buffer()
        self._decisions = _Buffer()
        self.diagnostics = MonitorDiagnostics()

    # ------------------------------------------------------------------ inputs

    def update_ego(self, state: EgoState) -> None:
        """Add an odometry sample (rear-axle pose and speed)."""
        if not state.is_finite():
            raise MonitorInputError(f"ego state at stamp {state.stamp!r} has non-finite fields: {state}")
        self._ego.insert(state.stamp, state)

    def update_objects(self, frame: TrackedObjects) -> None:
        """Add a perception frame; objects with non-finite fields are dropped (and counted)."""
        _check_stamp(frame.stamp, "objects frame")
        kept = [o for o in frame.objects if o.is_finite() and o.length >= 0.0 and o.width >= 0.0]
        self.diagnostics.dropped_objects += len(frame.objects) - len(kept)
        self._objects.insert(frame.stamp, kept)

    def update_light(self, stamp: float, phase: TrafficLightPhase) -> None:
        """Record the phase of the light governing the ego's path (the scene descriptor's lambda_t).

        The monitor has no map, so the caller decides which light applies; send ``NONE`` when no light
        governs the path. Instants without a recent sample count as ``NONE`` (Table I: unknown).
        """
        _check_stamp(stamp, "traffic light")
        if not isinstance(phase, TrafficLightPhase):
            raise MonitorInputError(f"traffic light phase must be a TrafficLightPhase, got {phase!r}")
        self._lights.insert(stamp, phase)

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
        colliding = self.colliding_ids(now)
        stall = self.stall(now)
        event = None
        if colliding or stall:
            code, decision_stamp = self.issued_decision(now)
            event = FailureEvent(stamp=now, issued_decision=code, decision_stamp=decision_stamp,
                                 colliding_ids=colliding, stall=stall)
        self.diagnostics.stamp = now
        self.diagnostics.failure = event is not None
        self.diagnostics.latency = time.perf_counter() - started
        return event

    def colliding_ids(self, now: float) -> list[str]:
        """I_coll: ids of objects whose box overlapped the ego box in ``(now - T_d, now]``."""
        frames = []
        ego_boxes = []
        for sample in self._objects.between(now - self.params.decision_period, now):
            ego = self._ego_at(sample.stamp)
            if ego is not None:
                frames.append(sample.value)
                ego_boxes.append(ego)
        ids = sorted({o.id for objects in frames for o in objects})
        self.diagnostics.frames_checked = len(frames)
        self.diagnostics.objects_checked = len(ids)
        if not frames or not ids:
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
        hits = colliding_objects(boxes, valid, self.params.collision_tolerance)
        return [ids[i - 1] for i in hits]

    def stall(self, now: float) -> bool:
        """Theta of Eq. 23 over W = {now - h T_d | h = 0..H-1}."""
        instants = [now - h * self.params.decision_period for h in range(self.params.stall_window_cycles)]
        speeds = []
        for tau in instants:
            sample = self._nearest(self._ego, tau)
            if sample is None:
                self.diagnostics.stall_window_full = False
                self.diagnostics.mean_speed = math.nan
                return False
            speeds.append(abs(sample.value.velocity))
        phases = [self._light_at(tau) for tau in instants]
        mean_speed = float(np.mean(speeds))
        permissive = all(p in PERMISSIVE_PHASES for p in phases)
        self.diagnostics.stall_window_full = True
        self.diagnostics.mean_speed = mean_speed
        self.diagnostics.lights_permissive = permissive
        return mean_speed < self.params.stall_speed_threshold and permissive

    def issued_decision(self, now: float) -> tuple[str, float]:
        """a~ of Eq. 24: the decision issued at about ``now - T_d`` and executed until ``now``.

        The latest decision issued no later than half a period after the window start (decisions
        come out with some latency after their tick); failing that, the earliest one issued inside
        the window; ("", 0.0) when there is none.
        """
        start = now - self.params.decision_period
        sample = self._decisions.at_or_before(start + 0.5 * self.params.decision_period)
        if sample is None:
            sample = self._decisions.after(start)
            if sample is not None and sample.stamp > now:
                sample = None
        return (str(sample.value), sample.stamp) if sample is not None else ("", 0.0)

    # ------------------------------------------------------------------ helpers

    def _ego_at(self, stamp: float) -> tuple[float, float, float, float, float] | None:
        """Ego box (centre x, y, heading, length, width) at ``stamp``, interpolated between samples."""
        before = self._ego.at_or_before(stamp)
        after = self._ego.after(stamp)
        gap = self.params.max_sample_gap
        if before is not None and after is not None and after.stamp - before.stamp <= 2.0 * gap:
            w = (stamp - before.stamp) / (after.stamp - before.stamp)
            a, b = before.value, after.value
            x = a.x + w * (b.x - a.x)
            y = a.y + w * (b.y - a.y)
            heading = a.heading + w * math.remainder(b.heading - a.heading, 2.0 * math.pi)
        elif before is not None and stamp - before.stamp <= gap:
            x, y, heading = before.value.x, before.value.y, before.value.heading
        elif after is not None and after.stamp - stamp <= gap:
            x, y, heading = after.value.x, after.value.y, after.value.heading
        else:
            return None
        vehicle = self.params.vehicle
        cx, cy = vehicle.center_from_rear_axle(x, y, heading)
        return cx, cy, heading, vehicle.length, vehicle.width

    def _nearest(self, buffer: _Buffer, tau: float) -> _Stamped | None:
        candidates = [s for s in (buffer.at_or_before(tau), buffer.after(tau)) if s is not None]
        if not candidates:
            return None
        best = min(candidates, key=lambda s: abs(s.stamp - tau))
        return best if abs(best.stamp - tau) <= self.params.max_sample_gap else None

    def _light_at(self, tau: float) -> TrafficLightPhase:
        sample = self._lights.at_or_before(tau)
        if sample is None or tau - sample.stamp > self.params.decision_period + self.params.max_sample_gap:
            sample = self._nearest(self._lights, tau)
        return sample.value if sample is not None else TrafficLightPhase.NONE

    def _prune(self, now: float) -> None:
        """Forget what no check at or after ``now`` can need (pruning follows the check clock, so one
        message with a wild future stamp cannot wipe the buffers)."""
        oldest = now - self.params.history
        for buffer in (self._ego, self._objects, self._lights):
            buffer.prune(oldest)
        # Keep the decision in force at the oldest instant we may still be asked about.
        keep = self._decisions.at_or_before(oldest)
        self._decisions.prune(keep.stamp if keep is not None else oldest)


def _check_stamp(stamp: float | None, what: str) -> None:
    if stamp is None or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
        raise MonitorInputError(f"{what}: stamp must be a finite number of seconds, got {stamp!r}")
