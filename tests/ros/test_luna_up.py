"""`luna up` starts the topology's processes, they publish, and SIGINT stops every one of them."""

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

import luna_msgs.msg as lm
from luna_core.lane_graph_io import save_lane_graph
from luna_msgs_py import qos
from tests import samples
from tests.ros.helpers import ros_env, wait_for

LUNA = str(Path(sys.executable).parent / "luna")


def _stack_files(tmp_path: Path, map_file) -> tuple[Path, Path]:
    params = tmp_path / "params"
    params.mkdir()
    (params / "map_server.yaml").write_text(yaml.safe_dump(
        {"map_server": {"ros__parameters": {"map_file": map_file, "frame_id": "map"}}}))
    topology = tmp_path / "topology.yaml"
    topology.write_text(yaml.safe_dump({"version": 1, "processes": [
        {"name": "map_server", "executable": "map_server", "nodes": ["map_server"]}]}))
    return topology, params


def test_luna_up_runs_publishing_nodes_and_sigint_leaves_no_orphans(tmp_path, ros_context):
    map_file = tmp_path / "map.json"
    save_lane_graph(samples.lane_graph(), map_file)
    topology, params = _stack_files(tmp_path, str(map_file))
    up = subprocess.Popen([LUNA, "up", "--topology", str(topology), "--params-dir", str(params)], env=ros_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    node = Node("luna_up_probe", context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    graphs, diagnostics = [], []
    node.create_subscription(lm.LaneGraph, "map/lane_graph", graphs.append, qos.LATCHED)
    node.create_subscription(DiagnosticArray, "/diagnostics", diagnostics.append, qos.DIAGNOSTICS)
    try:
        wait_for(lambda: graphs and diagnostics, 30.0, "the lane graph and diagnostics from map_server",
                 spin=lambda: executor.spin_once(timeout_sec=0.05))
        assert len(graphs[0].lanes) == len(samples.lane_graph().lanes)
        assert diagnostics[0].status[0].name == "luna: map_server"
        children = psutil.Process(up.pid).children(recursive=True)
        assert children, "luna up started no processes"
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
        executor.shutdown()
        node.destroy_node()
    assert up.returncode == 0, out
    assert "[map_server]" in out, "node logs are not streamed with the node's name"
    survivors = [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, f"orphan processes after SIGINT: {survivors}"


def test_wrong_parameter_type_stops_node_naming_parameter_and_file(tmp_path):
    topology, params = _stack_files(tmp_path, 42)  # map_file must be a string
    result = subprocess.run([LUNA, "up", "--topology", str(topology), "--params-dir", str(params)],
                            env=ros_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "map_file" in result.stdout and "expected string, got int" in result.stdout, result.stdout
    assert str(params / "map_server.yaml") in result.stdout


def test_node_exits_with_code_2_on_out_of_range_choice(tmp_path):
    _, params = _stack_files(tmp_path, "x.json")
    data = yaml.safe_load((params / "map_server.yaml").read_text())
    data["map_server"]["ros__parameters"]["map_format"] = "shapefile"
    (params / "map_server.yaml").write_text(yaml.safe_dump(data))
    exe = str(Path(sys.executable).parent / "map_server")
    result = subprocess.run([exe, "--ros-args", "--params-file", str(params / "map_server.yaml")],
                            env=ros_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "map_format" in result.stderr and "shapefile" in result.stderr, result.stderr
