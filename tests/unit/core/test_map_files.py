"""map_server's file loading: the project's JSON, CommonRoad XML, and clear errors."""

import os
from pathlib import Path

import pytest

from luna_core.lane_graph_io import save_lane_graph
from luna_core.map_files import MapLoadError, load_map
from tests import samples

CR_DIR = Path(os.environ.get("LUNA_COMMONROAD_DIR", Path(__file__).resolve().parents[3] / "../shared/scenarios/commonroad"))


def test_json_map_by_extension(tmp_path):
    save_lane_graph(samples.lane_graph(), tmp_path / "m.json")
    assert set(load_map(tmp_path / "m.json").lanes) == set(samples.lane_graph().lanes)


@pytest.mark.skipif(not CR_DIR.is_dir(), reason=f"CommonRoad scenarios not found at {CR_DIR} (set LUNA_COMMONROAD_DIR)")
def test_commonroad_xml_map():
    graph = load_map(CR_DIR / "USA_US101-4_2_T-1.xml")
    assert len(graph.lanes) > 0 and all(len(lane.centerline) >= 2 for lane in graph.lanes.values())


@pytest.mark.parametrize("name,fmt,match", [("m.txt", "auto", "cannot tell the map format"),
                                            ("m.xml", "commonroad", "not a readable CommonRoad map"),
                                            ("missing.json", "auto", "no such map file")])
def test_bad_map_files_name_the_file(tmp_path, name, fmt, match):
    if name != "missing.json":
        (tmp_path / name).write_text("not a map")
    with pytest.raises(MapLoadError, match=match):
        load_map(tmp_path / name, fmt)
