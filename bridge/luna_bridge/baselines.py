"""Registry of planners the bridge can evaluate, by name.

A factory takes the scenario (only the expert's log replay may read it; planners that compete must
ignore it, like nuPlan's ``requires_scenario = False``) and returns a ``luna_core.types.Planner``.
Registering is one line, either a callable or a lazy ``"module:attribute"`` path (so heavy planners,
e.g. ones loading models, are imported only when evaluated)::

    register_planner("my-planner", "my_package.planners:make_planner")

The full stack and its ablations (``luna``, ``luna-k0``, ``luna-onehot``, ``luna-no-reflection``) and
``diffusion-es`` are registered here from ``luna_bridge.stack_planner``.
"""

from __future__ import annotations

import importlib
from typing import Callable, Union

from luna_core.planning.pdm_closed import PDMClosedPlanner
from luna_core.planning.proposals import IDMPlanner
from luna_core.types import Planner

from luna_bridge.scenario import Scenario
from luna_bridge.sim import LogReplayPlanner
from luna_bridge.stack_planner import SEARCH_PLANNERS, make_stack_planner

PlannerFactory = Callable[[Scenario], Planner]
EXPERT = "log-replay"  # the expert row every results table carries

_REGISTRY: dict[str, Union[PlannerFactory, str]] = {}


class UnknownPlannerError(KeyError):
    """A planner name that nobody registered."""


def register_planner(name: str, factory: Union[PlannerFactory, str], *, replace: bool = False) -> None:
    """Make ``name`` evaluable; ``factory`` is ``f(scenario) -> Planner`` or ``"module:attribute"``."""
    if name in _REGISTRY and not replace:
        raise ValueError(f"planner {name!r} is already registered")
    if isinstance(factory, str) and ":" not in factory:
        raise ValueError(f"lazy planner factory {factory!r} must look like 'package.module:attribute'")
    _REGISTRY[name] = factory


def planner_names() -> list[str]:
    return sorted(_REGISTRY)


def make_planner(name: str, scenario: Scenario) -> Planner:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownPlannerError(f"unknown planner {name!r}; registered: {', '.join(planner_names())}") from None
    if isinstance(factory, str):
        module, attr = factory.split(":", 1)
        factory = getattr(importlib.import_module(module), attr)
    return factory(scenario)  # type: ignore[operator]


def _search_planner(variant: str) -> PlannerFactory:
    return lambda scenario: make_stack_planner(variant, scenario)  # models load when it is built


register_planner(EXPERT, LogReplayPlanner)
register_planner("idm", lambda scenario: IDMPlanner())
register_planner("pdm", lambda scenario: PDMClosedPlanner())
for _variant in SEARCH_PLANNERS:
    register_planner(_variant, _search_planner(_variant))
