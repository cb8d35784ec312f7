"""The ego history a node keeps: odometry states, oldest first, each paired with its acceleration (and its
steering angle where the vehicle reports one).

Odometry (``nav_msgs/Odometry``) carries no acceleration; localization publishes it on a topic of its
own (``localization/acceleration``), and the two arrive in either order. Which value the stack uses
matters beyond the planner: ``ego_acceleration`` is a field of the scene descriptor xi_t the student
reads, so it must be the same over ROS as in evaluation.

**The acceleration used is the reported one** (the simulator's value in closed loop, the vehicle's
localization on the road), paired with the odometry by stamp: an in-process run (``luna-bridge eval``)
puts the simulator's value in ``EgoState.acceleration``, the ROS bridge publishes that same value, and
the student's training data comes from logged states with their own acceleration. A finite difference
of the speed would lag it and amplify speed noise, and in lock step it would differ from what
evaluation showed the student. Only a source that never publishes an acceleration (a bag recorded
without the topic) gets a smoothed finite difference of the speed, in every node alike.

Pairing: an acceleration stamped like an odometry state is that state's; a state whose own
acceleration has not arrived yet takes the latest reported one and is corrected when its own arrives
(states are updated in place, so a scene or plan built afterwards sees the paired value). Under sim
time a node waits for the instant's acceleration (``missing_at``) once the topic has been heard, or
once the node has seen a publisher on it (``ReportedValues.expected``): the first acceleration of a run
may arrive after the first odometry, since DDS does not order topics.

**The steering angle** (``vehicle/status/steering_status``, luna_msgs/SteeringReport) is paired the same
way, for the planner, whose tracker starts from it; a state without a report keeps None (not measured)
and planning estimates the angle from the yaw rate (``planning.context.sanitised_ego``).

The planner node and the scene descriptor both keep one ``EgoHistory``: neither has its own rule.
Readers iterate over a snapshot (``tuple(deque)`` is atomic under the GIL), so a node may read while
its odometry callback, in a callback group of its own, appends.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from luna_core.types import EgoState

# Two stamps this close (s) are the same instant (stamps travel as integer ns).
SAME_INSTANT = 1e-6
# Weight of the newest finite difference in the fallback estimate (exponential smoothing of the speed's
# derivative, for sources without an acceleration topic).
DIFFERENCE_WEIGHT = 0.3
MIN_DIFFERENCE_DT = 1e-3  # s: closer odometry stamps keep the previous estimate (no division by ~0)
REPORTS_KEPT = 50  # reported values per topic remembered for pairing (2.5 s at 20 Hz)


class EgoHistoryError(ValueError):
    """An odometry state or acceleration that cannot enter the history (not finite, out of order)."""


def heard_at(stamp: float | None, now: float) -> bool:
    """Whether an input last stamped ``stamp`` has reached instant ``now``; None = never heard (a
    source this run does not have, e.g. in some bags): nothing to wait for."""
    return stamp is None or stamp >= now - SAME_INSTANT


def unheard(what: str, stamp: float | None) -> str:
    """How a lock-step wait names an input that has not reached its instant: what and its latest stamp."""
    return f"{what} (latest {'never' if stamp is None else f'{stamp:.2f} s'})"


@dataclass
class ReportedValues:
    """Values reported on a topic of their own (acceleration, steering angle), kept for pairing with
    odometry by stamp."""

    what: str  # for messages: "acceleration", "steering angle"
    kept: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=REPORTS_KEPT))
    # Set by a node that sees a publisher on the topic: its first report is then waited for like a later
    # one, although nothing has been heard yet.
    expected: bool = False

    @property
    def stamp(self) -> float | None:
        """Stamp of the latest report; None until the topic has been heard."""
        kept = tuple(self.kept)
        return kept[-1][0] if kept else None

    def heard_at(self, now: float) -> bool:
        """Whether the report of instant ``now`` is in, or nothing is to be waited for (never heard, not
        expected)."""
        stamp = self.stamp
        return not self.expected if stamp is None else heard_at(stamp, now)

    def for_stamp(self, stamp: float) -> float | None:
        """The value reported for ``stamp``, else the latest one (provisional until its own arrives);
        None if nothing was reported yet."""
        kept = tuple(self.kept)
        for reported, value in reversed(kept):
            if abs(reported - stamp) < SAME_INSTANT:
                return value
        return kept[-1][1] if kept else None

    def add(self, stamp: float, value: float) -> None:
        if not (math.isfinite(stamp) and math.isfinite(value)):
            raise EgoHistoryError(f"{self.what} {value} at stamp {stamp} is not finite")
        self.kept.append((stamp, float(value)))


@dataclass
class EgoHistory:
    """Odometry states over the last ``duration`` s, each with its acceleration and, where reported, its
    steering angle (see the module)."""

    duration: float = 2.0  # s kept behind the newest state
    states: deque[EgoState] = field(default_factory=deque)
    accelerations: ReportedValues = field(default_factory=lambda: ReportedValues("acceleration"))
    steering_angles: ReportedValues = field(default_factory=lambda: ReportedValues("steering angle"))

    @property
    def latest(self) -> EgoState | None:
        try:
            return self.states[-1]
        except IndexError:  # empty (checked this way: no window between a test and the read)
            return None

    def add_state(self, ego: EgoState) -> EgoState:
        """Append an odometry state (its acceleration and steering angle set here); raises
        ``EgoHistoryError`` for a non-finite state or one older than the newest."""
        if not ego.is_finite():
            raise EgoHistoryError("odometry contains NaN or inf")
        last = self.latest
        if last is not None and ego.stamp < last.stamp:
            raise EgoHistoryError(f"odometry stamp {ego.stamp:.3f} s is older than the last one ({last.stamp:.3f} s)")
        ego.acceleration = self._acceleration_for(ego, last)
        ego.steering_angle = self.steering_angles.for_stamp(ego.stamp)  # None: never reported
        self.states.append(ego)
        while self.states and ego.stamp - self.states[0].stamp > self.duration + 1e-9:
            self.states.popleft()
        return ego

    def add_acceleration(self, stamp: float, value: float) -> None:
        """A reported longitudinal acceleration (m/s^2) stamped ``stamp``: pairs it with the state of
        that stamp if it is already in (correcting its provisional value)."""
        self.accelerations.add(stamp, value)
        self._pair(stamp, "acceleration", float(value))

    def add_steering_angle(self, stamp: float, value: float) -> None:
        """A reported front-wheel steering angle (rad) stamped ``stamp``, paired like an acceleration."""
        self.steering_angles.add(stamp, value)
        self._pair(stamp, "steering_angle", float(value))

    def _pair(self, stamp: float, attribute: str, value: float) -> None:
        for ego in reversed(tuple(self.states)):
            if abs(ego.stamp - stamp) < SAME_INSTANT:
                setattr(ego, attribute, value)
                break
            if ego.stamp < stamp:
                break

    def at_or_before(self, now: float) -> EgoState | None:
        """The newest state stamped at or before ``now`` (the oldest kept if all are newer; None if empty)."""
        states = tuple(self.states)
        for ego in reversed(states):
            if ego.stamp <= now + SAME_INSTANT:
                return ego
        return states[0] if states else None

    def missing_at(self, now: float) -> list[str]:
        """What of instant ``now`` is not in yet (empty: complete): the odometry, and its acceleration and
        steering angle where those topics are heard or expected (``unheard`` names each)."""
        last = self.latest
        missing = [] if last is not None and heard_at(last.stamp, now) else \
            [unheard("odometry", last.stamp if last is not None else None)]
        return missing + [unheard(r.what, r.stamp) for r in (self.accelerations, self.steering_angles)
                          if not r.heard_at(now)]

    def _acceleration_for(self, ego: EgoState, last: EgoState | None) -> float:
        reported = self.accelerations.for_stamp(ego.stamp)
        if reported is not None:  # its own, or the latest until its own comes (add_acceleration)
            return reported
        if last is None:
            return 0.0
        dt = ego.stamp - last.stamp
        if dt <= MIN_DIFFERENCE_DT:
            return last.acceleration
        raw = (ego.velocity - last.velocity) / dt
        return (1.0 - DIFFERENCE_WEIGHT) * last.acceleration + DIFFERENCE_WEIGHT * raw
