"""Scenario files: round trip, byte-reproducible gzip, and clear errors for bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from luna_bridge.scenarios.format import ScenarioFormatError, load_scenario, save_scenario, scenario_to_dict
from luna_bridge.scenarios.synthetic import generate


@pytest.fixture(scope="module")
def scenario():
    return generate("waiting_for_pedestrian_to_cross", "random", 0)


def _write(tmp_path: Path, data: dict, name: str = "bad.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_round_trip_keeps_states_and_topology(tmp_path: Path, scenario) -> None:
    path = save_scenario(scenario, tmp_path / "s.json.gz")
    back = load_scenario(path)
    assert back.name == scenario.name and back.scenario_type == scenario.scenario_type
    assert back.route.road_ids == scenario.route.road_ids
    assert set(back.lane_graph.lanes) == set(scenario.lane_graph.lanes)
    assert back.lane_graph.lanes["r0_l0"].successors == scenario.lane_graph.lanes["r0_l0"].successors
    np.testing.assert_allclose(back.expert.x, scenario.expert.x, atol=0.0051)  # stored to 1 cm
    np.testing.assert_allclose(back.expert.t, scenario.expert.t, atol=1e-9)
    assert [a.id for a in back.agents] == [a.id for a in scenario.agents]
    ped = back.agents[0]
    assert ped.object_class.value == "pedestrian"
    assert back.ego_initial.velocity == pytest.approx(scenario.ego_initial.velocity, abs=1e-4)
    assert back.metadata["seed"] == scenario.metadata["seed"]


def test_gzip_output_is_byte_reproducible(tmp_path: Path, scenario) -> None:
    a = save_scenario(scenario, tmp_path / "a.json.gz").read_bytes()
    b = save_scenario(scenario, tmp_path / "b.json.gz").read_bytes()
    assert a == b
    assert json.loads(gzip.decompress(a))["format_version"] == 1


def test_absent_rows_are_null_and_load_as_nan(tmp_path: Path, scenario) -> None:
    d = scenario_to_dict(scenario)
    for f in ("x", "y", "heading", "vx", "vy"):
        d["agents"][0][f][3] = None
    back = load_scenario(_write(tmp_path, d))
    assert np.isnan(back.agents[0].x[3]) and back.agents[0].state_at(back.agents[0].t[3]) is None


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("route"), "route: missing field"),
    (lambda d: d["expert"].pop("heading"), "expert[id=ego].heading: missing field"),
    (lambda d: d["route"]["road_ids"].append("nowhere"), "unknown road id 'nowhere' (no lane has it)"),
    (lambda d: d["lane_graph"]["lanes"][0]["successors"].append("ghost"), "names unknown lane 'ghost'"),
    (lambda d: d["agents"][0]["x"].__setitem__(2, None), "agents[0][id=ped0].x[2]"),
    (lambda d: d["agents"][0].__setitem__("class", "spaceship"), "unknown object class 'spaceship'"),
    (lambda d: d.__setitem__("format_version", 99), "format_version: version 99 is not supported"),
    (lambda d: d["ego_initial"].__setitem__("velocity", "fast"), "ego_initial.velocity: expected a number"),
    (lambda d: d.__setitem__("traffic_lights", [{"lane_id": "nope", "times": [0], "phases": ["Red"]}]),
     "traffic_lights[0].lane_id: unknown lane id 'nope'"),
])
def test_bad_files_name_the_file_and_the_field(tmp_path: Path, scenario, mutate, needle: str) -> None:
    d = scenario_to_dict(scenario)
    mutate(d)
    path = _write(tmp_path, d)
    with pytest.raises(ScenarioFormatError) as exc:
        load_scenario(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_nan_token_is_rejected(tmp_path: Path, scenario) -> None:
    text = json.dumps(scenario_to_dict(scenario)).replace('"vx": [', '"vx": [NaN, ', 1)
    p = tmp_path / "nan.json"
    p.write_text(text)
    with pytest.raises(ScenarioFormatError, match="NaN"):
        load_scenario(p)


def test_not_a_scenario_and_not_json(tmp_path: Path) -> None:
    p = _write(tmp_path, {"format": "luna-lane-graph", "lanes": []}, "graph.json")
    with pytest.raises(ScenarioFormatError, match="not a LUNA scenario file"):
        load_scenario(p)
    q = tmp_path / "junk.json"
    q.write_text("{not json")
    with pytest.raises(ScenarioFormatError, match="not valid JSON"):
        load_scenario(q)
    with pytest.raises(ScenarioFormatError, match="no such file"):
        load_scenario(tmp_path / "missing.json")
