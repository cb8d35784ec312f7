"""Skip (with the reason printed) where the nuPlan devkit is not importable: it is not on PyPI."""

from __future__ import annotations

import importlib

import pytest


def require_devkit(*modules: str) -> None:
    """Skip the calling test unless ``nuplan`` and ``modules`` (e.g. ``hydra``) import."""
    try:
        for name in ("nuplan", *modules):
            importlib.import_module(name)
    except ImportError as exc:
        reason = (f"nuPlan devkit ({', '.join(('nuplan', *modules))}) not importable here ({exc}); the devkit "
                  "is not on PyPI: see docs/nuplan.md for running this test with a local devkit")
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
