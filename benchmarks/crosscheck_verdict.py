"""The verdict of ``benchmarks/nuplan_crosscheck.py``: which compared values disagree, and its exit status.

Kept apart from the cross-check's devkit imports so that it is tested without the devkit
(``tests/unit/bridge/test_crosscheck_verdict.py``). Exit status: 0 when every value agrees, 1 when
any disagrees (the disagreements are printed), 2 when the devkit cannot be imported.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Tracking: both sides integrate the same LQR + kinematic bicycle; they agree to float noise (~1e-10).
TRACKING_TOLERANCE = 1e-6  # m, rad and m/s
#: Metrics: scores in [0, 1], compared as docs/nuplan.md states.
METRIC_TOLERANCE = 0.01

EXIT_AGREE, EXIT_DISAGREE, EXIT_NO_DEVKIT = 0, 1, 2


@dataclass(frozen=True)
class Disagreement:
    what: str
    ours: float
    theirs: float
    tolerance: float

    def __str__(self) -> str:
        return (f"{self.what}: ours {self.ours:.6g}, devkit {self.theirs:.6g} "
                f"(|difference| {abs(self.ours - self.theirs):.3g} > {self.tolerance:g})")


def tracking_disagreements(case: str, max_position: float, max_heading: float, max_velocity: float
                           ) -> list[Disagreement]:
    """One tracking run's largest state differences (m, rad, m/s) against ``TRACKING_TOLERANCE``; a
    NaN difference is a disagreement."""
    out = []
    for name, diff in (("position (m)", max_position), ("heading (rad)", max_heading), ("speed (m/s)", max_velocity)):
        if not diff <= TRACKING_TOLERANCE:
            out.append(Disagreement(f"tracking {case}: max {name} difference", diff, 0.0, TRACKING_TOLERANCE))
    return out


def metric_disagreement(case: str, metric: str, ours: float, theirs: float) -> Disagreement | None:
    if abs(ours - theirs) <= METRIC_TOLERANCE:
        return None
    return Disagreement(f"metric {metric} on {case}", ours, theirs, METRIC_TOLERANCE)


def exit_status(disagreements: list[Disagreement]) -> int:
    return EXIT_DISAGREE if disagreements else EXIT_AGREE
