"""Result of one metric on one simulation log (a nuPlan ``MetricStatistics`` in miniature)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class MetricResult:
    name: str
    score: float  # in [0, 1]
    statistics: dict[str, Any] = field(default_factory=dict)
    time_series: list[float | None] | None = None  # one value per simulation step, if time-resolved

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "score": json_float(self.score),
                "statistics": {k: json_float(v) for k, v in self.statistics.items()},
                "time_series": None if self.time_series is None else [json_float(v) for v in self.time_series]}


def json_float(value: Any) -> Any:
    """JSON-safe value: numpy scalars to Python, non-finite floats to None, floats rounded to 1e-9
    (the rounding makes the written files independent of last-bit summation-order noise)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return round(v, 9) if math.isfinite(v) else None
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [json_float(v) for v in value]
    raise TypeError(f"metric value of type {type(value).__name__} is not serialisable")


def series(values: np.ndarray) -> list[float | None]:
    return [json_float(v) for v in np.asarray(values, dtype=np.float64)]
