"""decision_stack: decision_inference and explainer in one process on one model instance (the student
is loaded once; the explainer yields to the periodic decision)."""

from __future__ import annotations

from luna_nodes.base import run
from luna_nodes.decision_inference import DecisionInference
from luna_nodes.explainer import Explainer
from luna_nodes.shared_model import SharedHeuristic


def main(args=None) -> int:
    """Both nodes sharing one model instance; the explainer is not critical (one that cannot start leaves
    decisions running)."""
    shared = SharedHeuristic()
    return run([lambda: DecisionInference(shared)], args, optional=[lambda: Explainer(shared)])


if __name__ == "__main__":
    raise SystemExit(main())
