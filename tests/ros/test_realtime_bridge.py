"""The real-time bridge (``luna-bridge ros --realtime``) drives a planner node on system time at
wall-clock speed over real DDS: it paces the simulation, never waits for a trajectory after the first,
and reports every trajectory's delay, the node's /diagnostics counters and its process's CPU."""

import dataclasses
import time
from pathlib import Path

import pytest

import luna_bridge

from luna_bridge.ros_bridge import lockstep_simulation_config
from luna_bridge.ros_command import load_any_scenario
from luna_bridge.ros_realtime import (BINS, RealtimeConfig, RealtimeStackPlanner, cpu_use, histogram, markdown,
                                     report)
from luna_bridge.sim.simulator import simulate
from tests.ros.helpers import start_node, stop_process
from tests.scenario_samples import lead_vehicle_scenario

HARD = Path(luna_bridge.__file__).parent / "scenarios" / "data" / "hard"


def test_histogram_bins_are_upper_edges_with_an_overflow_bin() -> None:
    assert histogram([0.0, 0.1, 0.10001, 0.5, 3.0, 7.0]) == [2, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1]
    assert len(histogram([])) == len(BINS) + 1


def test_cpu_use_spans_each_process_and_a_restart_starts_a_new_span() -> None:
    # (wall s, pid, process CPU s): 0.5 core for 2 s, then a restart (new pid, its CPU from 0) at 0.25 core
    samples = [(10.0, 7, 3.0), (11.0, 7, 3.5), (12.0, 7, 4.0), (12.5, 9, 0.2), (14.5, 9, 0.7)]
    use = cpu_use(samples)
    assert use["pid"] == 9
    assert use["cpu_s"] == 1.5 and use["wall_s"] == 4.0 and use["cores"] == 0.375
    assert cpu_use([(1.0, 3, 2.0)]) == {"pid": 3, "cpu_s": 0.0, "wall_s": 0.0, "cores": 0.0}


@pytest.mark.realtime  # wall-clock delays: run alone, after the parallel phase of `make test`
def test_realtime_bridge_drives_a_planner_node_at_wall_clock_speed(tmp_path, ros_context) -> None:
    scenario = lead_vehicle_scenario(duration=4.0)
    # PDM-style planner: a cycle of a few tens of ms, so its deadlines hold even on a loaded machine.
    node = start_node("planner", "planner", {"planner": "pdm", "replan_period": 0.5}, tmp_path)
    config = RealtimeConfig(replan_period=0.5, start_timeout=60.0)
    bridge = RealtimeStackPlanner(scenario, config, context=ros_context)
    try:
        log = simulate(scenario, bridge, reactive=False, config=lockstep_simulation_config(0.5))
        paced = time.monotonic() - bridge.wall_zero  # wall seconds since simulation time 0
        deadline = time.monotonic() + 3.0  # the node's diagnostics come at 1 Hz
        while "planner" not in bridge.record.diagnostics and time.monotonic() < deadline:
            bridge.executor.spin_once(timeout_sec=0.05)
        r = report(scenario.name, bridge.record, config, 1.0)
        # A second scenario right after, on the same node, with 2 s of logged history before its start: that
        # history goes out stamped up to 2 s before now, and all of it must be newer than what the node heard
        # last (it refuses odometry that runs backwards).
        second = dataclasses.replace(load_any_scenario(str(HARD / "hard_following_lane_with_lead_00.json.gz")),
                                     duration=2.0)
        bridge.drive_next(second)
        log2 = simulate(second, bridge, reactive=False, config=lockstep_simulation_config(0.5))
        settle = time.monotonic() + 1.5  # a rejection shows in the node's next 1 Hz diagnostics
        while time.monotonic() < settle:
            bridge.executor.spin_once(timeout_sec=0.05)
        r2 = report(second.name, bridge.record, config, 1.0)
    finally:
        bridge.close()
        out = stop_process(node)
    assert node.returncode == 0, out
    assert log.planner_failures == 0, log.failure_messages
    assert paced >= 0.95 * scenario.duration  # wall-clock speed: the 4 s scenario took at least ~4 s
    assert r["steps"] == round(scenario.duration / 0.1)
    # a trajectory every 0.5 s, each a short while after the instant it was planned for
    assert r["trajectory_delay_s"]["count"] >= scenario.duration / 0.5 - 2, (r["trajectory_delay_s"], r["nodes"])
    assert 0.0 <= r["trajectory_delay_s"]["p50"] < 2.0
    assert 0.0 <= r["trajectory_age_s"]["max"] < 2.0  # the tracked trajectory was never far behind
    assert "missed_deadlines" in r["nodes"]["planner"] and r["nodes"]["planner"]["cycle_time_s"]["count"] >= 1
    assert r["decision_delay_s"] == {"count": 0}  # no decision node in this test
    ego = log.ego_array()
    assert ego[-1, 0] - ego[0, 0] > 10.0  # the ego drove on along the road
    # where the time goes: the planner's process (this node, by its pid) and the bridge's own CPU
    process = r["nodes"]["planner"]["process"]
    assert process["pid"] == node.pid
    assert process["wall_s"] >= 1.0 and 0.0 < process["cpu_s"] <= process["wall_s"] * r["machine_cores"]
    assert r["bridge_process"]["wall_s"] >= 0.9 * scenario.duration and r["bridge_process"]["cpu_s"] > 0.0
    # the whole machine over the same span did at least what this process did, with at most all its cores
    machine = r["machine"]
    assert machine["wall_s"] == r["bridge_process"]["wall_s"]
    assert machine["cpu_s"] >= 0.9 * r["bridge_process"]["cpu_s"]
    assert machine["cores"] <= r["machine_cores"] * 1.05
    text = markdown([r])
    assert "| lead_vehicle |" in text and "trajectory (planner)" in text
    assert f"| lead_vehicle | planner | {process['cores']:.2f} |" in text and "the bridge (simulator" in text
    assert f"| lead_vehicle | **the whole machine** | **{machine['cores']:.2f}** |" in text
    # the second scenario: driven from its own start, and no input of either scenario refused by the node
    assert log2.planner_failures == 0 and r2["steps"] == round(second.duration / 0.1)
    assert "cycle_time_s" in r2["nodes"]["planner"]  # its diagnostics were heard
    assert r2["nodes"]["planner"].get("rejected_inputs", 0) == 0, r2["nodes"]["planner"]
