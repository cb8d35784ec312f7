"""nuPlan's closed-loop score (CLS) of one simulation log, and the aggregate over scenarios.

CLS = product of {no_ego_at_fault_collisions, drivable_area_compliance, ego_is_making_progress,
driving_direction_compliance} x weighted mean of {ego_progress_along_expert_route 5,
time_to_collision_within_bound 5, speed_limit_compliance 4, ego_is_comfortable 2}.
A run that crashed (``log.error``) or whose log cannot be scored gets CLS 0 and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from luna_bridge.metrics.collisions import find_collisions, no_ego_at_fault_collisions
from luna_bridge.metrics.comfort import ego_is_comfortable
from luna_bridge.metrics.frames import extract_frames
from luna_bridge.metrics.map_compliance import (drivable_area_compliance, driving_direction_compliance,
                                                speed_limit_compliance)
from luna_bridge.metrics.progress import ego_is_making_progress, ego_progress_along_expert_route
from luna_bridge.metrics.result import MetricResult, json_float
from luna_bridge.metrics.ttc import time_to_collision_within_bound
from luna_bridge.scenario import SIM_DT, SimulationLog

MULTIPLIER_METRICS = ("no_ego_at_fault_collisions", "drivable_area_compliance", "ego_is_making_progress",
                      "driving_direction_compliance")
WEIGHTED_METRICS = {"ego_progress_along_expert_route": 5.0, "time_to_collision_within_bound": 5.0,
                    "speed_limit_compliance": 4.0, "ego_is_comfortable": 2.0}
METRIC_NAMES = MULTIPLIER_METRICS + tuple(WEIGHTED_METRICS)


@dataclass
class ScenarioScore:
    scenario: str
    scenario_type: str
    planner: str
    reactive: bool
    score: float
    metrics: dict[str, MetricResult] = field(default_factory=dict)
    error: str = ""

    @property
    def success(self) -> bool:
        return self.score > 0.0

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "scenario_type": self.scenario_type, "planner": self.planner,
                "mode": "reactive" if self.reactive else "non_reactive", "score": json_float(self.score),
                "error": self.error, "metrics": {k: m.to_json() for k, m in self.metrics.items()}}


def closed_loop_score(metrics: dict[str, MetricResult]) -> float:
    product = float(np.prod([metrics[m].score for m in MULTIPLIER_METRICS]))
    weighted = sum(w * metrics[m].score for m, w in WEIGHTED_METRICS.items()) / sum(WEIGHTED_METRICS.values())
    return product * weighted


def score_log(log: SimulationLog) -> ScenarioScore:
    """All CLS components and the score of one run."""
    head = dict(scenario=log.scenario.name, scenario_type=log.scenario.scenario_type, planner=log.planner,
                reactive=log.reactive)
    if log.error:
        return ScenarioScore(**head, score=0.0, error=log.error)
    try:
        frames = extract_frames(log)
    except ValueError as exc:
        return ScenarioScore(**head, score=0.0, error=f"log cannot be scored: {exc}")
    collisions = find_collisions(frames)
    progress = ego_progress_along_expert_route(log, frames)
    velocity = log.ego_array()[:, 3]
    results = [no_ego_at_fault_collisions(frames, collisions), drivable_area_compliance(frames),
               ego_is_making_progress(progress), driving_direction_compliance(frames, SIM_DT), progress,
               time_to_collision_within_bound(frames, collisions), speed_limit_compliance(frames, SIM_DT),
               ego_is_comfortable(frames, velocity, SIM_DT)]
    metrics = {m.name: m for m in results}
    return ScenarioScore(**head, score=closed_loop_score(metrics), metrics=metrics)


@dataclass(frozen=True)
class Aggregate:
    """Mean CLS (0-100) and success rate (share of non-zero scores, 0-100) over scenarios."""

    count: int
    cls: float
    success_rate: float


def aggregate(scores: Iterable[float]) -> Aggregate:
    """Over per-scenario CLS values in [0, 1] (crashed and unloadable runs count as 0)."""
    s = [float(x) for x in scores]
    if not s:
        return Aggregate(0, float("nan"), float("nan"))
    return Aggregate(len(s), 100.0 * float(np.mean(s)), 100.0 * float(np.mean([v > 0.0 for v in s])))
