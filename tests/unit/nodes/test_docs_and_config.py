"""The docs and the bundled parameter files agree with the nodes' declared interfaces."""

import importlib
from pathlib import Path

import pytest
import yaml

from luna_bringup.topology import config_dir, load_topology
from luna_nodes.docs import NODE_MODULES
from luna_nodes.docs import main as docs_main
from luna_nodes.params import validate

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
