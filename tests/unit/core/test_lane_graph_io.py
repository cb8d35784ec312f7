import json

import pytest

from luna_core.lane_graph_io import LaneGraphError, lane_graph_to_dict, load_lane_graph, save_lane_graph
from tests import samples
from tests.equality import assert_same


def test_save_load_round_trip(tmp_path):
    graph = samples.lane_graph()
    path = tmp_path / "g.json"
    save_lane_graph(graph, path)
    back = load_lane_graph(path)
    graph.stamp = back.stamp
    assert_same(graph, back, tol=1e-4)


def _write(tmp_path, data):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["lanes"][0].pop("centerline"), "lane 'l0': missing field 'centerline'"),
    (lambda d: d["lanes"][0].update(successors=["nowhere"]), "names unknown lane 'nowhere'"),
    (lambda d: d["lanes"][1].update(left_boundary=[[0, float("nan")], [1, 1]]), "NaN"),
    (lambda d: d["lanes"][0].update(speed_limit=-3), "speed_limit"),
    (lambda d: d["lanes"].append(dict(d["lanes"][0])), "duplicate lane id"),
    (lambda d: d.update(format_version=99), "format_version 99"),
])
def test_bad_files_name_file_lane_and_field(tmp_path, mutate, match):
    data = lane_graph_to_dict(samples.lane_graph())
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(LaneGraphError, match=match) as info:
        load_lane_graph(path)
    assert str(path) in str(info.value)


def test_not_json(tmp_path):
    with pytest.raises(LaneGraphError, match="not a JSON lane graph"):
        load_lane_graph(_write(tmp_path, "<CommonRoad/>"))
