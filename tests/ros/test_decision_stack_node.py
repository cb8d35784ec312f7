"""decision_inference + explainer in one process over DDS, with a real student and memory bank."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import luna_msgs.msg as lm
from builtin_interfaces.msg import Time
from rosgraph_msgs.msg import Clock

from luna_core import types as T
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.ros.helpers import Probe, ros_env, stop_process, wait_for_subscribers


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("heuristic")
    bank, ids = make_bank(root)
    return make_student_dir(root), bank, ids


def _start(tmp_path: Path, student: Path, bank: Path, explainer: dict | None = None, **overrides) -> subprocess.Popen:
    model = {"student_model": str(student), "memory_bank": str(bank), "device": "cpu"}
    params = {"decision_inference": {"ros__parameters": {**model, "decision_period": 0.5, **overrides}},
              "explainer": {"ros__parameters": {**model, "max_tokens": 8, **(explainer or {})}}}
    path = tmp_path / "decision.yaml"
    path.write_text(yaml.safe_dump(params))
    exe = str(Path(sys.executable).parent / "decision_stack")
    return subprocess.Popen([exe, "--ros-args", "--params-file", str(path)], env=ros_env(),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _value(statuses: list, key: str) -> float:
    """The latest value of a diagnostic key (0 if never reported)."""
    for status in reversed(statuses):
        for kv in status.values:
            if kv.key == key:
                return float(kv.value)
    return 0.0


@pytest.mark.slow
def test_decisions_from_scenes_and_explanation_on_failure(artifacts, tmp_path, ros_context):
    student, bank, ids = artifacts
    # T_d far below a CPU forward pass: every decision overruns it, and the explanation must still come
    # out (the decision worker skips cycles instead of queueing them, and the explainer gets its turns).
    proc = _start(tmp_path, student, bank, decision_period=0.05)
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("decision_inference")
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
        probe.wait(lambda: _value(diags, "skipped_cycles_busy") > 0, 10.0, "a diagnosed skipped cycle")
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out


def crowded_scene(stamp: float, n_objects: int) -> T.SceneDescriptor:
    scene = samples.scene()
    scene.stamp = stamp
    scene.objects = [T.ObjectDescription(f"veh{i}", T.ObjectClass.VEHICLE, 10.0 + 2.0 * i, 0.01 * i, 0.0, 8.0,
                                         4.6, 1.9, "same lane") for i in range(n_objects)]
    return scene


@pytest.mark.slow
def test_bad_scenes_are_diagnosed_and_the_node_keeps_deciding(artifacts, tmp_path, ros_context):
    student, bank, _ = artifacts
    proc = _start(tmp_path, student, bank, max_context_tokens=1024)  # 40 objects do not fit
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("decision_inference")
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        wait_for_subscribers(scenes, timeout=60.0)

        def now() -> float:
            return probe.node.get_clock().now().nanoseconds * 1e-9

        def publish(make) -> None:
            scenes.publish(C.scene_to_msg(make(now())))

        def nan_scene(stamp: float) -> T.SceneDescriptor:
            scene = samples.scene()
            scene.stamp, scene.objects[1].distance = stamp, math.nan
            return scene

        def empty_scene(stamp: float) -> T.SceneDescriptor:  # no objects, no lanes known
            return T.SceneDescriptor(stamp=stamp, road_section=T.RoadSection.NORMAL_MULTI_LANE, num_lanes=0,
                                     ego_lane_index=0)

        # 1. a NaN: refused at the input, named in /diagnostics, no decision made on it
        probe.wait(lambda: publish(nan_scene) or any(
            s.level == b"\x01" and "objects[1] ('ped-7') distance is nan" in s.message for s in diags), 60.0,
            "a WARN diagnostic naming the NaN field")
        assert not decisions and _value(diags, "rejected_inputs") >= 1

        # 2. an empty scene: decided, lane keeping only
        probe.wait(lambda: publish(empty_scene) or decisions, 120.0, "a decision on the empty scene")
        d = C.msg_to_decision(decisions[-1])
        assert "Objects: none relevant." in d.query
        assert [c for c, p in zip(T.ACTION_CODES, d.probabilities) if p > 0.0] == ["AK", "CK", "DK", "SK"]

        # 3. a prompt longer than the context window: examples, then far objects left out; still decided
        def crowded_decided() -> bool:
            publish(lambda t: crowded_scene(t, 40))
            return any("veh39" in m.query for m in decisions)

        probe.wait(crowded_decided, 120.0, "a decision on the crowded scene")
        d = C.msg_to_decision(next(m for m in decisions if "veh39" in m.query))
        assert d.retrieved_ids == [] and d.probabilities.sum() == pytest.approx(1.0)
        probe.wait(lambda: any(s.level == b"\x01" and "longer than the context window: left out 3 retrieved"
                               in s.message for s in diags), 10.0, "a WARN diagnostic about the shortened prompt")
        assert _value(diags, "shortened_prompts") >= 1
        assert proc.poll() is None
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out


def _spoil_missing(student: Path, tmp_path: Path) -> tuple[Path, str]:
    return tmp_path / "no-such-student", "no-such-student: not a directory"


def _spoil_head(student: Path, tmp_path: Path) -> tuple[Path, str]:
    copy = Path(shutil.copytree(student, tmp_path / "student"))
    head = copy / "head.safetensors"
    head.write_bytes(head.read_bytes()[:-16] + b"not a tensor....")
    return copy, f"{head}: corrupt"


def _spoil_config(student: Path, tmp_path: Path) -> tuple[Path, str]:
    copy = Path(shutil.copytree(student, tmp_path / "student"))
    (copy / "student_config.json").write_text('{"lora_r": 16,')
    return copy, f"{copy / 'student_config.json'}: unreadable JSON"


@pytest.mark.parametrize("spoil", [_spoil_missing, _spoil_head, _spoil_config], ids=["missing", "corrupt-safetensors",
                                                                                     "bad-config-json"])
def test_bad_model_files_keep_node_up_and_diagnosed(artifacts, tmp_path, ros_context, spoil):
    student, bank, _ = artifacts
    path, named = spoil(student, tmp_path)
    proc = _start(tmp_path, path, bank)
    probe = Probe(ros_context)
    try:
        diags = probe.diagnostics("decision_inference")
        explainer = probe.diagnostics("explainer")
        probe.wait(lambda: any(d.level == b"\x02" and "cannot load" in d.message and named in d.message
                               for d in diags), 60.0, f"an ERROR diagnostic naming {named!r}")
        # Issue 17: the explainer said OK although it had no model to explain with.
        probe.wait(lambda: any(d.level == b"\x02" and "failures cannot be explained" in d.message
                               and named in d.message for d in explainer), 60.0,
                   f"the explainer's ERROR diagnostic naming {named!r}")
        assert proc.poll() is None, "the node must stay up in its degraded mode"
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out


@pytest.mark.slow
def test_an_explainer_that_cannot_start_leaves_decisions_running(artifacts, tmp_path, ros_context):
    # Issue 17: non-critical nodes never take critical ones down; the explainer shares the process.
    student, bank, _ = artifacts
    proc = _start(tmp_path, student, bank, explainer={"max_queue": 0})  # below its minimum of 1
    probe = Probe(ros_context)
    try:
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        wait_for_subscribers(scenes, timeout=90.0)

        def publish_scene():
            scene = samples.scene()
            scene.stamp = probe.node.get_clock().now().nanoseconds * 1e-9
            scenes.publish(C.scene_to_msg(scene))

        probe.wait(lambda: publish_scene() or decisions, 90.0, "a decision without the explainer")
        assert proc.poll() is None
    finally:
        probe.close()
        out = stop_process(proc, timeout=60)
    assert proc.returncode == 0, out
    assert "a non-critical node was not started" in out and "max_queue" in out, out


@pytest.mark.slow
def test_lock_step_instant_is_decided_on_a_late_scene(artifacts, tmp_path, ros_context):
    """Sim time, the clock held at a decision instant (luna replay's lock step): the only scene there is
    older than max_scene_age (the scene node starved) and the instant's scene comes 1.5 s (wall) later,
    long after input_sync_timeout. The instant is decided on it when it comes, not lost: bag time would
    otherwise hold until --lockstep-timeout and the instant end up without a decision."""
    student, bank, _ = artifacts
    proc = _start(tmp_path, student, bank, decision_period=2.0, use_sim_time=True, memory_reload=False)
    probe = Probe(ros_context)
    try:
        decisions = probe.collect(lm.DecisionDistribution, "luna/decision", qos.RELIABLE)
        scenes = probe.publisher(lm.SceneDescriptor, "luna/scene", qos.RELIABLE)
        clock = probe.publisher(Clock, "/clock", qos.CLOCK)
        wait_for_subscribers(scenes, timeout=60.0)
        wait_for_subscribers(clock, count=2, timeout=120.0)  # the time source and, once active, the cycle

        def scene_at(stamp: float) -> lm.SceneDescriptor:
            scene = samples.scene()
            scene.stamp = stamp
            return C.scene_to_msg(scene)

        epoch = 1_700_000_000  # s, even: a decision instant
        scenes.publish(scene_at(epoch + 0.5))  # 1.5 s before the instant: stale there (max_scene_age 1 s)
        probe.spin_for(0.5)
        clock.publish(Clock(clock=Time(sec=epoch + 2)))
        probe.spin_for(1.5)
        assert not decisions, "a decision on a scene older than max_scene_age"
        scenes.publish(scene_at(epoch + 2.0))
        probe.wait(lambda: decisions, 120.0, "the decision of the held instant once its scene came")
        d = C.msg_to_decision(decisions[0])
        assert d.stamp == pytest.approx(epoch + 2.0, abs=1e-6)
        assert d.scene_stamp == pytest.approx(epoch + 2.0, abs=1e-6)
    finally:
        probe.close()
        out = stop_process(proc)
    assert proc.returncode == 0, out
