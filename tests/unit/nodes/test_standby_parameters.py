"""What a standby preloads with: a node's parameters read from its command line without rclpy
(``parameters_from_args``), and the shared model taken by a node only when its model parameters are
those of the preload."""

from __future__ import annotations

import pytest
import yaml

from luna_bringup.topology import config_dir, load_topology
from luna_nodes import planner as planner_node
from luna_nodes import shared_model
from luna_nodes.decision_inference import DECISION_INTERFACE
from luna_nodes.params import ParameterError, parameters_from_args
from luna_nodes.shared_model import SharedHeuristic, model_key


def _argv(*files, overrides=()) -> list[str]:
    args = ["planner", "--ros-args"]
    for f in files:
        args += ["--params-file", str(f)]
    for o in overrides:
        args += ["-p", o]
    return args


def test_files_in_order_then_overrides_as_rclpy_reads_them(tmp_path):
    common = tmp_path / "common.yaml"
    common.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"decision_period": 1.0, "population": 64}}}))
    own = tmp_path / "planner.yaml"
    own.write_text(yaml.safe_dump({"planner": {"ros__parameters": {"population": 32, "planner": "pdm"}},
                                   "other_node": {"ros__parameters": {"population": 8}}}))
    p = parameters_from_args(_argv(common, own, overrides=["population:=16", "use_sim_time:=true"]), "planner",
                             planner_node.INTERFACE.params)
    assert (p["decision_period"], p["population"], p["planner"], p["use_sim_time"]) == (1.0, 16, "pdm", True)
    assert p["time_budget"] == next(s.default for s in planner_node.INTERFACE.params if s.name == "time_budget")
    with pytest.raises(ParameterError, match="population"):
        parameters_from_args(_argv(own, overrides=["population:=2"]), "planner", planner_node.INTERFACE.params)


def test_the_bundled_files_give_what_the_planner_node_configures_with():
    """The preload key of the bundled planner.yaml is the key the node's configure computes from the same
    values, so a promoted standby's node takes the preloaded planner."""
    spec = next(p for p in load_topology().processes if p.name == "planner")
    p = parameters_from_args(_argv(*spec.params_files(config_dir())), "planner", planner_node.INTERFACE.params)
    options = planner_node.planner_options(p, planner_node.decision_timing(p), False)
    assert options["population"] == 128 and options["decision_period"] == 2.0 and options["device"] == "cpu"
    p2 = dict(p, population=64)
    assert planner_node._preload_key("luna", options) != planner_node._preload_key(
        "luna", planner_node.planner_options(p2, planner_node.decision_timing(p2), False))


def test_a_node_takes_the_preloaded_model_only_with_the_same_model_parameters(monkeypatch):
    """With a counting stand-in for the loader (the real one reads the student: tests/ros/test_standby.py)."""
    loads = []

    class System:
        def __init__(self):
            self.refreshed = 0

        def refresh_memory(self):
            self.refreshed += 1

    monkeypatch.setattr(shared_model, "load_heuristic", lambda params: loads.append(model_key(params)) or System())
    params = parameters_from_args(["x"], "decision_inference", DECISION_INTERFACE.params)
    shared = SharedHeuristic()
    shared.preload(params)
    preloaded = shared.system
    assert shared.get(params) is preloaded and preloaded.refreshed == 1 and shared.from_standby
    assert shared.get(params) is preloaded and preloaded.refreshed == 1, "the bank is re-read once, at configure"
    other = SharedHeuristic()
    other.preload(params)
    first = other.system
    assert other.get(dict(params, k=1)) is not first and len(loads) == 3, "other parameters: loaded anew"
    assert not other.from_standby
