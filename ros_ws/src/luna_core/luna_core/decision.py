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
  moving up with the speed the last plan reached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from luna_core.types import ACTION_INDEX, DecisionDistribution, EgoState, candidate_set, validate_distribution

# An ego state this close (s) to the decision's stamp gives its speed; beyond, the speed is interpolated.
STAMP_TOLERANCE = 0.05


class InvalidDecision(ValueError):
    """A decision that cannot be followed (bad probabilities or action codes)."""


@dataclass(frozen=True)
class DecisionInForce:
    """A validated decision with its latched reference speed."""

    stamp: float  # s, the decision's stamp
    probabilities: np.ndarray  # (10,) validated
    candidate_set: tuple[str, ...]  # C_t, most likely first
    reference_speed: float  # m/s: the ego speed at ``stamp``
    reference_note: str = ""  # how the reference speed was found when not at the stamp

    def age(self, now: float) -> float:
        """s since the decision's stamp (inf if either time is not finite)."""
        age = now - self.stamp
        return age if math.isfinite(age) else math.inf

    def probability(self, code: str) -> float:
        return float(self.probabilities[ACTION_INDEX[code]])


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


def latch(decision: DecisionDistribution, history: Sequence[EgoState], gamma_p: float = 0.1) -> DecisionInForce:
    """The decision in force for ``decision`` (raises ``InvalidDecision`` saying what is wrong);
    ``gamma_p`` gives C_t only when the decision carries no candidate set."""
    if not math.isfinite(decision.stamp):
        raise InvalidDecision(f"decision stamp is not finite ({decision.stamp})")
    try:
        p = validate_distribution(decision.probabilities)
    except (ValueError, TypeError) as exc:
        raise InvalidDecision(str(exc)) from None
    unknown = [code for code in decision.candidate_set if code not in ACTION_INDEX]
    if unknown:
        raise InvalidDecision(f"unknown action code(s) {unknown} in the candidate set")
    chosen = tuple(decision.candidate_set) or tuple(candidate_set(p, gamma_p))
    speed, note = speed_at(history, decision.stamp)
    return DecisionInForce(decision.stamp, p, chosen, speed, note)
