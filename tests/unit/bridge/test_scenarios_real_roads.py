"""Synthetic traffic on the real road layouts of the commonroad-dataset-converter wheel (issue 13's
"synthetic traffic on real road layouts"): the maps load, draws are deterministic, valid and never an
evaluation scenario."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from luna_core.lanes import lane_map
from luna_bridge.scenarios import real_roads
from luna_bridge.scenarios.format import load_scenario, save_scenario
from luna_bridge.scenarios.real_roads import LAYOUTS, generate, map_path, road_graph
from luna_bridge.scenarios.synthetic import SPLITS, check_log_replay


def test_every_layout_is_installed_and_reads_as_a_lane_graph_with_its_speed_limit() -> None:
    for layout in LAYOUTS:
        assert map_path(layout).is_file(), layout.file
        graph = road_graph(layout.name)
        assert len(graph.lanes) >= 5, layout.name
        limits = {lane.speed_limit for lane in graph.lanes.values()}
        if layout.kind == "city":
            assert min(limits) > 0.0, f"{layout.name}: a city lane without a speed limit"
        else:
            assert limits == {0.0}, f"{layout.name}: motorway limits stay unknown, got {limits}"
        # lanes continue into one another: the generator needs successor chains
        assert any(lane.successors for lane in graph.lanes.values()), layout.name


def test_no_layout_is_a_location_of_the_commonroad_evaluation_files() -> None:
    evaluation = ("Lanker", "Peach", "US101")
    assert not [layout.file for layout in LAYOUTS if any(place in layout.file for place in evaluation)]
    # and the seeds are apart from every synthetic split's
    bases = {base * 1000 for base in SPLITS.values()}
    assert real_roads.SEED_BASE * 1000 not in bases and real_roads.SPLIT == "train"


@pytest.mark.parametrize("name,index", [("DEU_AachenBrand_1", 0), ("DEU_AachenBendplatz_1", 1)])
def test_a_draw_is_deterministic_valid_and_keeps_the_expert_on_its_road(name: str, index: int,
                                                                        tmp_path: Path) -> None:
    first = generate(name, index)
    again = generate(name, index)
    a = save_scenario(first, tmp_path / "a.json.gz").read_bytes()
    assert a == save_scenario(again, tmp_path / "b.json.gz").read_bytes()  # same seed, same file
    loaded = load_scenario(tmp_path / "a.json.gz")
    assert loaded.scenario_type == "real_road" and loaded.split == "train"
    assert loaded.name == f"train_real_{name}_{index:02d}"
    assert loaded.metadata["map"].endswith(".xml") and loaded.metadata["variant"] == ("hard" if index % 2 else "ordinary")
    # the expert stays on the map's lanes, keeps its route's road sections and replays cleanly
    expert = loaded.expert
    ok = np.isfinite(expert.x) & (expert.t >= 0.0)
    lm = lane_map(loaded.lane_graph)
    assert lm.in_drivable_area(np.column_stack([expert.x[ok], expert.y[ok]])).all()
    assert set(loaded.route.road_ids) <= {lane.road_id for lane in loaded.lane_graph.lanes.values()}
    driven = np.hypot(np.diff(expert.x[ok]), np.diff(expert.y[ok])).sum()
    if index % 2 == 0:  # the ordinary draw drives on; a long-tail one may wait behind a car standing in its lane
        assert driven > 20.0
    assert check_log_replay(loaded) == ""


def test_unknown_layouts_and_out_of_range_indices_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown road layout 'Nowhere'"):
        generate("Nowhere", 0)
    with pytest.raises(ValueError, match="index must be in 0..99"):
        generate(LAYOUTS[0].name, 100)


def test_generate_suite_writes_real_road_scenarios_only_when_asked(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "luna_bridge.cli", "generate-suite", "--splits", "--real-roads", "1",
           "--out", str(tmp_path), "--workers", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    files = sorted((tmp_path / "train_real").glob("*.json.gz"))
    assert f"{len(files)} of {len(LAYOUTS)} scenarios written" in done.stdout, done.stdout + done.stderr
    assert len(files) >= len(LAYOUTS) - 2, done.stderr  # a small map may find no valid draw: it is named
    assert done.returncode == (0 if len(files) == len(LAYOUTS) else 1)
    assert not [p for p in tmp_path.iterdir() if p.name != "train_real"]  # no synthetic split written
