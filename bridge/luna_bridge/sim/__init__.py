"""Closed-loop simulation: ``simulate(scenario, planner, reactive)`` -> ``SimulationLog``."""

from luna_bridge.sim.log_replay import LogReplayPlanner
from luna_bridge.sim.simulator import DecisionSource, SimulationConfig, simulate

__all__ = ["simulate", "SimulationConfig", "DecisionSource", "LogReplayPlanner"]
