"""decision_inference + explainer in one process over DDS, with a real student and memory bank."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import luna_msgs.msg as lm

from luna_core import types as T
from luna_nodes import convert as C
from luna_nodes import qos
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.ros.helpers import Probe, ros_env, stop_process, wait_for_subscribers


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("heuristic")
    bank, ids = make_bank(root)
    return make_student_dir(root), bank, ids


def _start(tmp_path: Path, student: Path, bank: Path, **overrides) -> subprocess.Popen:
    model = {"student_model": str(student), "memory_bank": str(bank), "device": "cpu"}
    params = {"decision_inference": {"ros__parameters": {**model, "decision_period": 0.5, **overrides}},
              "explainer": {"ros__parameters": {**model, "max_tokens": 8}}}
    path = tmp_path / "decision.yaml"
    path.write_text(yaml.safe_dump(params))
    exe = str(Path(sys.executable).parent / "decision_stack")
    return subprocess.Popen([exe, "--ros-args", "--params-file", str(path)], env=ros_env(),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_decisions_from_scenes_and_explanation_on_failure(artifacts, tmp_path, ros_context):
    student, bank, ids = artifacts
    proc = _start(tmp_path, student, bank)
    probe = Probe(ros_context)
    try:
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        explanations = probe.collect(lm.DecisionExplanation, "luna/explanation", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        failures = probe.publisher(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        wait_for_subscribers(scenes, timeout=60.0)
        wait_for_subscribers(failures, timeout=60.0)

        def publish_scene():
            scene = samples.scene()
            scene.stamp = probe.node.get_clock().now().nanoseconds * 1e-9
            scenes.publish(C.scene_to_msg(scene))

        probe.wait(lambda: publish_scene() or decisions, 90.0, "a decision")
        d = C.msg_to_decision(decisions[0])
        assert d.probabilities.sum() == pytest.approx(1.0)
        # the sample scene has no lane on the right: right lane changes are masked to zero
        for code in ("AR", "CR", "DR"):
            assert d.probabilities[T.ACTION_INDEX[code]] == 0.0
        assert d.candidate_set == T.candidate_set(d.probabilities, 0.1)
        assert len(d.retrieved_ids) == 3 and set(d.retrieved_ids) <= set(ids)
        assert "Which decisions" in d.query and d.latency > 0.0

        failures.publish(C.failure_to_msg(T.FailureEvent(d.stamp + 0.5, d.top_action, d.stamp, ["veh-1"], False)))
        probe.wait(lambda: publish_scene() or explanations, 120.0, "an explanation")
        e = C.msg_to_explanation(explanations[0])
        assert e.decision_stamp == pytest.approx(d.stamp, abs=1e-6)
        assert e.candidate_set == d.candidate_set
        assert e.text.startswith("Recommended decisions: " + ",".join(d.candidate_set))
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out


def test_missing_model_keeps_node_up_and_diagnosed(artifacts, tmp_path, ros_context):
    _, bank, _ = artifacts
    proc = _start(tmp_path, tmp_path / "no-such-student", bank)
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("decision_inference")
        probe.wait(lambda: any(d.level == b"\x02" and "cannot load" in d.message for d in diags), 60.0,
                   "an ERROR diagnostic about the missing model")
        assert proc.poll() is None, "the node must stay up in its degraded mode"
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out
