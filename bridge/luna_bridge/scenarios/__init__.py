"""Scenario sources: the JSON scenario format, the synthetic suite, CommonRoad XML, named suites."""

from luna_bridge.scenarios.format import ScenarioFormatError, load_scenario, save_scenario
from luna_bridge.scenarios.registry import SUITES, LoadFailure, SuiteLoad, commonroad_dir, load_suite, suite_refs


def load_commonroad(path: str):  # noqa: ANN201 - lazy: commonroad-io is imported only when used
    """Load one CommonRoad XML scenario (see ``luna_bridge.scenarios.commonroad``)."""
    from luna_bridge.scenarios.commonroad import load_commonroad as _load

    return _load(path)


__all__ = ["ScenarioFormatError", "load_scenario", "save_scenario", "load_suite", "suite_refs", "SUITES",
           "LoadFailure", "SuiteLoad", "commonroad_dir", "load_commonroad"]
