"""The docs and the bundled parameter files agree with the nodes' declared interfaces."""

import importlib
from pathlib import Path

import pytest
import yaml

from luna_bringup.topology import COMMON_PARAMS, config_dir, load_topology
from luna_nodes.docs import NODE_MODULES
from luna_nodes.docs import main as docs_main
from luna_core.types import VehicleParameters
from luna_nodes.params import VEHICLE_PARAMS, validate, vehicle_parameters

REPO = Path(__file__).resolve().parents[3]


def test_node_docs_are_up_to_date():
    assert docs_main([str(REPO / "docs/nodes"), "--check"]) == 0, \
        "run: python -m luna_nodes.docs docs/nodes"


def test_every_topology_node_is_documented():
    for process in load_topology().processes:
        for node in process.nodes:
            assert node in NODE_MODULES, f"node {node} of process {process.name} has no docs entry"


@pytest.mark.parametrize("node", sorted(NODE_MODULES))
def test_bundled_parameter_file_is_valid(node):
    module, _, attr = NODE_MODULES[node].partition(":")
    specs = {s.name: s for s in getattr(importlib.import_module(module), attr or "INTERFACE").params}
    path = config_dir() / f"{node}.yaml"
    assert path.exists(), f"missing {path}"
    values = yaml.safe_load(path.read_text())[node]["ros__parameters"]
    unknown = set(values) - set(specs)
    assert not unknown, f"{path}: unknown parameters {sorted(unknown)}"
    for name, value in values.items():
        validate(specs[name], value)


def _specs(node: str) -> dict:
    module, _, attr = NODE_MODULES[node].partition(":")
    return {s.name: s for s in getattr(importlib.import_module(module), attr or "INTERFACE").params}


def test_shared_parameters_are_set_once_and_valid_for_every_node_reading_them():
    """T_d, gamma_p and the derived timeout live in common.param.yaml only: every process reads it
    before its nodes' files (both launchers), and no node file sets them again."""
    path = config_dir() / COMMON_PARAMS
    shared = yaml.safe_load(path.read_text())["/**"]["ros__parameters"]
    assert set(shared) == {"decision_period", "decision_timeout", "gamma_p", *(s.name for s in VEHICLE_PARAMS)}, shared
    readers = {name: [n for n in NODE_MODULES if name in _specs(n)] for name in shared}
    assert sorted(readers["decision_period"]) == ["decision_inference", "planner", "progress_monitor"], readers
    assert readers["decision_timeout"] == ["planner"], readers
    assert sorted(readers["gamma_p"]) == ["decision_inference", "explainer", "planner"], readers
    # The ego's geometry: every node that needs the ego's box reads the same values, nuPlan's defaults.
    for spec in VEHICLE_PARAMS:
        assert sorted(readers[spec.name]) == ["planner", "progress_monitor", "reflection_client",
                                              "scene_descriptor"], readers
    assert vehicle_parameters(shared) == VehicleParameters()
    for name, nodes in readers.items():
        for node in nodes:
            validate(_specs(node)[name], shared[name])
            own = yaml.safe_load((config_dir() / f"{node}.yaml").read_text())[node]["ros__parameters"]
            assert name not in own, f"{node}.yaml sets {name} again: it belongs to {COMMON_PARAMS} only"
    # The planner's timeout derives from T_d: 2 T_d.
    from luna_core.decision import DecisionTiming
    assert DecisionTiming(shared["decision_period"], shared["decision_timeout"]).expiry == 2 * shared["decision_period"]


def test_every_process_reads_the_shared_file_first():
    topology = load_topology()
    for process in topology.processes:
        files = process.params_files(config_dir())
        assert files[0].name == COMMON_PARAMS and [f.name for f in files[1:]] == [f"{n}.yaml" for n in process.nodes]
        args = topology.ros_arguments(process, config_dir())
        assert args[:3] == ["--ros-args", "--params-file", str(config_dir() / COMMON_PARAMS)], args
