"""Issues 6 and 16 end to end over DDS: a scripted collision -> failure event -> explanation -> the
reflection client's hindsight check on what it perceived after the failed decision -> a grounded
revision in the bank (retrievable), or none when the executed decision was as good as any; never
anything unsafe in hindsight (the audit).

Real nodes (progress_monitor, decision_stack, reflection_client), real models (an untrained student:
its decision is arbitrary, so both verdicts are possible), a real memory bank. The reflection endpoint
down and back, and a restart with requests in the outbox, are in tests/ros/test_reflection_endpoint.py.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import luna_msgs.msg as lm
from luna_core.memory.bank import MemoryBank
from luna_core.reflection import audit_reflections
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.ros.helpers import Probe, StalledCarTraffic, ros_env, stop_process, wait_for_subscribers


def _start(exe: str, params: dict, tmp_path: Path, env: dict) -> subprocess.Popen:
    path = tmp_path / f"{exe}.yaml"
    path.write_text(yaml.safe_dump(params))
    return subprocess.Popen([str(Path(sys.executable).parent / exe), "--ros-args", "--params-file", str(path)],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


@pytest.mark.slow
def test_collision_reflection_is_grounded_in_hindsight_and_leaves_nothing_unsafe_in_the_bank(tmp_path, ros_context):
    bank_path, seed_ids = make_bank(tmp_path)
    student = make_student_dir(tmp_path)
    env = ros_env({"LUNA_DATA": str(tmp_path / "data")})
    model = {"student_model": str(student), "memory_bank": str(bank_path), "device": "cpu"}
    procs = [
        # The near miss before the collision would be a failure of its own (a second reflection); this
        # test follows the collision's, so the near-miss check is off (tests/ros/test_progress_monitor_node.py).
        _start("progress_monitor", {"progress_monitor": {"ros__parameters": {"decision_period": 0.2,
                                                                             "failure_cooldown": 1000.0,
                                                                             "near_miss_ttc": 0.0}}},
               tmp_path, env),
        # T_d of 2 s: on a 2-core CPU a forward pass with K = 3 examples takes seconds, and the explainer
        # (which yields to pending decisions) needs gaps between them to generate its tokens.
        _start("decision_stack", {"decision_inference": {"ros__parameters": {**model, "memory_poll_period": 0.5,
                                                                            "decision_period": 2.0}},
                                  "explainer": {"ros__parameters": {**model, "cpu_max_tokens": 12}}}, tmp_path, env),
        _start("reflection_client", {"reflection_client": {"ros__parameters": {
            "memory_bank": str(bank_path), "outbox": str(tmp_path / "outbox"), "backoff_base": 0.5}}},
               tmp_path, env),
    ]
    probe = Probe(ros_context)
    outputs = []
    try:
        reflections = probe.collect(lm.ReflectionResult, "luna/reflection", qos.RELIABLE)
        versions = probe.collect(__import__("std_msgs.msg", fromlist=["UInt64"]).UInt64, "luna/memory/version",
                                 qos.LATCHED)
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        wait_for_subscribers(scenes, timeout=120.0)
        # The ego stands 8.7 m behind the stalled car until a decision exists, then drives into it at 8 m/s.
        go = {"at": None}
        traffic = StalledCarTraffic(probe, ego_x=lambda t: 25.0 + 8.0 * max(0.0, t - (go["at"] or t)),
                                    ego_v=lambda t: 8.0 if go["at"] is not None else 0.0)

        def drive():
            scene = samples.scene()  # what the student decides on (the scene descriptor is not under test)
            scene.stamp = traffic.now()
            scenes.publish(C.scene_to_msg(scene))
            traffic.drive(0.1)

        probe.wait(lambda: drive() or decisions, 240.0, "a decision")
        go["at"] = traffic.now() - traffic.t0
        probe.wait(lambda: drive() or reflections, 600.0, "a reflection result")  # 6 s of hindsight first
        result = C.msg_to_reflection(reflections[0])
        # The hindsight check ran (an error would say why not) and never says 'normal' after a collision.
        assert not result.error, result.error
        assert not result.normal, "'normal' is not allowed after a collision"
        if result.memory_item_id:  # the executed decision was unsafe in hindsight: a grounded revision
            assert result.memory_version > len(seed_ids)
            probe.wait(lambda: any(v.data == result.memory_version for v in versions), 30.0,
                       "the new memory version")
    finally:
        probe.close()
        outputs = [stop_process(p, timeout=120) for p in procs]
    with MemoryBank.open(bank_path) as bank:
        checked, findings = audit_reflections(bank, tmp_path / "outbox")
        assert findings == [] and checked == (1 if result.memory_item_id else 0)
        if result.memory_item_id:
            item = bank.get(result.memory_item_id)
            assert item.source == "reflection" and item.distribution is None
            assert not item.answer.startswith("Recommended decisions: AK")  # never "accelerate into it"
            hits = [i.id for i, _ in bank.retrieve(item.query, k=len(bank))]
            assert item.id in hits, "the reflection item must be retrievable"
    assert all(p.returncode == 0 for p in procs), outputs
