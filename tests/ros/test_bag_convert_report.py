"""Scenario -> bag conversion, the replay report, and ``luna replay`` through real stack nodes."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_typestore

import luna_msgs.msg as lm
from luna_bridge.scenario import AgentTrack, Scenario, TrafficLightTimeline
from luna_bags import topics as TOP
from luna_bags.convert import DEFAULT_START_TIME, scenario_to_bag
from luna_bags.reader import BagReader
from luna_bags.report import write_report
from luna_bags.writer import BagWriter
from luna_core import types as T
from luna_msgs_py import convert as C
from nav_msgs.msg import Odometry
from rosgraph_msgs.msg import Clock
from tests import samples
from tests.ros.helpers import ros_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def toy_scenario() -> Scenario:
    """Ego accelerating along lane l1 (y = 0) behind a car that appears after 1 s; a light turns red."""
    t = np.round(np.arange(-1.0, 4.001, 0.1), 10)
    v = 8.0 + 0.5 * np.clip(t, 0.0, None)  # accelerates at 0.5 m/s^2 from t = 0
    x = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * 0.1)])
    zeros = np.zeros_like(t)
    expert = AgentTrack("ego", T.ObjectClass.VEHICLE, 5.2, 2.3, t, x, zeros, zeros, v, zeros)
    lead_x = np.where(t >= 1.0, 40.0 + 6.0 * t, np.nan)
    lead = AgentTrack("lead", T.ObjectClass.VEHICLE, 4.8, 1.9, t, lead_x, np.where(t >= 1.0, 0.0, np.nan),
                      zeros, np.full_like(t, 6.0), zeros)
    light = TrafficLightTimeline("j0", [0.0, 2.0], [T.TrafficLightPhase.GREEN, T.TrafficLightPhase.RED])
    return Scenario("toy", "following_lane_with_lead", samples.lane_graph(), samples.route(),
                    T.EgoState(0.0, 0.0, 0.0, 0.0, 8.0), expert, [lead], [light], duration=4.0)


def _decoded(path: Path, topic: str, cls) -> list[tuple[int, object]]:
    with BagReader(path) as reader:
        return [(m.timestamp, deserialize_message(m.data, cls)) for m in reader.messages([topic])]


def test_scenario_becomes_a_bag_of_the_stack_inputs_at_10_hz(tmp_path: Path):
    scenario = toy_scenario()
    summary = scenario_to_bag(scenario, tmp_path / "toy", progress=False)
    steps = len(scenario.expert.t)
    assert summary.steps == steps and math.isclose(summary.duration, 5.0)
    assert summary.counts == {TOP.CLOCK: steps, TOP.ODOMETRY: steps, TOP.OBJECTS: steps,
                              TOP.TRAFFIC_LIGHTS: steps, TOP.ROUTE: 1, TOP.LANE_GRAPH: 1}

    odometry = _decoded(tmp_path / "toy", TOP.ODOMETRY, Odometry)
    for (stamp_ns, msg), t, x, v in zip(odometry, scenario.expert.t, scenario.expert.x, scenario.expert.vx):
        ego = C.odometry_to_ego(msg)
        assert stamp_ns == round((DEFAULT_START_TIME + t) * 1e9)  # receive time = header stamp
        assert math.isclose(ego.stamp, DEFAULT_START_TIME + t, abs_tol=1e-6)
        assert math.isclose(ego.x, x, abs_tol=1e-9) and math.isclose(ego.velocity, v, abs_tol=1e-9)
        assert msg.header.frame_id == "map" and msg.child_frame_id == "base_link"

    objects = _decoded(tmp_path / "toy", TOP.OBJECTS, lm.TrackedObjects)
    for (_, msg), t in zip(objects, scenario.expert.t):
        expected = scenario.objects_at(float(t)).objects
        got = C.msg_to_objects(msg).objects
        assert [(o.id, o.x) for o in got] == [(o.id, o.x) for o in expected]
    assert [len(m.objects) for _, m in objects].count(0) == 20  # the lead appears at t = 1 s

    lights = _decoded(tmp_path / "toy", TOP.TRAFFIC_LIGHTS, lm.TrafficLightStateArray)
    phases = [C.msg_to_lights(m).lights[0].phase for _, m in lights]
    assert phases[10] is T.TrafficLightPhase.GREEN and phases[-1] is T.TrafficLightPhase.RED

    (_, graph_msg), = _decoded(tmp_path / "toy", TOP.LANE_GRAPH, lm.LaneGraph)
    graph = C.msg_to_lane_graph(graph_msg)
    assert set(graph.lanes) == set(scenario.lane_graph.lanes)
    np.testing.assert_allclose(graph.lanes["l0"].centerline, scenario.lane_graph.lanes["l0"].centerline)
    (_, route_msg), = _decoded(tmp_path / "toy", TOP.ROUTE, lm.Route)
    assert C.msg_to_route(route_msg).road_ids == scenario.route.road_ids

    clocks = [C.from_time(m.clock) for _, m in _decoded(tmp_path / "toy", TOP.CLOCK, Clock)]
    assert clocks == sorted(clocks) and math.isclose(clocks[0], DEFAULT_START_TIME - 1.0)
    with BagReader(tmp_path / "toy") as reader:
        assert reader.topics[TOP.LANE_GRAPH].offered_qos[0].durability.name == "TRANSIENT_LOCAL"


def test_converted_bag_is_self_describing_for_other_tools(tmp_path: Path):
    """rosbags' own reader, starting from an EMPTY typestore, decodes every topic from the embedded
    definitions alone: what Foxglove and ``ros2 bag`` need."""
    scenario_to_bag(toy_scenario(), tmp_path / "toy", progress=False)
    with AnyReader([tmp_path / "toy"], default_typestore=get_typestore(Stores.EMPTY)) as reader:
        decoded = {}
        for connection, _, raw in reader.messages():
            decoded.setdefault(connection.topic, reader.deserialize(raw, connection.msgtype))
    assert decoded[TOP.LANE_GRAPH].lanes[0].id == "l0"
    assert decoded[TOP.OBJECTS].header.frame_id == "map"
    assert math.isclose(decoded[TOP.ODOMETRY].twist.twist.linear.x, 8.0)
    assert set(decoded) == set(TOP.INPUT_TOPICS)


def _output_bag(path: Path) -> list[T.DecisionDistribution]:
    """A bag with inputs and the outputs a running stack publishes (values built from luna_core types)."""
    decisions = []
    rng = np.random.default_rng(3)
    with BagWriter(path) as bag:
        for topic, msgtype in ((TOP.ODOMETRY, "nav_msgs/msg/Odometry"), (TOP.LANE_GRAPH, "luna_msgs/msg/LaneGraph"),
                               (TOP.DECISION, "luna_msgs/msg/DecisionDistribution"),
                               (TOP.TRAJECTORY, "luna_msgs/msg/Trajectory"), (TOP.FAILURE, "luna_msgs/msg/FailureEvent"),
                               (TOP.EXPLANATION, "luna_msgs/msg/DecisionExplanation")):
            bag.add_topic(topic, msgtype)
        base = 500.0
        bag.write(TOP.LANE_GRAPH, int(base * 1e9), serialize_message(C.lane_graph_to_msg(samples.lane_graph())))
        for k in range(40):
            t = base + 0.1 * k
            bag.write(TOP.ODOMETRY, int(t * 1e9), serialize_message(C.ego_to_odometry(T.EgoState(t, 0.8 * k, 0, 0, 8.0))))
            if k % 5 == 0:
                p = rng.dirichlet(np.ones(10))
                d = T.DecisionDistribution(t, p, T.candidate_set(p), "q", [], 0.02, t - 0.05)
                decisions.append(d)
                bag.write(TOP.DECISION, int(t * 1e9), serialize_message(C.decision_to_msg(d)))
                traj = samples.trajectory()
                traj.stamp = t
                bag.write(TOP.TRAJECTORY, int(t * 1e9), serialize_message(C.trajectory_to_msg(traj)))
        failure = samples.failure()
        failure.stamp = base + 3.0
        bag.write(TOP.FAILURE, int((base + 3.0) * 1e9), serialize_message(C.failure_to_msg(failure)))
        explanation = samples.explanation()
        explanation.stamp = base + 3.5
        bag.write(TOP.EXPLANATION, int((base + 3.5) * 1e9), serialize_message(C.explanation_to_msg(explanation)))
    return decisions


def test_report_shows_decisions_failures_explanations_and_says_what_is_absent(tmp_path: Path):
    decisions = _output_bag(tmp_path / "run")
    html = write_report(tmp_path / "run", tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    for png in ("decisions.png", "candidate_sets.png", "trajectories.png", "latencies.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == PNG_MAGIC
        assert png in html.read_text()
    assert f"{len(decisions)} decisions stamped from 0.0 s to 3.5 s" in md
    most_common_top = max(set(d.top_action for d in decisions), key=[d.top_action for d in decisions].count)
    share = sum(d.top_action == most_common_top for d in decisions) / len(decisions)
    assert f"| {most_common_top} | {share:.0%} |" in md
    assert "| 3.00 | AK | veh-1 (ACTIVE_FRONT) cone | cut-in (0.4 s) ped-2 (0.8 s) | yes | parked-3 |" in md  # the failure row
    assert "Recommended decisions: CK,DK" in md  # the explanation text
    assert "No messages on `/luna/reflection`" in md
    assert "No messages on `/diagnostics`" in md
    assert "| decision (retrieval + forward pass) | 8 | 20.0 | 20.0 | 20.0 |" in md


@pytest.mark.slow
def test_luna_replay_plays_a_bag_through_real_stack_nodes_and_records_their_outputs(tmp_path: Path):
    """``luna replay`` with the stack's scene_descriptor and progress_monitor (real nodes, real DDS)."""
    import subprocess
    import sys

    if shutil.which("scene_descriptor", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the stack's executables are not installed (run scripts/bootstrap.sh)")
    scenario_to_bag(toy_scenario(), tmp_path / "in", progress=False)
    out = subprocess.run([sys.executable, "-m", "luna_bringup.cli", "replay", str(tmp_path / "in"), "-o",
                          str(tmp_path / "out"), "-q", "--only", "scene_descriptor,progress_monitor",
                          "--settle", "1", "--rate", "0.5"],  # half speed: slack for a loaded 2-core machine
                         env=ros_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with BagReader(tmp_path / "out") as reader:
        counts = {t: i.count for t, i in reader.topics.items()}
    steps = len(toy_scenario().expert.t)
    # The inputs came back through DDS complete, next to the stack's outputs.
    assert counts[TOP.ODOMETRY] == steps and counts[TOP.LANE_GRAPH] == 1 and counts[TOP.ROUTE] == 1
    assert counts.get(TOP.SCENE, 0) >= steps // 2  # 10 Hz scene descriptors on bag time
    assert counts.get(TOP.DIAGNOSTICS, 0) > 0
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    assert "| /luna/scene | luna_msgs/msg/SceneDescriptor |" in md
    assert "The progress monitor ran and reported no failure." in md or "| time (s) | issued decision" in md
    assert (tmp_path / "out" / "report" / "stack.log").read_text().count("started ") == 2


def test_shipped_sample_bag_is_intact_and_self_describing():
    sample = Path(__file__).resolve().parents[2] / "models" / "sample_bags" / "USA_US101-4_1_T-1"
    with BagReader(sample) as reader:
        assert reader.issues == []
        counts = {t: i.count for t, i in reader.topics.items()}
        first, last = reader.time_range()
        graph = next(reader.messages([TOP.LANE_GRAPH]))
    assert counts == {TOP.CLOCK: 121, TOP.ODOMETRY: 121, TOP.OBJECTS: 121, TOP.TRAFFIC_LIGHTS: 121,
                      TOP.ROUTE: 1, TOP.LANE_GRAPH: 1}
    assert math.isclose((last - first) / 1e9, 12.0)
    assert len(C.msg_to_lane_graph(deserialize_message(graph.data, lm.LaneGraph)).lanes) == 12
    assert sum(p.stat().st_size for p in sample.iterdir()) < 5 * 2**20


@pytest.mark.slow  # imports every node module (planner and decision stack bring torch): ~30 s under load
def test_replay_leaves_out_the_processes_whose_outputs_the_bag_provides():
    import sys

    from luna_bringup.replay import node_outputs, topology_stack
    from luna_bringup.topology import load_topology

    if shutil.which("scene_descriptor", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the stack's executables are not installed (run scripts/bootstrap.sh)")
    assert node_outputs("map_server") == {TOP.LANE_GRAPH}
    every = [p.name for p in load_topology().processes]
    stack = topology_stack(provided=set(TOP.INPUT_TOPICS))
    assert stack.left_out == {"map_server": [TOP.LANE_GRAPH]}
    assert [p.name for p in stack.topology.processes] == [p for p in every if p != "map_server"]
    assert "map_server" not in stack.nodes and "scene_descriptor" in stack.nodes
    # Naming processes explicitly overrides the choice.
    assert topology_stack(only="map_server").left_out == {}
