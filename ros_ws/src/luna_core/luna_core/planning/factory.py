"""Planners by name, for the planner node, the bridge and the benchmarks.

``luna`` is the decision-guided Diffusion-ES planner (LUNA-AD Sec. III-D); ``diffusion-es`` the same
search without the decision term; ``pdm`` the PDM-Closed-style baseline; ``idm`` the IDM baseline.
Options are passed through to the planner's config (unknown options are an error).
"""

from __future__ import annotations

from typing import Any, Callable

from luna_core.types import Planner

PLANNER_NAMES = ("luna", "diffusion-es", "pdm", "idm")


class PlannerConfigError(ValueError):
    """Unknown planner name or option."""


def _pdm(options: dict[str, Any]) -> Planner:
    from luna_core.planning.pdm_closed import PDMClosedConfig, PDMClosedPlanner
    return PDMClosedPlanner(_config(PDMClosedConfig, options, "pdm"))


def _idm(options: dict[str, Any]) -> Planner:
    from luna_core.planning.proposals import IDMPlanner
    if options:
        raise PlannerConfigError(f"planner 'idm' takes no options, got {sorted(options)}")
    return IDMPlanner()


def _decision_guided(use_decisions: bool) -> Callable[[dict[str, Any]], Planner]:
    def make(options: dict[str, Any]) -> Planner:
        from luna_core.planning.decision_guided import DecisionGuidedConfig, DecisionGuidedPlanner
        config = _config(DecisionGuidedConfig, {**options, "use_decisions": use_decisions},
                         "luna" if use_decisions else "diffusion-es")
        return DecisionGuidedPlanner(config)
    return make


_FACTORIES: dict[str, Callable[[dict[str, Any]], Planner]] = {
    "pdm": _pdm, "idm": _idm, "luna": _decision_guided(True), "diffusion-es": _decision_guided(False)}


def _config(cls, options: dict[str, Any], name: str):
    import dataclasses
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(options) - known
    if unknown:
        raise PlannerConfigError(f"planner '{name}': unknown option(s) {sorted(unknown)}; "
                                 f"known: {sorted(known)}")
    return cls(**options)


def make_planner(name: str, options: dict[str, Any] | None = None) -> Planner:
    if name not in _FACTORIES:
        raise PlannerConfigError(f"unknown planner '{name}'; one of {', '.join(PLANNER_NAMES)}")
    return _FACTORIES[name](dict(options or {}))
