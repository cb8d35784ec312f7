"""CommonRoad loader on the real NGSIM files in ../shared/scenarios/commonroad ($LUNA_COMMONROAD_DIR),
plus clear errors for files that are not CommonRoad."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from luna_core.lanes import lane_map
from luna_bridge.scenarios import commonroad_dir
from luna_bridge.scenarios.commonroad import CommonRoadError, load_commonroad
from luna_bridge.sim import LogReplayPlanner, simulate

CR_DIR = commonroad_dir()
needs_data = pytest.mark.skipif(not CR_DIR.is_dir(), reason=f"CommonRoad scenarios not found at {CR_DIR} "
                                                             "(set LUNA_COMMONROAD_DIR)")


@pytest.fixture(scope="module")
def lanker():
    return load_commonroad(CR_DIR / "USA_Lanker-1_2_T-1.xml")


@needs_data
def test_lanelets_become_a_connected_lane_graph(lanker) -> None:
    g = lanker.lane_graph
    assert len(g.lanes) == 91
    for lane in g.lanes.values():
        for ref in lane.successors + lane.predecessors + [lane.left_neighbor, lane.right_neighbor]:
            assert ref == "" or ref in g.lanes
    with_neighbours = [lane for lane in g.lanes.values() if lane.left_neighbor or lane.right_neighbor]
    assert with_neighbours, "same-direction adjacency must become neighbours"
    for lane in with_neighbours:  # neighbours share a road
        for nb in (lane.left_neighbor, lane.right_neighbor):
            if nb:
                assert g.lanes[nb].road_id == lane.road_id
    junction = [lane for lane in g.lanes.values() if lane.in_junction]
    assert 0 < len(junction) < len(g.lanes)  # Lankershim has signalised intersections
    assert all(lane.speed_limit > 0 for lane in g.lanes.values())


@needs_data
def test_planning_problem_and_recorded_traffic(lanker) -> None:
    assert lanker.source == "commonroad" and lanker.duration == pytest.approx(5.5)
    assert len(lanker.agents) == 42
    for road in lanker.route.road_ids:
        assert any(lane.road_id == road for lane in lanker.lane_graph.lanes.values())
    lm = lane_map(lanker.lane_graph)
    e = lanker.ego_initial
    assert lm.nearest_lane(e.x, e.y, e.heading) is not None
    # the expert starts at the initial state and has a 2 s history
    assert lanker.expert.t[0] == pytest.approx(-2.0)
    s0 = lanker.expert.state_at(0.0)
    assert np.hypot(s0.x - e.x, s0.y - e.y) < 1.0
    moving = [a for a in lanker.agents if np.nanmax(np.hypot(a.vx, a.vy)) > 1.0]
    assert moving and all(np.isfinite(a.heading[np.isfinite(a.x)]).all() for a in moving)


@needs_data
def test_the_wheels_start_at_the_angle_of_the_initial_yaw_rate() -> None:
    # CommonRoad gives a yaw rate and no wheel angle; straight wheels under a turning ego made the
    # tracker swing them (USA_Lanker-1_11_T-1 starts at 5.2 m/s turning at 0.15 rad/s).
    s = load_commonroad(CR_DIR / "USA_Lanker-1_11_T-1.xml")
    e = s.ego_initial
    assert e.yaw_rate == pytest.approx(0.1527, abs=1e-3)
    assert e.steering_angle == pytest.approx(np.arctan(s.vehicle.wheelbase * e.yaw_rate / e.velocity), abs=1e-9)
    assert e.steering_angle > 0.05


@needs_data
def test_log_replay_runs_on_a_commonroad_scenario(lanker) -> None:
    log = simulate(lanker, LogReplayPlanner(lanker))
    assert log.planner_failures == 0 and len(log.t) == lanker.num_steps
    from luna_core.lanes import Polyline

    e = log.ego_array()
    exp = np.array([[lanker.expert.state_at(t).x, lanker.expert.state_at(t).y] for t in log.t])
    off_path = Polyline(exp).project(e[:, :2]).distance
    assert np.max(off_path) < 0.5  # it drives the expert's path ...
    assert np.max(np.hypot(*(e[:, :2] - exp).T)) < 3.0  # ... lagging a little while accelerating


def test_not_commonroad_xml_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "osm.xml"
    p.write_text('<?xml version="1.0"?><osm version="0.6"><node id="1"/></osm>')
    with pytest.raises(CommonRoadError, match=r"osm.xml: not a CommonRoad scenario \(root element <osm>"):
        load_commonroad(p)
    q = tmp_path / "broken.xml"
    q.write_text("<commonRoad><lanelet")
    with pytest.raises(CommonRoadError, match="broken.xml"):
        load_commonroad(q)
    with pytest.raises(CommonRoadError, match="no such file"):
        load_commonroad(tmp_path / "missing.xml")
