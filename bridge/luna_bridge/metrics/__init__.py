"""nuPlan closed-loop metrics on ``SimulationLog``s (per-scenario CLS, success rate, NR / R).

``score_log(log)`` computes every CLS component (each a ``MetricResult`` with statistics and, for the
time-resolved ones, one value per step) and the scenario score; ``aggregate`` gives the mean CLS and
success rate over scenarios.
"""

from luna_bridge.metrics.result import MetricResult
from luna_bridge.metrics.score import (METRIC_NAMES, MULTIPLIER_METRICS, WEIGHTED_METRICS, Aggregate,
                                       ScenarioScore, aggregate, closed_loop_score, score_log)

__all__ = ["METRIC_NAMES", "MULTIPLIER_METRICS", "WEIGHTED_METRICS", "Aggregate", "MetricResult",
           "ScenarioScore", "aggregate", "closed_loop_score", "score_log"]
