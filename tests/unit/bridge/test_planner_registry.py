"""One planner registry (luna_core.planning.factory) for the node, the nuPlan adapter and the bridge's
evaluation, which adds only the expert's log replay and the stack variants' decision sources."""

from __future__ import annotations

import sys
import types

import pytest

from luna_core.planning import factory
from luna_core.planning.decision_guided import DecisionGuidedPlanner
from luna_core.planning.factory import PlannerConfigError, make_planner, planner_names, register_planner
from luna_core.planning.pdm_closed import PDMClosedPlanner
from luna_core.planning.proposals import IDMPlanner

from luna_bridge.baselines import EXPERT, eval_planner_names, make_eval_planner
from luna_bridge.scenario import Scenario
from luna_bridge.sim import LogReplayPlanner
from luna_bridge.stack_planner import StackPlanner, StackSettings, current_settings, search_planner, use_settings
from tests.scenario_samples import lead_vehicle_scenario



def test_the_registry_holds_the_stack_planners_in_the_node_s_order() -> None:
    assert planner_names()[:4] == ("luna", "diffusion-es", "pdm", "idm")
    assert isinstance(make_planner("pdm"), PDMClosedPlanner) and isinstance(make_planner("idm"), IDMPlanner)
    luna, des = make_planner("luna", {"population": 8}), make_planner("diffusion-es")
    assert isinstance(luna, DecisionGuidedPlanner) and luna.config.use_decisions and luna.config.search.population == 8
    assert isinstance(des, DecisionGuidedPlanner) and not des.config.use_decisions


def test_unknown_names_and_options_are_named_with_what_is_known() -> None:
    with pytest.raises(PlannerConfigError, match=r"unknown planner 'lunar'; one of luna, diffusion-es, pdm, idm"):
        make_planner("lunar")
    with pytest.raises(PlannerConfigError, match=r"planner 'pdm': unknown option\(s\) \['speed'\]; known: \["):
        make_planner("pdm", {"speed": 3.0})
    with pytest.raises(PlannerConfigError, match="planner 'idm' takes no options"):
        make_planner("idm", {"population": 8})
    with pytest.raises(PlannerConfigError, match=r"unknown planner 'lunar'; one of .*log-replay.*luna-k0"):
        make_eval_planner("lunar", lead_vehicle_scenario(1.0))


def test_a_registered_planner_is_built_lazily_and_evaluable(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("registry_test_planners")
    module.build = lambda options: IDMPlanner() if not options else PDMClosedPlanner()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "registry_test_planners", module)
    monkeypatch.setattr(factory, "_REGISTRY", dict(factory._REGISTRY))  # registrations end with the test
    register_planner("mine", "registry_test_planners:build")
    assert isinstance(make_planner("mine"), IDMPlanner) and isinstance(make_planner("mine", {"x": 1}), PDMClosedPlanner)
    assert "mine" in eval_planner_names() and isinstance(make_eval_planner("mine", lead_vehicle_scenario(1.0)),
                                                         IDMPlanner)
    with pytest.raises(PlannerConfigError, match="'mine' is already registered"):
        register_planner("mine", module.build)
    with pytest.raises(PlannerConfigError, match="must look like 'package.module:attribute'"):
        register_planner("other", "registry_test_planners.build")
    register_planner("mine", lambda options: PDMClosedPlanner(), replace=True)
    assert isinstance(make_planner("mine"), PDMClosedPlanner)


def test_the_eval_lineup_is_the_registry_plus_the_expert_and_the_stack_variants() -> None:
    assert eval_planner_names() == ["diffusion-es", "idm", "log-replay", "luna", "luna-k0", "luna-no-reflection",
                                    "luna-onehot", "luna-onehot-oracle", "luna-oracle", "luna-oracle-cv", "pdm"]
    scenario: Scenario = lead_vehicle_scenario(1.0)
    assert isinstance(make_eval_planner(EXPERT, scenario), LogReplayPlanner)
    assert isinstance(make_eval_planner("idm", scenario), IDMPlanner)
    assert isinstance(make_eval_planner("pdm", scenario), PDMClosedPlanner)
    previous = current_settings()  # other tests leave their process-wide settings behind
    use_settings(StackSettings())
    try:
        des = make_eval_planner("diffusion-es", scenario)  # the registry's planner, with the stack's settings
    finally:
        use_settings(previous)
    assert isinstance(des, StackPlanner) and des.decision_source is None
    assert des.planner.config == search_planner(False, StackSettings()).config
    assert not des.planner.config.use_decisions and des.planner.config.deterministic
    assert des.planner.config.search.population == StackSettings().population
