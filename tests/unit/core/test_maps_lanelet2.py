"""Lanelet2 OSM maps -> LaneGraph (luna_core.maps.lanelet2) through map_files.load_map.

The map is built with the lanelet2 package's own API and written by its own OSM writer (a real
Lanelet2 file, WGS84 nodes), then read back by the project's loader: a two-lane road (dashed
middle line), a successor lane, a crossing lane over it, and a two-way lane.
"""

from pathlib import Path

import numpy as np
import pytest

from luna_core.map_files import MapLoadError, load_map, parse_origin

lanelet2 = pytest.importorskip("lanelet2")
from lanelet2.core import AttributeMap, Lanelet, LineString3d, Point3d, getId  # noqa: E402
from lanelet2.io import Origin  # noqa: E402
from lanelet2.projection import UtmProjector  # noqa: E402

ORIGIN = (49.0, 8.4)
ROAD = {"type": "lanelet", "subtype": "road", "location": "urban", "one_way": "yes"}


def _line(points, subtype="solid", shared=None):
    pts = ([shared] if shared is not None else []) + [Point3d(getId(), x, y, 0.0) for x, y in points]
    return LineString3d(getId(), pts, AttributeMap({"type": "line_thin", "subtype": subtype}))


def _write_map(path: Path) -> dict[str, int]:
    xs = np.linspace(0.0, 100.0, 11)
    b0 = _line([(x, -1.75) for x in xs])
    b1 = _line([(x, 1.75) for x in xs], "dashed")
    b2 = _line([(x, 5.25) for x in xs])
    right = Lanelet(getId(), b1, b0, AttributeMap({**ROAD, "speed_limit": "80"}))
    left = Lanelet(getId(), b2, b1, AttributeMap(ROAD))
    # The right lane continues (sharing the end points of its bounds) across a north-south lane.
    c0 = _line([(100.0 + x, -1.75) for x in xs[1:6]], shared=b0[-1])
    c1 = _line([(100.0 + x, 1.75) for x in xs[1:6]], shared=b1[-1])
    after = Lanelet(getId(), c1, c0, AttributeMap(ROAD))
    cross = Lanelet(getId(), _line([(118.25, -20.0 + 4 * k) for k in range(11)]),
                    _line([(121.75, -20.0 + 4 * k) for k in range(11)]), AttributeMap(ROAD))
    two_way = Lanelet(getId(), _line([(x, 40.0) for x in xs]), _line([(x, 36.5) for x in xs]),
                      AttributeMap({**ROAD, "one_way": "no"}))
    lanelet_map = lanelet2.core.createMapFromLanelets([right, left, after, cross, two_way])
    lanelet2.io.write(str(path), lanelet_map, UtmProjector(Origin(*ORIGIN)))
    return {"right": right.id, "left": left.id, "after": after.id, "cross": cross.id, "two_way": two_way.id}


@pytest.fixture(scope="module")
def osm(tmp_path_factory):
    path = tmp_path_factory.mktemp("l2") / "town.osm"
    return path, _write_map(path)


def test_lanelet2_map_topology_speed_limits_and_junctions(osm):
    path, ids = osm
    graph = load_map(path, lanelet2_origin=ORIGIN)
    r, l, a, c, t = (str(ids[k]) for k in ("right", "left", "after", "cross", "two_way"))
    assert set(graph.lanes) == {r, l, a, c, t, f"{t}:inv"}
    right, left = graph.lanes[r], graph.lanes[l]
    # Metric frame around the origin the file was written with: the right lane's centre runs along y = 0.
    assert right.centerline[0] == pytest.approx([0.0, 0.0], abs=1e-3)
    assert right.centerline[-1] == pytest.approx([100.0, 0.0], abs=1e-3)
    assert right.width == pytest.approx(3.5, abs=1e-3)
    assert right.left_neighbor == l and left.right_neighbor == r and not left.left_neighbor
    assert right.road_id == left.road_id != graph.lanes[a].road_id
    assert right.successors == [a] and graph.lanes[a].predecessors == [r] and not left.successors
    assert right.speed_limit == pytest.approx(80 / 3.6) and left.speed_limit == pytest.approx(50 / 3.6)
    assert graph.lanes[a].in_junction and graph.lanes[c].in_junction
    assert not right.in_junction and not left.in_junction
    # The two-way lanelet is a lane in each direction, reversed geometry for the reverse one.
    fwd, rev = graph.lanes[t], graph.lanes[f"{t}:inv"]
    assert fwd.centerline[0] == pytest.approx(rev.centerline[-1], abs=1e-6)
    assert fwd.centerline[0][0] < fwd.centerline[-1][0]


def test_default_origin_is_the_first_node(osm):
    path, ids = osm
    graph = load_map(path)  # the origin is then the first node written, some metres from ORIGIN
    explicit = load_map(path, lanelet2_origin=ORIGIN)
    lane = str(ids["right"])
    shift = graph.lanes[lane].centerline - explicit.lanes[lane].centerline
    assert np.ptp(shift, axis=0) == pytest.approx([0.0, 0.0], abs=1e-3)  # one rigid offset
    assert 0.0 < np.linalg.norm(shift[0]) < 10.0


def test_bad_lanelet2_input_is_named(tmp_path):
    bad = tmp_path / "bad.osm"
    bad.write_text("<osm><way id='1'/></osm>")
    with pytest.raises(MapLoadError, match=r"bad.osm: no <node>"):
        load_map(bad)
    garbage = tmp_path / "garbage.osm"
    garbage.write_text("not xml at all")
    with pytest.raises(MapLoadError, match="not a readable Lanelet2 map"):
        load_map(garbage)
    empty = tmp_path / "empty.osm"
    empty.write_text("<osm><node id='1' lat='49.0' lon='8.4'/></osm>")
    with pytest.raises(MapLoadError, match="no lanelet a vehicle may drive"):
        load_map(empty)
    with pytest.raises(MapLoadError, match="expected 'lat, lon'"):
        parse_origin("49.0")
    with pytest.raises(MapLoadError, match="out of range"):
        parse_origin("91, 8")
    assert parse_origin("49.5, 8.25") == (49.5, 8.25) and parse_origin("") is None
