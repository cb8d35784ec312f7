"""What ``luna-bridge eval`` can evaluate, by name: luna_core's planner registry plus the two things only
the bridge has.

* ``log-replay``, the expert row: it replays the scenario's log, so it is the one entrant that reads
  the scenario (every planner of the registry is built without it, like nuPlan's
  ``requires_scenario = False``).
* The stack variants (``luna_bridge.stack_planner``: ``luna``, ``luna-k0``, ``luna-onehot``,
  ``luna-no-reflection``, the oracles) and ``diffusion-es``: the registry's decision-guided planner
  built from the run's ``StackSettings``, carrying the decision source the simulator asks every T_d
  (in the ROS stack that is the decision nodes' job, hence not the registry's).

Every other name is ``luna_core.planning.factory.make_planner(name)`` with its default options, so a
planner registered there (``register_planner``) is evaluable too.
"""

from __future__ import annotations

from luna_core.planning.factory import PlannerConfigError, make_planner, planner_names
from luna_core.types import Planner

from luna_bridge.scenario import Scenario
from luna_bridge.sim import LogReplayPlanner
from luna_bridge.stack_planner import SEARCH_PLANNERS, make_stack_planner

EXPERT = "log-replay"  # the expert row every results table carries


def eval_planner_names() -> list[str]:
    return sorted({EXPERT, *SEARCH_PLANNERS, *planner_names()})


def make_eval_planner(name: str, scenario: Scenario) -> Planner:
    """The planner ``luna-bridge eval`` runs as ``name`` on ``scenario`` (only the expert reads it, and the
    oracles, whose logged future is what makes them an upper bound)."""
    if name == EXPERT:
        return LogReplayPlanner(scenario)
    if name in SEARCH_PLANNERS:
        return make_stack_planner(name, scenario)  # models load when it is built
    if name in planner_names():
        return make_planner(name)
    raise PlannerConfigError(f"unknown planner {name!r}; one of {', '.join(eval_planner_names())}")
