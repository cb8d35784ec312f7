"""A warm standby (``luna up``; luna_nodes.base.await_promotion) of the real planner and decision
executables: it loads its models while off the ROS graph, joins the graph only once promoted (a line on
its stdin, as the supervisor writes it), and its node then configures on what the standby preloaded;
a standby told to stop (EOF) exits cleanly without ever joining. The three standbys preload at once."""

from __future__ import annotations

import threading
import time

import pytest

from tests.ros.helpers import Probe, start_node, stop_process

pytestmark = pytest.mark.slow

CASES = {  # executable: (its first node, parameters, what its log says once configured on the preload)
    "planner": ("planner", {"population": 16, "time_budget": 0.1}, "preloaded by the standby"),
    "decision_stack": ("decision_inference", {"k": 0, "memory_bank": "none"},
                       "configured on the model the standby preloaded"),
}


def _lines(proc) -> list[str]:
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def _wait(predicate, timeout: float, what: str, probe: Probe | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        if probe is not None:
            probe.spin_for(0.1)
        else:
            time.sleep(0.05)


def test_a_standby_joins_the_graph_only_when_promoted_and_configures_on_its_preload(tmp_path, ros_context):
    standbys = {}
    for exe, (node, params, _) in CASES.items():
        (tmp_path / exe).mkdir()
        standbys[exe] = start_node(exe, node, params, tmp_path / exe, standby=True)
    (tmp_path / "stopped").mkdir()
    stopped = start_node("planner", "planner", CASES["planner"][1], tmp_path / "stopped", standby=True)
    lines = {exe: _lines(proc) for exe, proc in standbys.items()}
    stopped_lines = _lines(stopped)
    probe = Probe(ros_context)
    try:
        for exe, out in [*lines.items(), ("the standby to stop", stopped_lines)]:
            _wait(lambda: any("standby: ready" in line for line in out), 180.0, f"{exe}'s standby to preload")
        probe.spin_for(1.0)
        waiting = set(probe.node.get_node_names()) & {node for node, _, _ in CASES.values()}
        assert not waiting, f"standbys joined the ROS graph before their promotion: {waiting}"
        stopped.stdin.close()  # the supervisor gone: EOF
        for proc in standbys.values():
            proc.stdin.write("take over\n")
            proc.stdin.flush()
        for exe, (node, _, configured) in CASES.items():
            _wait(lambda: node in probe.node.get_node_names(), 60.0, f"{node} on the graph", probe)
            _wait(lambda: any(configured in line for line in lines[exe]), 60.0, f"'{configured}' in {exe}'s log")
        assert stopped.wait(timeout=30) == 0, "".join(stopped_lines)
        assert not any("promoted" in line for line in stopped_lines)
    finally:
        probe.close()
        outputs = {exe: stop_process(proc) for exe, proc in standbys.items()}
        if stopped.poll() is None:
            stopped.kill()
    for exe, proc in standbys.items():
        assert proc.returncode == 0, outputs[exe] + "".join(lines[exe])
