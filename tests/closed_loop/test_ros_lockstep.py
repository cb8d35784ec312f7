"""One scenario in process and over ROS (planner node, lock step with /clock) gives the same metrics."""

import numpy as np
import pytest

from luna_bridge.metrics import score_log
from luna_bridge.ros_bridge import LockstepConfig, RosStackPlanner, in_process_config, lockstep_simulation_config
from luna_bridge.sim.simulator import simulate
from luna_core.planning.factory import make_planner
from tests.ros.helpers import start_node, stop_process
from tests.scenario_samples import lead_vehicle_scenario


@pytest.mark.parametrize("planner", ["pdm"])
def test_lockstep_over_ros_matches_in_process(planner, tmp_path, ros_context):
    scenario = lead_vehicle_scenario()
    in_process = simulate(scenario, make_planner(planner), reactive=False, config=in_process_config(0.5))

    node = start_node("planner", "planner", {"planner": planner, "replan_period": 0.5, "input_sync_timeout": 2.0},
                      tmp_path, extra_args=["-p", "use_sim_time:=true"])
    bridge = RosStackPlanner(lead_vehicle_scenario(), LockstepConfig(replan_period=0.5, timeout=20.0),
                             context=ros_context)
    try:
        over_ros = simulate(bridge.scenario, bridge, reactive=False, config=lockstep_simulation_config(0.5))
    finally:
        bridge.close()
        out = stop_process(node)
    assert node.returncode == 0, out
    assert over_ros.planner_failures == 0, over_ros.failure_messages
    a, b = in_process.ego_array(), over_ros.ego_array()
    assert a.shape == b.shape
    assert np.allclose(a, b, atol=1e-6), f"max deviation {np.abs(a - b).max()}"
    sa, sb = score_log(in_process), score_log(over_ros)
    assert sa.score == pytest.approx(sb.score, abs=1e-9)
    for name, metric in sa.metrics.items():
        assert metric.score == pytest.approx(sb.metrics[name].score, abs=1e-9), name
    assert a[-1, 0] - a[0, 0] > 10.0, "the ego should have driven along the road"


def _lockstep_run(planner_params: dict, tmp_path, ros_context):
    """One lock-step run of a freshly started planner node (its search seeds count its cycles)."""
    node = start_node("planner", "planner", planner_params, tmp_path, extra_args=["-p", "use_sim_time:=true"])
    bridge = RosStackPlanner(lead_vehicle_scenario(3.0), LockstepConfig(replan_period=0.5, timeout=120.0,
                                                                        connect_timeout=120.0),
                             context=ros_context)
    try:
        log = simulate(bridge.scenario, bridge, reactive=False, config=lockstep_simulation_config(0.5))
    finally:
        bridge.close()
        out = stop_process(node)
    assert node.returncode == 0, out
    assert "(deterministic search)" in out, out  # the default under use_sim_time
    assert log.planner_failures == 0, log.failure_messages
    return log


def test_lockstep_search_is_deterministic(tmp_path, ros_context):
    """The Diffusion-ES search of the planner node under sim time (``deterministic`` auto: no wall-clock
    budget) gives identical runs however loaded the machine, and the in-process deterministic result.
    A 0.01 s ``time_budget`` would cut every search short if it applied."""
    params = {"planner": "diffusion-es", "population": 8, "time_budget": 0.01, "replan_period": 0.5,
              "input_sync_timeout": 60.0}
    first = _lockstep_run(params, tmp_path, ros_context)
    second = _lockstep_run(params, tmp_path, ros_context)
    assert np.array_equal(first.ego_array(), second.ego_array())
    assert score_log(first).score == score_log(second).score
    in_process = simulate(lead_vehicle_scenario(3.0), make_planner("diffusion-es", {"population": 8,
                                                                                    "deterministic": True}),
                          reactive=False, config=in_process_config(0.5))
    assert np.allclose(first.ego_array(), in_process.ego_array(), atol=1e-6)
