"""benchmarks/teacher_timeline.py: a collect run's labels beside the frames they label, one line per frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from luna_offline.collect import RECORDS
from luna_offline.frames import scenario_frames, write_frames
from tests.benchmark_scripts import load_benchmark
from tests.unit.offline.test_frames import junction_scenario


def _record(frame: str, distribution: list[float], outcomes: dict, ok: bool = True) -> dict:
    return {"frame": frame, "ok": ok, "reason": "" if ok else "teacher timed out",
            "distribution": distribution, "outcomes": outcomes}


def test_timeline_reads_labels_beside_their_frames(tmp_path: Path) -> None:
    frames = list(scenario_frames(junction_scenario(), rate=2.0))
    write_frames(frames, tmp_path / "frames.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    ak = [1.0] + [0.0] * 9
    mixed = [0.0] * 10
    mixed[3], mixed[6], mixed[9] = 0.5, 0.3, 0.2  # CK, DK, SK
    records = [
        _record(frames[0].id, ak, {"AK": {"score": 0.93}, "SK": {"score": 0.0, "issue": "too little progress"}}),
        _record(frames[1].id, mixed, {"AK": {"score": 0.0, "issue": "hits a red light in 2.0 s"}}),
        _record(frames[2].id, ak, {}, ok=False),
    ]
    (run / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))

    lines = load_benchmark("teacher_timeline").timeline(tmp_path / "frames.jsonl", run, ["AK", "SK"], objects=1)

    assert len(lines) == len(frames)
    assert lines[0].startswith("junction-test   0.0 s  v 8.00 m/s  recent CK/CK  light red 30.0 m ahead  "
                               "[lead vehicle 18.5 m same lane]")
    assert lines[0].endswith("| teacher AK 1.00  | AK 0.93; SK 0.00 (too little progress)")
    assert "| teacher CK 0.50 DK 0.30 SK 0.20  | AK 0.00 (hits a red light in 2.0 s)" in lines[1]
    assert lines[2].endswith("| failed: teacher timed out")
    assert all(line.endswith("| not labelled") for line in lines[3:])
    assert "recent DK/DK" in lines[3]  # the descriptor's own recent decisions, as the student saw them


def test_timeline_names_a_missing_run_and_a_bad_record(tmp_path: Path) -> None:
    write_frames(list(scenario_frames(junction_scenario(), rate=2.0)), tmp_path / "frames.jsonl")
    script = load_benchmark("teacher_timeline")
    with pytest.raises(SystemExit, match="records.jsonl does not exist"):
        script.timeline(tmp_path / "frames.jsonl", tmp_path / "nowhere", ["AK"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RECORDS).write_text('{"ok": true}\n')
    with pytest.raises(SystemExit, match=r"records.jsonl:1: not a collect record"):
        script.timeline(tmp_path / "frames.jsonl", tmp_path / "run", ["AK"])
