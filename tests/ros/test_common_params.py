"""The shared parameter file reaches the nodes as both launchers pass it (issue 15): every process
reads config/common.param.yaml first (T_d, gamma_p, the derived timeout), then its nodes' own files,
which may override a shared value. Real processes with the command lines ``luna up`` builds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from luna_bringup.topology import COMMON_PARAMS, ProcessSpec, Topology, config_dir
from tests.ros.helpers import Probe, get_parameters, ros_env, stop_process


def _start(spec: ProcessSpec, params_dir: Path) -> subprocess.Popen:
    exe = str(Path(sys.executable).parent / spec.executable)
    return subprocess.Popen([exe, *Topology([spec]).ros_arguments(spec, params_dir)], env=ros_env(),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_shared_t_d_reaches_each_node_and_a_node_file_overrides_it(tmp_path, ros_context):
    params = tmp_path / "params"
    params.mkdir()
    for name in (COMMON_PARAMS, "progress_monitor.yaml", "planner.yaml"):
        shutil.copy(config_dir() / name, params / name)
    common = yaml.safe_load((params / COMMON_PARAMS).read_text())
    common["/**"]["ros__parameters"].update(decision_period=0.5, gamma_p=0.25)
    (params / COMMON_PARAMS).write_text(yaml.safe_dump(common))
    # The planner's own file overrides the shared gamma_p; T_d and the timeout stay shared.
    own = yaml.safe_load((params / "planner.yaml").read_text())
    own["planner"]["ros__parameters"].update(gamma_p=0.3, autostart=False)
    (params / "planner.yaml").write_text(yaml.safe_dump(own))
    monitor = _start(ProcessSpec("progress_monitor", "luna_nodes", "progress_monitor", ["progress_monitor"]), params)
    planner = _start(ProcessSpec("planner", "luna_nodes", "planner", ["planner"]), params)
    probe = Probe(ros_context)
    try:
        assert get_parameters(probe, "progress_monitor", ["decision_period"], timeout=60.0) == {"decision_period": 0.5}
        assert get_parameters(probe, "planner", ["decision_period", "decision_timeout", "gamma_p"], timeout=60.0) \
            == {"decision_period": 0.5, "decision_timeout": 0.0, "gamma_p": 0.3}
    finally:
        probe.close()
        out = stop_process(monitor) + stop_process(planner)
        print(out)  # shown with a failure above: whether a process died or only the answer was lost
    assert "Traceback" not in out, out
