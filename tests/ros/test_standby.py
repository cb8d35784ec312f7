"""A warm standby (``luna up``; luna_nodes.base.await_promotion) of the real planner and decision
executables: it loads its models while off the ROS graph, joins the graph only once promoted (a line on
its stdin, as the supervisor writes it), and its node then configures on what the standby preloaded;
a standby told to stop (EOF) exits cleanly without ever joining."""

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


@pytest.mark.parametrize("executable", list(CASES))
def test_a_standby_joins_the_graph_only_when_promoted_and_configures_on_its_preload(executable, tmp_path,
                                                                                   ros_context):
    node, params, configured = CASES[executable]
    proc = start_node(executable, node, params, tmp_path, standby=True)
    lines = _lines(proc)
    probe = Probe(ros_context)
    try:
        _wait(lambda: any("standby: ready" in line for line in lines), 180.0, f"{executable}'s standby to preload")
        probe.spin_for(1.0)
        assert node not in probe.node.get_node_names(), "a standby joined the ROS graph before its promotion"
        proc.stdin.write("take over\n")
        proc.stdin.flush()
        _wait(lambda: node in probe.node.get_node_names(), 60.0, f"{node} on the graph", probe)
        _wait(lambda: any(configured in line for line in lines), 60.0, f"'{configured}' in the log")
    finally:
        probe.close()
        out = stop_process(proc)
    assert proc.returncode == 0, out + "".join(lines)


def test_a_standby_told_to_stop_exits_cleanly_without_joining(tmp_path):
    proc = start_node("planner", "planner", CASES["planner"][1], tmp_path, standby=True)
    lines = _lines(proc)
    _wait(lambda: any("standby: ready" in line for line in lines), 180.0, "the standby to preload")
    proc.stdin.close()  # the supervisor gone: EOF
    assert proc.wait(timeout=30) == 0, "".join(lines)
    assert not any("promoted" in line for line in lines)
