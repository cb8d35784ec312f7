"""``luna-offline collect`` frame runners: simulation-grounded frames in worker processes and on Ray
actors (a real local Ray instance) give the same memory items as the in-process threads."""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.memory import MemoryBank, SceneVectorEmbedder
from luna_core.teacher import ScoredVoterPool, Teacher
from luna_bridge.action_scorer import make_scorer
from luna_bridge.scenarios.format import save_scenario
from luna_offline.collect import ProcessRunner, RayRunner, ThreadRunner, collect
from luna_offline.frames import scenario_frames
from tests.unit.bridge.test_action_scorer import STEPS, _track, two_lane_road


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    road = two_lane_road([_track("v3", np.full(STEPS, 45.0), 0.0, 0.0)], name="stalled")
    path = save_scenario(road, tmp_path_factory.mktemp("scn") / "stalled.json.gz")
    return list(scenario_frames(road, rate=1.0, origin={"file": str(path)}))[:4]


def _items(frames, tmp_path, name, runner_factory):
    teacher = Teacher(ScoredVoterPool(make_scorer()))
    with MemoryBank.create(tmp_path / name, SceneVectorEmbedder()) as bank:
        summary = collect(frames, teacher, bank, tmp_path / (name + "-run"), seed=7, concurrency=2,
                          runner=runner_factory(teacher), progress=False)
        assert (summary.ok, summary.failed) == (len(frames), 0)
        return {it.id: (it.answer, it.distribution) for it in bank.items}


def _same(a, b):
    assert set(a) == set(b)
    for key in a:
        assert a[key][0] == b[key][0]
        np.testing.assert_array_equal(a[key][1], b[key][1])


@pytest.mark.slow  # two spawned workers import torch and the stack: ~30 s on two busy cores
def test_process_runner_matches_the_thread_runner(frames, tmp_path):
    threads = _items(frames, tmp_path, "threads", lambda t: ThreadRunner(t, 7, 2))
    processes = _items(frames, tmp_path, "processes", lambda t: ProcessRunner(t, 7, 2))
    _same(threads, processes)
    assert len({a for a, _ in threads.values()}) > 1  # different frames, different answers


@pytest.mark.slow  # starting a local Ray instance takes ~15-30 s on two busy cores
def test_ray_runner_on_a_local_ray_instance_matches_the_thread_runner(frames, tmp_path):
    import ray

    threads = _items(frames, tmp_path, "threads", lambda t: ThreadRunner(t, 7, 1))
    on_ray = _items(frames, tmp_path, "ray", lambda t: RayRunner(t, 7, 2))
    _same(threads, on_ray)
    assert not ray.is_initialized()  # the runner stopped the instance it started
