"""Issue 6 end to end over DDS: a scripted collision -> failure event -> explanation -> reflection
(served by the in-process SmolLM2) -> a new memory item that a later retrieval returns.

Real nodes (progress_monitor, decision_stack, reflection_client), real models, a real memory bank.
The reflection endpoint down and back, and a restart with requests in the outbox, are in
tests/ros/test_reflection_endpoint.py.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nav_msgs.msg import Odometry

import luna_msgs.msg as lm
from luna_core import types as T
from luna_core.memory.bank import MemoryBank
from luna_nodes import convert as C
from luna_nodes import qos
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.ros.helpers import Probe, ros_env, stop_process, wait_for_subscribers


def _start(exe: str, params: dict, tmp_path: Path, env: dict) -> subprocess.Popen:
    path = tmp_path / f"{exe}.yaml"
    path.write_text(yaml.safe_dump(params))
    return subprocess.Popen([str(Path(sys.executable).parent / exe), "--ros-args", "--params-file", str(path)],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.slow
def test_collision_reflection_adds_a_retrievable_memory_item(tmp_path, ros_context):
    bank_path, seed_ids = make_bank(tmp_path)
    student = make_student_dir(tmp_path)
    env = ros_env({"LUNA_DATA": str(tmp_path / "data")})
    model = {"student_model": str(student), "memory_bank": str(bank_path), "device": "cpu"}
    procs = [
        _start("progress_monitor", {"progress_monitor": {"ros__parameters": {"decision_period": 0.2,
                                                                             "failure_cooldown": 1000.0}}},
               tmp_path, env),
        # T_d of 2 s: on a 2-core CPU a forward pass with K = 3 examples takes seconds, and the explainer
        # (which yields to pending decisions) needs gaps between them to generate its tokens.
        _start("decision_stack", {"decision_inference": {"ros__parameters": {**model, "memory_poll_period": 0.5,
                                                                            "decision_period": 2.0}},
                                  "explainer": {"ros__parameters": {**model, "max_tokens": 12}}}, tmp_path, env),
        _start("reflection_client", {"reflection_client": {"ros__parameters": {
            "memory_bank": str(bank_path), "max_tokens": 48, "backoff_base": 0.5}}}, tmp_path, env),
    ]
    probe = Probe(ros_context)
    outputs = []
    try:
        reflections = probe.collect(lm.ReflectionResult, "luna/reflection", qos.RELIABLE)
        versions = probe.collect(__import__("std_msgs.msg", fromlist=["UInt64"]).UInt64, "luna/memory/version",
                                 qos.LATCHED)
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        odom = probe.publisher(Odometry, "localization/kinematic_state", qos.SENSOR)
        objects = probe.publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
        for p in (scenes, odom, objects):
            wait_for_subscribers(p, timeout=120.0)
        car = T.TrackedObject("car-9", T.ObjectClass.VEHICLE, 4.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
        far = T.TrackedObject("car-9", T.ObjectClass.VEHICLE, 60.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
        crash = {"now": False}  # the collision starts once a decision exists (it is what gets explained)

        def drive():  # the ego rear axle at the origin, its box overlapping car-9 ahead once crashing
            now = probe.node.get_clock().now().nanoseconds * 1e-9
            scene = samples.scene()
            scene.stamp = now
            scenes.publish(C.scene_to_msg(scene))
            odom.publish(C.ego_to_odometry(T.EgoState(now, 0.0, 0.0, 0.0, 2.0)))
            objects.publish(C.objects_to_msg(T.TrackedObjects(now, [car if crash["now"] else far])))
            probe.spin_for(0.1)

        probe.wait(lambda: drive() or decisions, 240.0, "a decision")
        crash["now"] = True
        probe.wait(lambda: drive() or reflections, 600.0, "a reflection result")
        result = C.msg_to_reflection(reflections[0])
        assert not result.error, result.error
        assert not result.normal, "'normal' is not allowed after a collision"
        assert result.memory_item_id and result.memory_version > len(seed_ids)
        probe.wait(lambda: any(v.data == result.memory_version for v in versions), 30.0, "the new memory version")
    finally:
        probe.close()
        outputs = [stop_process(p, timeout=120) for p in procs]
    with MemoryBank.open(bank_path) as bank:
        item = bank.get(result.memory_item_id)
        assert item.source == "reflection" and item.distribution is None
        assert item.answer.startswith("Recommended decisions:")
        hits = [i.id for i, _ in bank.retrieve(item.query, k=len(bank))]
        assert item.id in hits, "the reflection item must be retrievable"
    assert all(p.returncode == 0 for p in procs), outputs
