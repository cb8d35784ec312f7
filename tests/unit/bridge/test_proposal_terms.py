"""benchmarks/proposal_terms.py: the scorer's terms of one scenario's lane proposals at t = 0."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark


def test_lane_proposals_on_a_synthetic_road_stay_inside_and_rank_by_progress() -> None:
    script = load_benchmark("proposal_terms")
    lines = script.proposal_table(script.scenario_input("hard_behind_long_vehicle_00", "synthetic-hard"), [2.0, 8.0])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[3:]]
    assert lines[0].startswith("ego at (") and [r[0] for r in rows] == ["2.0", "8.0"]
    drivable, progress_m, outside = ([float(r[i]) for r in rows] for i in (2, 4, 9))
    assert drivable == [1.0, 1.0] and outside == [0.0, 0.0]  # centred on a straight synthetic lane
    assert progress_m[1] > progress_m[0] > 0.0


def test_unknown_scenario_is_named_in_the_error() -> None:
    script = load_benchmark("proposal_terms")
    with pytest.raises(ValueError, match="no scenario 'nope'"):
        script.scenario_input("nope", "synthetic-hard")
