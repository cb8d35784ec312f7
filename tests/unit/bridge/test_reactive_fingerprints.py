"""benchmarks/reactive_traffic_fingerprints.py: a fingerprint names a run's traffic, exactly."""

from __future__ import annotations

import numpy as np

from luna_bridge.sim import LogReplayPlanner, simulate
from tests.benchmark_scripts import load_benchmark
from tests.unit.bridge.test_sim import _track, straight_scenario


def test_the_fingerprint_is_the_same_for_the_same_traffic_and_differs_when_an_agent_reacts() -> None:
    fingerprint = load_benchmark("reactive_traffic_fingerprints").fingerprint
    n = 101
    follower = _track("follower", 0.0, -40.0 + 8.0 * np.arange(n) * 0.1, 0.0, np.full(n, 8.0))
    sc = straight_scenario(ego_speed=0.0, agents=[follower], duration=10.0)
    replayed = simulate(sc, LogReplayPlanner(sc), reactive=False)
    reactive = simulate(sc, LogReplayPlanner(sc), reactive=True)
    assert fingerprint(reactive) == fingerprint(simulate(sc, LogReplayPlanner(sc), reactive=True))
    assert fingerprint(reactive) != fingerprint(replayed)  # the IDM agent stops behind the ego
