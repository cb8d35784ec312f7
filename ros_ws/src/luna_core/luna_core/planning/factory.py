"""The planner registry: every planner of the stack by name, for the planner node, the bridge's
evaluation and nuPlan adapter, and the offline tools.

``luna`` is the decision-guided Diffusion-ES planner (LUNA-AD Sec. III-D); ``diffusion-es`` the same
search without the decision term; ``pdm`` the PDM-Closed-style baseline; ``idm`` the IDM baseline.
Options are passed through to the planner's config (unknown options are an error).

Registering another planner is one line, a builder ``f(options) -> Planner`` or a lazy
``"module:attribute"`` path (so heavy planners, e.g. ones loading models, are imported only when
built); it is then a planner node choice (if registered before the node is imported) and a
``luna-bridge eval --planner`` name::

    register_planner("my-planner", "my_package.planners:build")

A builder never sees the scenario: planners that compete must not read the future (nuPlan's
``requires_scenario = False``); the bridge's log replay, which must, is the bridge's own.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Union

from luna_core.types import Planner

PlannerBuilder = Callable[[dict[str, Any]], Planner]


class PlannerConfigError(ValueError):
    """Unknown planner name or option, or a bad registration."""


# Insertion order is the listing order (the planner node's parameter choices, in its docs).
_REGISTRY: dict[str, Union[PlannerBuilder, str]] = {}


def register_planner(name: str, builder: Union[PlannerBuilder, str], *, replace: bool = False) -> None:
    """Make ``name`` buildable by ``make_planner``; ``builder`` is ``f(options) -> Planner`` or a lazy
    ``"package.module:attribute"`` path to one."""
    if name in _REGISTRY and not replace:
        raise PlannerConfigError(f"planner {name!r} is already registered (pass replace=True to override it)")
    if isinstance(builder, str) and ":" not in builder:
        raise PlannerConfigError(f"lazy planner builder {builder!r} for {name!r} must look like "
                                 "'package.module:attribute'")
    _REGISTRY[name] = builder


def planner_names() -> tuple[str, ...]:
    """The registered planner names, in registration order."""
    return tuple(_REGISTRY)


def make_planner(name: str, options: dict[str, Any] | None = None) -> Planner:
    """Build planner ``name`` with ``options`` for its config; ``PlannerConfigError`` names an unknown
    planner (listing the known ones) or option."""
    try:
        builder = _REGISTRY[name]
    except KeyError:
        raise PlannerConfigError(f"unknown planner {name!r}; one of {', '.join(_REGISTRY)}") from None
    if isinstance(builder, str):
        module, attr = builder.split(":", 1)
        builder = getattr(importlib.import_module(module), attr)
    return builder(dict(options or {}))


def _config(cls: type, options: dict[str, Any], name: str) -> Any:
    """``cls(**options)`` for planner ``name``'s config dataclass, unknown options named."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(options) - known
    if unknown:
        raise PlannerConfigError(f"planner {name!r}: unknown option(s) {sorted(unknown)}; known: {sorted(known)}")
    return cls(**options)


# The built-in planners; their modules are imported when one is built (the search loads torch).


def _pdm(options: dict[str, Any]) -> Planner:
    from luna_core.planning.pdm_closed import PDMClosedConfig, PDMClosedPlanner
    return PDMClosedPlanner(_config(PDMClosedConfig, options, "pdm"))


def _idm(options: dict[str, Any]) -> Planner:
    from luna_core.planning.proposals import IDMPlanner
    if options:
        raise PlannerConfigError(f"planner 'idm' takes no options, got {sorted(options)}")
    return IDMPlanner()


def _decision_guided(use_decisions: bool) -> PlannerBuilder:
    def build(options: dict[str, Any]) -> Planner:
        from luna_core.planning.decision_guided import DecisionGuidedConfig, DecisionGuidedPlanner
        config = _config(DecisionGuidedConfig, {**options, "use_decisions": use_decisions},
                                     "luna" if use_decisions else "diffusion-es")
        return DecisionGuidedPlanner(config)
    return build


register_planner("luna", _decision_guided(True))
register_planner("diffusion-es", _decision_guided(False))
register_planner("pdm", _pdm)
register_planner("idm", _idm)
