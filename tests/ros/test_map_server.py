"""map_server over DDS: a Lanelet2 OSM map is published as a latched lane graph; a bad map file is
diagnosed as an ERROR naming the file, and the node stays up."""

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

import luna_msgs.msg as lm
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests.ros.helpers import Probe, start_node, stop_process

pytest.importorskip("lanelet2")
from tests.unit.core.test_maps_lanelet2 import ORIGIN, _write_map  # noqa: E402


def test_map_server_publishes_a_lanelet2_map_and_diagnoses_a_bad_one(tmp_path, ros_context):
    osm = tmp_path / "town.osm"
    ids = _write_map(osm)
    bad = tmp_path / "broken.osm"
    bad.write_text("<osm><way id='1'/></osm>")
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good_node = start_node("map_server", "map_server", {"map_file": str(osm), "lanelet2_origin": f"{ORIGIN[0]}, "
                                                        f"{ORIGIN[1]}"}, tmp_path / "good")
    probe = Probe(ros_context)
    bad_node = None
    try:
        graphs = probe.collect(lm.LaneGraph, "map/lane_graph", qos.LATCHED)  # joins late: latched delivery
        probe.wait(lambda: graphs, 60.0, "the lane graph")
        graph = C.msg_to_lane_graph(graphs[0])
        assert str(ids["right"]) in graph.lanes and graph.lanes[str(ids["right"])].left_neighbor == str(ids["left"])
        assert len(graph.lanes) == 6
        stop_process(good_node)
        bad_node = start_node("map_server", "map_server", {"map_file": str(bad)}, tmp_path / "bad")
        statuses = probe.diagnostics("map_server")
        probe.wait(lambda: any(s.level == DiagnosticStatus.ERROR for s in statuses), 60.0, "the map ERROR")
        error = next(s for s in statuses if s.level == DiagnosticStatus.ERROR)
        assert "broken.osm" in error.message and "no <node>" in error.message
        assert bad_node.poll() is None
    finally:
        probe.close()
        outputs = [stop_process(p) for p in (good_node, bad_node) if p is not None]
    assert good_node.returncode == 0 and bad_node.returncode == 0, outputs
