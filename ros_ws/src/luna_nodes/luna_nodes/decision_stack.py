"""decision_stack: decision_inference and explainer in one process on one model instance (the student
is loaded once; the explainer yields to the periodic decision). A standby (``luna up``) preloads that
instance with decision_inference's model parameters."""

from __future__ import annotations

from luna_nodes.base import run
from luna_nodes.decision_inference import DecisionInference, preload_model
from luna_nodes.explainer import Explainer
from luna_nodes.shared_model import SharedHeuristic


def main(args=None) -> int:
    """Both nodes sharing one model instance; the explainer is not critical (one that cannot start leaves
    decisions running)."""
    shared = SharedHeuristic()
    return run([lambda: DecisionInference(shared)], args, optional=[lambda: Explainer(shared)],
               preload=lambda argv: preload_model(shared, argv))


if __name__ == "__main__":
    raise SystemExit(main())
