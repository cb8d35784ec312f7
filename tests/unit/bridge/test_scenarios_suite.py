"""The suite registry and the bundled synthetic suite: counts, coverage, no silent drops, clean experts."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from luna_bridge.scenarios import load_suite, suite_refs
from luna_bridge.scenarios.registry import DATA_DIR
from luna_bridge.scenarios.synthetic import SCENARIO_TYPES, check_log_replay, generate


def test_bundled_splits_cover_all_14_types() -> None:
    for suite, minimum in (("synthetic-hard", 10), ("synthetic-random", 10), ("synthetic-train", 5)):
        refs = suite_refs(suite)
        counts = Counter(name.split("_", 1)[1].rsplit("_", 1)[0] for name, _, _ in refs)
        assert set(counts) == set(SCENARIO_TYPES), suite
        assert min(counts.values()) >= minimum, (suite, counts)


def test_splits_are_disjoint_draws() -> None:
    seeds = {}
    for suite in ("synthetic-hard", "synthetic-random", "synthetic-train"):
        for name, source, _ in suite_refs(suite)[::25]:
            import gzip
            meta = json.loads(gzip.decompress(Path(source).read_bytes()))["metadata"]
            assert meta["seed"] not in seeds, (name, seeds.get(meta["seed"]))
            seeds[meta["seed"]] = name


def test_load_suite_reports_every_failure(tmp_path: Path) -> None:
    refs = suite_refs("synthetic-hard")[:3]
    for _, source, _ in refs:
        shutil.copy(source, tmp_path)
    (tmp_path / "broken.json").write_text('{"format": "luna-scenario", "format_version": 1}')
    result = load_suite(str(tmp_path))
    assert len(result.scenarios) == 3
    assert len(result.failures) == 1 and "broken.json" in result.failures[0].source
    assert "missing field" in result.failures[0].error


def test_unknown_suite_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="unknown suite 'nope'"):
        suite_refs("nope")


def test_generation_is_deterministic_and_matches_the_bundled_file() -> None:
    from luna_bridge.scenarios.format import load_scenario, scenario_to_dict

    name = "hard_following_lane_with_lead_00"
    bundled = load_scenario(DATA_DIR / "hard" / f"{name}.json.gz")
    fresh = generate("following_lane_with_lead", "hard", 0)
    assert fresh.name == name
    a, b = scenario_to_dict(bundled), scenario_to_dict(fresh)
    assert json.dumps(a["expert"]) == json.dumps(b["expert"])
    assert [x["id"] for x in a["agents"]] == [x["id"] for x in b["agents"]]


@pytest.mark.parametrize("suite,index", [("synthetic-hard", 0), ("synthetic-hard", 57), ("synthetic-random", 91),
                                         ("synthetic-random", 133)])
def test_bundled_expert_replays_cleanly(suite: str, index: int) -> None:
    from luna_bridge.scenarios.registry import load_entry

    refs = suite_refs(suite)
    name, source, loader = refs[index % len(refs)]
    assert check_log_replay(load_entry(source, loader)) == "", name
