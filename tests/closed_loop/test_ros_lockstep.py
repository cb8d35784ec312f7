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
