"""``luna-offline frames``: 2 Hz scene-descriptor frames from a scenario, file round trip, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from luna_bridge.scenario import AgentTrack, Scenario, TrafficLightTimeline
from luna_core.types import EgoState, ObjectClass, RoadSection, TrafficLightPhase
from luna_offline.frames import FrameError, expert_decision, read_frames, scenario_frames, write_frames
from tests.unit.core.test_scene import W, junction_world

DURATION = 3.0


def track(oid: str, cls: ObjectClass, t: np.ndarray, x: np.ndarray, y: float, v: np.ndarray) -> AgentTrack:
    n = len(t)
    return AgentTrack(oid, cls, 4.5, 1.9, t, x, np.full(n, y), np.zeros(n), v, np.zeros(n))


def junction_scenario(name: str = "junction-test") -> Scenario:
    """The expert brakes at 1 m/s^2 from 8 m/s on lane a1 towards the junction (x = 100) from x = 70 at
    t = 0 (its log starts 1 s earlier); a lead vehicle drives 20 m ahead; j1's light is red."""
    g, route, _ = junction_world()
    t = np.round(np.arange(-1.0, DURATION + 1e-9, 0.1), 6)
    v = 8.0 - 1.0 * np.clip(t, 0.0, None)
    x = 70.0 + np.where(t < 0, 8.0 * t, 8.0 * t - 0.5 * np.clip(t, 0, None) ** 2)
    expert = track("ego", ObjectClass.VEHICLE, t, x, W, v)
    ta = t[t >= 0]
    lead = track("lead", ObjectClass.VEHICLE, ta, 70.0 + 20.0 + 5.0 * ta, W, np.full(len(ta), 5.0))
    return Scenario(name, "stopping_with_lead", g, route, EgoState(0.0, 70.0, W, 0.0, 8.0), expert, [lead],
                    [TrafficLightTimeline("j1", [0.0], [TrafficLightPhase.RED])], duration=DURATION,
                    split="train")


def test_frames_every_half_second_with_expert_decisions():
    frames = list(scenario_frames(junction_scenario(), rate=2.0, origin={"suite": "unit"}))
    assert [f.time for f in frames] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert frames[0].id == "junction-test@0000.00" and len({f.id for f in frames}) == 7
    assert frames[0].origin == {"scenario": "junction-test", "type": "stopping_with_lead", "split": "train",
                                "source": "synthetic", "suite": "unit"}
    # Braking at 1 m/s^2 (> 0.5 threshold) from t = 0; cruising at 8 m/s in the log before it.
    assert [f.expert_decision for f in frames] == ["DK"] * 6 + [""]
    assert frames[0].scene.recent_decisions == ["CK", "CK"]  # from the log history before t = 0
    assert frames[1].scene.recent_decisions == ["CK", "DK"] and frames[3].scene.recent_decisions == ["DK", "DK"]
    # x(t) = 70 + 8t - t^2/2: 30 m to the junction at t=0, 19.125 m at t=1.5
    assert frames[0].scene.road_section is RoadSection.NORMAL_MULTI_LANE
    assert frames[3].scene.road_section is RoadSection.NEAR_JUNCTION
    assert frames[3].scene.junction_distance == pytest.approx(100 - (70 + 12 - 1.125), abs=1e-6)
    assert frames[3].scene.traffic_light is TrafficLightPhase.RED
    assert frames[2].scene.ego_speed == pytest.approx(7.0) and frames[2].scene.ego_acceleration == pytest.approx(-1.0)
    lead = frames[0].scene.objects[0]
    assert lead.id == "lead" and lead.lane_relation == "same lane"


def test_expert_lane_change_labels():
    g, _, _ = junction_world()
    right = EgoState(0.0, 40.0, 0.0, 0.0, 10.0)
    left = EgoState(0.5, 45.0, W, 0.0, 10.2)
    assert expert_decision(g, right, left, 0.5) == "CL"
    assert expert_decision(g, left, EgoState(1.0, 50.0, 0.0, 0.0, 11.0), 0.5) == "AR"
    assert expert_decision(g, right, EgoState(0.5, 41.0, 0.0, 0.0, 0.2), 0.5) == "SK"


def test_frames_file_round_trip_and_errors(tmp_path):
    frames = list(scenario_frames(junction_scenario(), rate=2.0))
    path = tmp_path / "frames.jsonl"
    assert write_frames(frames, path) == 7
    back = read_frames(path)
    assert [f.id for f in back] == [f.id for f in frames]
    assert [f.scene for f in back] == [f.scene for f in frames]
    lines = path.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(FrameError, match=r"bad.jsonl:2: duplicate frame id"):
        read_frames(bad)
    rec = json.loads(lines[1])
    rec["scene"]["road_section"] = "Roundabout"
    bad.write_text(lines[0] + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(FrameError, match=r"bad.jsonl:2: invalid scene record"):
        read_frames(bad)
    bad.write_text("{oops\n")
    with pytest.raises(FrameError, match=r"bad.jsonl:1: not JSON"):
        read_frames(bad)
    with pytest.raises(FrameError, match="positive"):
        list(scenario_frames(junction_scenario(), rate=0.0))

    def failing():
        yield frames[0]
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError):
        write_frames(failing(), path)
    assert len(read_frames(path)) == 7  # the good file was not replaced by a partial one
    assert not list(tmp_path.glob("*.tmp*"))


def test_frames_command_from_scenario_files_and_suites(tmp_path, capsys):
    fmt = pytest.importorskip("luna_bridge.scenarios.format")
    from luna_offline.cli import main

    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("s-one", "s-two"):
        fmt.save_scenario(junction_scenario(name), suite / f"{name}.json")
    out = tmp_path / "frames.jsonl"
    assert main(["frames", "--suite", str(suite), "--rate", "1", "--out", str(out)]) == 0
    frames = read_frames(out)
    assert len(frames) == 8 and {f.scenario for f in frames} == {"s-one", "s-two"}
    assert frames[0].origin["suite"] == str(suite) and frames[0].origin["file"].endswith("s-one.json")
    assert math.isclose(frames[1].time - frames[0].time, 1.0)
    # A broken file is reported and skipped (exit code 1); the good scenarios still give frames.
    (suite / "s-zero.json").write_text('{"format": "luna-scenario"}')
    single = ["--scenario", str(suite / "s-one.json")]
    assert main(["frames", "--suite", str(suite), *single, "--out", str(out)]) == 1
    assert len(read_frames(out)) == 2 * 7  # s-one once: a second copy would repeat frame ids
    err = capsys.readouterr().err
    assert "skipped " + str(suite / "s-zero.json") in err and "'s-one' already taken" in err
    with pytest.raises(SystemExit, match="--threads must be at least 1, got 0"):
        main(["frames", *single, "--threads", "0", "--out", str(out)])


def test_frames_command_resumes_an_interrupted_run_and_takes_every_nth_scenario(tmp_path, capsys):
    fmt = pytest.importorskip("luna_bridge.scenarios.format")
    from luna_bridge.scenarios.registry import suite_refs
    from luna_offline.cli import main
    from luna_offline.frames import FrameJournal

    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("s-one", "s-three", "s-two"):
        fmt.save_scenario(junction_scenario(name), suite / f"{name}.json")
    out = tmp_path / "frames.jsonl"
    # An interrupted run: s-one finished, s-three torn halfway through its first line.
    journal = FrameJournal(out)
    first = suite_refs(str(suite))[0][1]
    assert journal.add(first, "s-one", scenario_frames(junction_scenario("s-one"), rate=1.0)) == 4
    with journal.partial.open("a", encoding="utf-8") as f:
        f.write('{"id": "s-three@0000.00", "scen')
    (suite / "s-one.json").write_text("not a scenario")  # finished: the rerun must not read it again
    assert main(["frames", "--suite", str(suite), "--rate", "1", "--out", str(out)]) == 0
    frames = read_frames(out)
    assert [f.scenario for f in frames] == ["s-one"] * 4 + ["s-three"] * 4 + ["s-two"] * 4
    assert "resuming" in capsys.readouterr().err
    assert not (tmp_path / "frames.jsonl.partial").exists() and not (tmp_path / "frames.jsonl.progress").exists()

    fmt.save_scenario(junction_scenario("s-one"), suite / "s-one.json")
    assert main(["frames", "--suite", str(suite), "--rate", "1", "--every", "2", "--out", str(out)]) == 0
    assert sorted({f.scenario for f in read_frames(out)}) == ["s-one", "s-two"]  # 1st and 3rd by name
