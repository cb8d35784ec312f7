"""Field-by-field equality of luna_core dataclasses (numpy arrays and floats with a tolerance)."""

from __future__ import annotations

import dataclasses
import math
from enum import Enum

import numpy as np


def assert_same(a, b, path: str = "value", tol: float = 1e-9) -> None:
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", tol)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        assert a_arr.shape == b_arr.shape, f"{path}: shape {a_arr.shape} != {b_arr.shape}"
        assert np.allclose(a_arr, b_arr, atol=tol, equal_nan=True), f"{path}: {a_arr} != {b_arr}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]", tol)
    elif isinstance(a, (list, tuple)) and not isinstance(a, Enum):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) or isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, abs_tol=tol), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
