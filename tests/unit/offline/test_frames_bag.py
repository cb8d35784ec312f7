"""``luna-offline frames --bag``: 2 Hz scene-descriptor frames from a recorded rosbag2 bag.

A bag written from a scenario (``luna bag from-scenario``'s conversion: odometry, objects, lights, route,
lane graph as the stack receives them) must give the frames the scenario itself gives; the bundled
sample bag gives its 12 s of frames; a damaged bag gives what is readable and says what was lost.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from luna_bags.convert import scenario_to_bag
from luna_bags.writer import BagWriter
from luna_core.scene import scene_to_dict
from luna_offline import cli
from luna_offline.frames import FrameError, bag_frames, read_frames, scenario_frames
from tests.unit.offline.test_frames import junction_scenario

REPO = Path(__file__).resolve().parents[3]
SAMPLE_BAG = REPO / "models" / "sample_bags" / "USA_US101-4_1_T-1"
START = 1_700_000_000.0


def _same_scene(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key == "stamp":
            continue
        if key == "objects":
            assert [o["id"] for o in a[key]] == [o["id"] for o in b[key]]
            for oa, ob in zip(a[key], b[key]):
                for field, va in oa.items():
                    vb = ob[field]
                    assert (va == pytest.approx(vb, abs=1e-4)) if isinstance(va, float) else va == vb, (key, field)
        elif isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_of_a_scenario_gives_the_scenario_frames(tmp_path, storage):
    scenario = junction_scenario()
    bag = tmp_path / "junction_bag"
    scenario_to_bag(scenario, bag, storage=storage, start_time=START, progress=False)
    frames, issues = bag_frames(bag, rate=2.0)
    assert issues == []
    first = float(scenario.expert.t[0])  # the bag starts with the expert's log (history included)
    assert [f.time for f in frames] == pytest.approx([0.5 * k for k in range(9)])
    assert frames[0].id == "junction_bag@0000.00" and frames[0].origin["source"] == "bag"
    assert frames[0].origin["stamp"] == pytest.approx(START + first)
    reference = {f.time: f for f in scenario_frames(scenario, rate=2.0)}
    matched = 0
    for f in frames:
        t = round(f.time + first, 3)
        if t not in reference:
            continue
        ref = reference[t]
        _same_scene(scene_to_dict(f.scene), scene_to_dict(ref.scene))
        assert f.expert_decision == ref.expert_decision
        matched += 1
    assert matched == len(reference) == 7
    assert any(f.scene.objects for f in frames) and frames[-1].scene.traffic_light.value == "Red"


def test_sample_bag_frames():
    frames, issues = bag_frames(SAMPLE_BAG)
    assert issues == []
    assert len(frames) == 25 and frames[-1].time == pytest.approx(12.0)
    assert len({f.id for f in frames}) == 25
    # Real NGSIM traffic on the US 101 section (5 lanes, 6 where a ramp joins); vehicles around the ego
    # once the recording has them (from 2 s on: the bag starts with the expert's 2 s of history).
    assert {f.scene.num_lanes for f in frames} <= {5, 6} and frames[0].scene.num_lanes == 5
    assert sum(1 for f in frames if f.scene.objects) >= 20
    assert all(math.isfinite(f.scene.ego_speed) and f.scene.ego_speed > 0 for f in frames)
    # The expert changes one lane to the right (the sample bag's README): labelled once, lane index + 1.
    decisions = [f.expert_decision for f in frames]
    assert decisions.count("CR") == 1 and decisions[-1] == ""
    k = decisions.index("CR")
    assert frames[k + 1].scene.ego_lane_index == frames[k].scene.ego_lane_index + 1


def test_truncated_bag_gives_the_readable_frames_and_says_so(tmp_path):
    bag = tmp_path / "cut"
    shutil.copytree(SAMPLE_BAG, bag)
    mcap = next(bag.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[: len(data) // 2])  # a recorder killed mid-write
    frames, issues = bag_frames(bag)
    assert 0 < len(frames) < 25
    assert any("truncated" in i for i in issues)


def test_bag_without_lane_graph_is_refused_with_the_reason(tmp_path):
    from rclpy.serialization import serialize_message

    from luna_core.types import EgoState
    from luna_msgs_py import convert as C

    bag = tmp_path / "odom_only"
    with BagWriter(bag, "mcap") as w:
        w.add_topic("/localization/kinematic_state", "nav_msgs/msg/Odometry")
        for k in range(5):
            stamp = START + 0.1 * k
            w.write("/localization/kinematic_state", int(stamp * 1e9),
                    serialize_message(C.ego_to_odometry(EgoState(stamp, k * 1.0, 0.0, 0.0, 10.0))))
    with pytest.raises(FrameError, match="no lane graph on /map/lane_graph"):
        bag_frames(bag)
    with pytest.raises(FrameError, match="no such bag"):
        bag_frames(tmp_path / "missing")


def test_cli_writes_bag_frames(tmp_path, capsys):
    out = tmp_path / "frames.jsonl"
    assert cli.main(["frames", "--bag", str(SAMPLE_BAG), "--out", str(out)]) == 0
    frames = read_frames(out)
    assert len(frames) == 25 and frames[3].origin["bag"] == str(SAMPLE_BAG)
    assert "wrote 25 frames" in capsys.readouterr().out
    assert cli.main(["frames", "--bag", str(tmp_path / "missing"), "--out", str(tmp_path / "x.jsonl")]) == 1
    assert "no such bag" in capsys.readouterr().err
