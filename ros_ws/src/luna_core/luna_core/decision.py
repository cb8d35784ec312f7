"""The decision in force: one owner of what a published decision means to the planner.

A decision distribution (LUNA-AD Eq. 18-19) is issued every T_d for the scene at its stamp. The planner
follows it until a newer one arrives or it grows older than its timeout (2 T_d): then it plans without
the decision term. What it follows is fixed when the decision is first seen:

- the probabilities, validated once (``validate_distribution``), and the candidate set C_t as the
  decision node published it (its codes checked; recomputed from the probabilities only when the
  message carries none);
- the reference speed v_t of the speed intervals V^k (CALMM-Drive Eq. 5): the ego speed at the
  decision's stamp, latched for the decision's life. Recomputing V^k from the speed at every 0.5 s
  replan would let a run of C or A decisions compound speed (each replan's upper bound lambda v_t
  moving up with the speed the last plan reached);
- the lanes each lateral choice meant when it was decided (``with_lanes``): a lane change takes about
  as long as T_d, so halfway through it the ego is in the target lane and "left" seen from there is
  another lane. ``target_lane`` resolves L / K / R to the lanes they named at the decision.

The contract has one owner, this module, for every path a decision takes (the planner node, the
bridge's in-process stack planners, ``DecisionGuidedPlanner``):

- ``check_decision`` is the one validation: at the ROS boundary (``luna_msgs_py.convert``) and where an
  in-process decision source hands a decision to the planner (``latch``);
- ``DecisionTiming`` owns T_d and what derives from it: the timeout (2 T_d unless set), whether an
  instant is a decision instant, and why a decision is no longer in force;
- ``DecisionTracker`` owns "the decision in force at time t": latched once per decision stamp, aged
  against the timing's timeout, its candidate set as published.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from luna_core.types import ACTION_INDEX, DecisionDistribution, EgoState, candidate_set, validate_distribution

# An ego state this close (s) to the decision's stamp gives its speed; beyond, the speed is interpolated.
STAMP_TOLERANCE = 0.05
DEFAULT_DECISION_PERIOD = 2.0  # s, T_d (CALMM-Drive C_d; ros_ws/src/luna_bringup/config/common.param.yaml)
DEFAULT_GAMMA_P = 0.1  # candidate-set threshold of Eq. 19
TIMEOUT_PERIODS = 2.0  # a decision is followed for 2 T_d: one missed decision is tolerated, two are not
# Two instants this close (s) are the same instant (stamps travel as integer ns; floats differ by ~1e-9).
SAME_INSTANT = 1e-6


class InvalidDecision(ValueError):
    """A decision that cannot be followed (bad probabilities or action codes)."""


class DecisionTimingError(ValueError):
    """A decision period / timeout that cannot be used (negative, not finite, or no timeout at all)."""


def check_decision(decision: DecisionDistribution) -> DecisionDistribution:
    """``decision`` with its probabilities as a validated float64 array; raises ``InvalidDecision``
    saying what is wrong (a non-finite stamp, a bad distribution, unknown candidate codes)."""
    if not math.isfinite(decision.stamp):
        raise InvalidDecision(f"decision stamp is not finite ({decision.stamp})")
    try:
        p = validate_distribution(decision.probabilities)
    except (ValueError, TypeError) as exc:
        raise InvalidDecision(str(exc)) from None
    unknown = [code for code in decision.candidate_set if code not in ACTION_INDEX]
    if unknown:
        raise InvalidDecision(f"unknown action code(s) {unknown} in the candidate set")
    return replace(decision, probabilities=p)


@dataclass(frozen=True)
class DecisionTiming:
    """T_d and what derives from it. ``timeout`` 0 = derived: ``TIMEOUT_PERIODS`` T_d. ``period`` 0 =
    no decision instants (a planner that does not wait for decisions); its timeout must then be set."""

    period: float = DEFAULT_DECISION_PERIOD  # s, T_d
    timeout: float = 0.0  # s; 0 = 2 T_d

    def __post_init__(self) -> None:
        for name in ("period", "timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0.0):
                raise DecisionTimingError(f"DecisionTiming.{name} must be a finite number >= 0 s, got {value!r}")
        if self.period == 0.0 and self.timeout == 0.0:
            raise DecisionTimingError("DecisionTiming: decision_timeout must be set (> 0) when decision_period is "
                                      "0: there is no T_d to derive it from")

    @property
    def expiry(self) -> float:
        """s after its stamp when a decision stops being followed."""
        return self.timeout if self.timeout > 0.0 else TIMEOUT_PERIODS * self.period

    def due(self, now: float) -> bool:
        """Whether ``now`` is a decision instant (a multiple of T_d): the decision node issues one there,
        so a lock-step planner waits for it."""
        if self.period <= 0.0 or not math.isfinite(now):
            return False
        cycles = now / self.period
        return abs(cycles - round(cycles)) < SAME_INSTANT

    def stale(self, stamp: float, now: float) -> str:
        """Why a decision stamped ``stamp`` is no longer in force at ``now``; "" while it is."""
        age = now - stamp
        if not math.isfinite(age):
            return f"decision age is not finite (stamp {stamp}, now {now})"
        if age > self.expiry:
            derived = " = 2 T_d" if self.timeout == 0.0 else ""
            return f"decision is stale ({age:.2f} s old > {self.expiry:.2f} s{derived})"
        return ""


@dataclass(frozen=True)
class DecisionInForce:
    """A validated decision with its latched reference speed."""

    stamp: float  # s, the decision's stamp
    probabilities: np.ndarray  # (10,) validated
    candidate_set: tuple[str, ...]  # C_t, most likely first
    reference_speed: float  # m/s: the ego speed at ``stamp``
    reference_note: str = ""  # how the reference speed was found when not at the stamp
    # Lateral code -> the lane sequence it led into when the decision was first planned with.
    lanes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def age(self, now: float) -> float:
        """s since the decision's stamp (inf if either time is not finite)."""
        age = now - self.stamp
        return age if math.isfinite(age) else math.inf

    def probability(self, code: str) -> float:
        return float(self.probabilities[ACTION_INDEX[code]])

    def with_lanes(self, lanes: Mapping[str, Sequence[str]]) -> "DecisionInForce":
        """This decision with the lanes of its lateral choices fixed (keyed "K", "L", "R")."""
        return replace(self, lanes={code: tuple(ids) for code, ids in lanes.items()})

    def target_lane(self, lateral: str, current: Mapping[str, Sequence[str]]) -> str | None:
        """Which of the ``current`` lateral choices (code -> lane sequence from the ego's lane now) leads
        into the lanes ``lateral`` named at the decision; None if none does any more (or it had none)."""
        target = self.lanes.get(lateral)
        if target is None:
            return None
        wanted = set(target)
        # The choice whose own lane is on the decided sequence, else the one sharing the most lanes.
        for code, ids in current.items():
            if ids and ids[0] in wanted:
                return code
        overlap = {code: len(wanted.intersection(ids)) for code, ids in current.items()}
        best = max(overlap, key=overlap.get, default=None)
        return best if best is not None and overlap[best] > 0 else None


def speed_at(history: Sequence[EgoState], stamp: float) -> tuple[float, str]:
    """The ego speed (m/s) at ``stamp`` from a history (oldest first) and, if it is not simply the state
    at that stamp, a note saying how it was obtained (interpolated, or the nearest state's)."""
    states = [s for s in history if s.is_finite()]
    if not states:
        raise InvalidDecision("no finite ego state to take the decision's reference speed from")
    t = np.array([s.stamp for s in states])
    v = np.array([max(s.velocity, 0.0) for s in states])
    nearest = int(np.argmin(np.abs(t - stamp)))
    if abs(t[nearest] - stamp) <= STAMP_TOLERANCE:
        return float(v[nearest]), ""
    if t[0] < stamp < t[-1]:
        order = np.argsort(t, kind="stable")
        return float(np.interp(stamp, t[order], v[order])), "interpolated from the ego history"
    return float(v[nearest]), f"no ego state at the decision's stamp: speed at t={t[nearest]:.2f} s"


def latch(decision: DecisionDistribution, history: Sequence[EgoState],
          gamma_p: float = DEFAULT_GAMMA_P) -> DecisionInForce:
    """The decision in force for ``decision`` (raises ``InvalidDecision`` saying what is wrong). C_t
    is the candidate set as published; ``gamma_p`` gives it only when the decision carries none."""
    checked = check_decision(decision)
    chosen = tuple(checked.candidate_set) or tuple(candidate_set(checked.probabilities, gamma_p))
    speed, note = speed_at(history, checked.stamp)
    return DecisionInForce(checked.stamp, checked.probabilities, chosen, speed, note)


@dataclass
class DecisionTracker:
    """The decision in force at time t, for one planner: each decision is latched once (the first
    time it is offered), then followed until ``timing`` says it is stale or a newer one is offered."""

    timing: DecisionTiming = field(default_factory=DecisionTiming)
    gamma_p: float = DEFAULT_GAMMA_P  # C_t of a decision that carries no candidate set
    current: DecisionInForce | None = None

    def reset(self) -> None:
        self.current = None

    def follow(self, decision: DecisionDistribution | None, history: Sequence[EgoState], now: float,
               lanes: Mapping[str, Sequence[str]] | None = None) -> tuple[DecisionInForce | None, list[str]]:
        """(the decision in force at ``now`` or None, notes saying why none is or how it was latched).
        ``decision`` is the latest one received; ``lanes`` (lateral code -> lane sequence now) are fixed
        into a decision when it is latched (``DecisionInForce.with_lanes``)."""
        if decision is None:
            self.current = None
            return None, ["no decision received"]
        notes: list[str] = []
        if self.current is None or self.current.stamp != decision.stamp:
            try:
                latched = latch(decision, history, self.gamma_p)
            except InvalidDecision as exc:
                self.current = None
                return None, [f"invalid decision: {exc}"]
            self.current = latched.with_lanes(lanes) if lanes is not None else latched
            if latched.reference_note:
                notes.append(f"decision's reference speed: {latched.reference_note}")
        why = self.timing.stale(self.current.stamp, now)
        if why:
            return None, [*notes, why]
        return self.current, notes
