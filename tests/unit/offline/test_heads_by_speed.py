"""benchmarks/heads_by_speed.py: a saved head read against the teacher per ego-speed band, from a feature
cache and the (xz-compressed) frames its items were labelled from."""

from __future__ import annotations

import dataclasses
import lzma
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from luna_core.student import StudentConfig, files
from luna_core.student.head import DecisionHead
from luna_core.types import ACTION_CODES
from luna_offline.distill_head import _write_shard
from luna_offline.frames import scenario_frames, write_frames
from tests.benchmark_scripts import load_benchmark
from tests.unit.offline.test_frames import junction_scenario

D_MODEL = 4


def one_hot(code: str) -> np.ndarray:
    target = np.zeros(len(ACTION_CODES), dtype=np.float32)
    target[ACTION_CODES.index(code)] = 1.0
    return target


def always(code: str) -> DecisionHead:
    """A head that ranks ``code`` first whatever h_{i*} is (zero weights, a bias)."""
    head = DecisionHead(D_MODEL, hidden=8)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        head.net[2].bias[ACTION_CODES.index(code)] = 3.0
    return head


def save_student(folder: Path, head: DecisionHead, scene_dim: int = 0) -> Path:
    """A student folder holding what ``load_decision_head`` reads: the head, its config and the meta (an empty
    adapter file stands in for the adapter the meta names)."""
    folder.mkdir()
    save_file(head.state_dict(), str(folder / "head.safetensors"))
    save_file({}, str(folder / "adapter.safetensors"))
    StudentConfig(head_scene_dim=scene_dim, head_hidden=8).save(folder / "student_config.json")
    files.write_meta(folder, "no base", "smollm2-135m-instruct", D_MODEL)
    return folder


def test_bands_split_rows_by_ego_speed_and_name_what_a_head_says_where_the_teacher_says_ak(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frames = list(scenario_frames(junction_scenario(), rate=2.0))[:6]
    speeds = [0.3, 0.6, 2.0, 4.0, 7.0, 9.0]  # m/s: two rows per band
    teacher = ["AK", "CK", "AK", "AK", "CK", "CK"]
    frames = [dataclasses.replace(f, scene=dataclasses.replace(f.scene, ego_speed=v)) for f, v in zip(frames, speeds)]
    write_frames(frames, tmp_path / "frames.jsonl")
    (tmp_path / "frames.jsonl.xz").write_bytes(lzma.compress((tmp_path / "frames.jsonl").read_bytes()))
    features = tmp_path / "features"
    features.mkdir()
    _write_shard(features, "heldout", 0, [torch.zeros(D_MODEL)] * len(frames), [one_hot(c) for c in teacher],
                 [(f.id, 0) for f in frames])
    student = save_student(tmp_path / "ck", always("CK"))

    script = load_benchmark("heads_by_speed")
    assert script.main(["--features", str(features), "--frames", str(tmp_path / "frames.jsonl.xz"),
                        "--student", f"ck={student}"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("heldout rows, 6")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table if line.startswith("| [") or
            line.startswith("| >=")}
    assert list(rows) == ["[0, 1)", "[1, 5)", ">= 5"]
    assert rows["[0, 1)"][1:3] == ["2", "AK 50 %, CK 50 %"] and rows["[0, 1)"][3].startswith("50.0 / ")
    assert rows["[0, 1)"][4].startswith("CK 100 % (1)")
    assert rows["[1, 5)"][3].startswith("0.0 / ") and rows["[1, 5)"][4].startswith("CK 100 % (2)")
    assert rows[">= 5"][3].startswith("100.0 / ") and rows[">= 5"][4].startswith("- (0)")

    # The same rows read directly: a head that says AK agrees where the teacher does.
    hidden = torch.zeros(len(frames), D_MODEL)
    target = torch.tensor(np.stack([one_hot(c) for c in teacher]))
    log_q = {name: script.head_log_probs(always(code), hidden) for name, code in (("ak", "AK"), ("ck", "CK"))}
    bands = script.read_bands(log_q, target, speeds)
    assert [(b.name, b.rows) for b in bands] == [("[0, 1)", 2), ("[1, 5)", 2), (">= 5", 2)]
    assert [b.readings["ak"].accuracy for b in bands] == [0.5, 1.0, 0.0]
    assert [b.readings["ck"].accuracy for b in bands] == [0.5, 0.0, 1.0]
    assert bands[1].readings["ak"].top_where_teacher == {"AK": 2}
    assert bands[1].readings["ak"].kl < bands[1].readings["ck"].kl
    # Another focus action: where the teacher says CK (the fast rows), the AK head ranks AK first.
    bands = script.read_bands(log_q, target, speeds, focus="CK")
    assert bands[2].readings["ak"].top_where_teacher == {"AK": 2}
    assert bands[2].readings["ck"].top_where_teacher == {"CK": 2}
    assert not bands[1].readings["ak"].top_where_teacher  # no CK row in [1, 5)
    assert "ak: top where the teacher's is CK" in script.markdown(bands, "CK").splitlines()[0]


def test_a_row_without_its_frame_is_named(tmp_path: Path) -> None:
    frames = list(scenario_frames(junction_scenario(), rate=2.0))[:2]
    write_frames(frames[:1], tmp_path / "frames.jsonl")
    features = tmp_path / "features"
    features.mkdir()
    _write_shard(features, "heldout", 0, [torch.zeros(D_MODEL)] * 2, [one_hot("CK")] * 2,
                 [(f.id, 0) for f in frames])
    student = save_student(tmp_path / "ck", always("CK"))
    with pytest.raises(SystemExit, match=f"no frame for 1 cached row.*{re.escape(frames[1].id)}"):
        load_benchmark("heads_by_speed").main(["--features", str(features), "--frames", str(tmp_path / "frames.jsonl"),
                                               "--student", f"ck={student}"])


def test_trees_column_is_the_baselines_trees_trained_on_the_banks_training_split(tmp_path: Path) -> None:
    """The top action of these items follows the ego speed (a function of the scene vector): trees trained
    on the bank's training split read it back from scene descriptors of the same speeds."""
    from luna_core.memory import MemoryBank, SceneVectorEmbedder
    from tests.unit.core.test_student_support import scene
    from tests.unit.offline.test_baselines import items

    data = items()
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder()) as bank:
        bank.append_many(data)
    speeds = [5.0 + i for i in range(len(data))]  # memory_item(i)'s ego speed
    log_q = load_benchmark("heads_by_speed").trees_log_probs(tmp_path / "bank", [scene(1, speed=v) for v in speeds])
    assert log_q.shape == (len(data), len(ACTION_CODES)) and torch.isfinite(log_q).all()
    tops = [ACTION_CODES[i] for i in log_q.argmax(-1).tolist()]
    # the scene vector clips the speed at 40 m/s (2 x 20): only the rows below it are told apart
    told = [(t, it) for t, it, v in zip(tops, data, speeds) if v < 40.0]
    agree = sum(t == ACTION_CODES[int(np.argmax(it.distribution))] for t, it in told) / len(told)
    assert agree > 0.8


def test_a_head_that_reads_the_scene_vector_gets_each_rows_from_its_frame(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A head whose AK logit grows with the ego speed in xi_t: it ranks AK first only on the fast rows, so
    the table can only come out this way if the rows' own scene vectors reached it."""
    from luna_core.scene import SCENE_VECTOR_DIM, scene_vector

    frames = list(scenario_frames(junction_scenario(), rate=2.0))[:4]
    speeds = [0.5, 0.8, 8.0, 9.0]
    frames = [dataclasses.replace(f, scene=dataclasses.replace(f.scene, ego_speed=v)) for f, v in zip(frames, speeds)]
    write_frames(frames, tmp_path / "frames.jsonl")
    features = tmp_path / "features"
    features.mkdir()
    _write_shard(features, "heldout", 0, [torch.zeros(D_MODEL)] * 4, [one_hot("AK")] * 4, [(f.id, 0) for f in frames])
    # the ego-speed entry of xi_t: the one that moves between two descriptors differing only in speed
    slow, fast = (scene_vector(dataclasses.replace(frames[0].scene, ego_speed=v)) for v in (0.0, 10.0))
    speed_entry = int(np.argmax(np.abs(fast - slow)))
    head = DecisionHead(D_MODEL, hidden=8, scene_dim=SCENE_VECTOR_DIM)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        head.net[0].weight[0, D_MODEL + speed_entry] = 1.0  # hidden unit 0 = the speed feature
        head.net[2].weight[ACTION_CODES.index("AK"), 0] = 100.0
        head.net[2].bias[ACTION_CODES.index("AK")] = -2.0
        head.net[2].bias[ACTION_CODES.index("CK")] = 1.0
    student = save_student(tmp_path / "xi", head, SCENE_VECTOR_DIM)

    assert load_benchmark("heads_by_speed").main(["--features", str(features), "--frames", str(tmp_path / "frames.jsonl"),
                                                  "--student", f"xi={student}"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| [", "| >="))}
    assert rows["[0, 1)"][4].startswith("CK 100 % (2)")  # slow: the speed feature is too small for AK
    assert rows[">= 5"][4].startswith("AK 100 % (2)")
