"""An ensemble of decision heads on one h_{i*} (``HeadEnsemble``, ``StudentConfig.head_members``): pi_hat is
the mean of the members' distributions, each member reads its own part of the scene values, and
``save_head_ensemble`` / ``luna-offline ensemble`` combine saved students (real SmolLM2 base) only where
they share the base and the adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from luna_core.scene import HEAD_SCENE_PARTS, HEAD_SCENE_VALUES_DIM, item_head_values
from luna_core.student import DualHeadStudent, StudentConfig, StudentConfigError, StudentModelFileError, files
from luna_core.student.ensemble import save_head_ensemble
from luna_core.student.head import DecisionHead, HeadEnsemble
from luna_core.student.model import decision_head, load_decision_head
from luna_offline.cli import main as offline_main
from tests.unit.core.test_student_support import PROMPTS, memory_item

torch.set_num_threads(1)  # the CI machine is shared: one thread avoids OpenMP spin under contention
TIMING = len(HEAD_SCENE_PARTS["ego-road-timing"])


def test_the_ensemble_is_the_mean_of_its_members_distributions_each_on_its_part():
    torch.manual_seed(0)
    ensemble = HeadEnsemble(8, 16, 10, [0, TIMING])
    assert ensemble.scene_dim == HEAD_SCENE_VALUES_DIM
    h, values = torch.randn(3, 8), torch.randn(3, HEAD_SCENE_VALUES_DIM)
    plain, timing = ensemble.members
    expected = (torch.softmax(plain(h), -1)
                + torch.softmax(timing(h, values[:, list(HEAD_SCENE_PARTS["ego-road-timing"])]), -1)) / 2
    assert torch.allclose(torch.softmax(ensemble(h, values), -1), expected, atol=1e-6)
    with pytest.raises(ValueError, match=f"reads {HEAD_SCENE_VALUES_DIM} scene values beside h_i., got none"):
        ensemble(h)
    with pytest.raises(ValueError, match="got 5 values"):
        ensemble(h, values[:, :5])
    heads_alone = HeadEnsemble(8, 16, 10, [0, 0])  # members on h_i* alone: the ensemble reads no scene values
    assert heads_alone.scene_dim == 0 and heads_alone(h).shape == (3, 10)
    with pytest.raises(ValueError, match="at least 2 heads, got 1"):
        HeadEnsemble(8, 16, 10, [0])


def test_the_config_names_an_ensemble_that_does_not_add_up():
    config = StudentConfig(head_members=[0, TIMING], head_scene_dim=HEAD_SCENE_VALUES_DIM)
    assert isinstance(decision_head(config, 8), HeadEnsemble)
    assert StudentConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(StudentConfigError, match="head_members: must be empty .* at least 2 integers"):
        StudentConfig(head_members=[TIMING], head_scene_dim=HEAD_SCENE_VALUES_DIM)
    with pytest.raises(StudentConfigError,
                       match=f"head_scene_dim: an ensemble .* reads {HEAD_SCENE_VALUES_DIM}, got 0"):
        StudentConfig(head_members=[0, TIMING])
    with pytest.raises(StudentConfigError, match="head_members: a head was trained on 7 scene values"):
        decision_head(StudentConfig(head_members=[0, 7], head_scene_dim=HEAD_SCENE_VALUES_DIM), 8)


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> tuple[Path, Path]:
    """Two saved students on one adapter: a head on h_i* alone, and one that reads the ego, road and timing
    values (the bundled student and session 39's ``egot`` in small)."""
    torch.manual_seed(3)
    student = DualHeadStudent.from_base(StudentConfig(device="cpu"), PROMPTS)
    with torch.no_grad():
        for name, p in student.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)  # the adapter must matter: the members share it
    root = tmp_path_factory.mktemp("ensemble")
    plain = student.save_pretrained(root / "plain")
    timing = root / "timing"
    shutil.copytree(plain, timing)
    head = DecisionHead(student.lm.config.hidden_size, StudentConfig().head_hidden, 10, TIMING)
    head.set_scene_normalisation(torch.stack([torch.from_numpy(item_head_values(memory_item(i))).float()
                                              [list(HEAD_SCENE_PARTS["ego-road-timing"])] for i in range(6)]))
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(timing / files.HEAD_FILE))
    config = StudentConfig.load(plain / files.CONFIG_FILE)
    config.head_scene_dim = TIMING
    config.save(timing / files.CONFIG_FILE)
    files.write_meta(timing, files.read_meta(plain)["base_model_hash"], config.base_model, head.d_model)
    return plain, timing


def test_a_saved_ensemble_predicts_the_mean_of_its_members_from_one_pass(members, tmp_path):
    plain, timing = members
    (timing / files.ADAPTER_FILE).unlink()  # a head saved alone names its adapter by checksum only
    out = save_head_ensemble([plain, timing], tmp_path / "ensemble")
    shutil.copyfile(plain / files.ADAPTER_FILE, timing / files.ADAPTER_FILE)
    config = StudentConfig.load(out / files.CONFIG_FILE)
    assert config.head_members == [0, TIMING] and config.head_scene_dim == HEAD_SCENE_VALUES_DIM
    students = [DualHeadStudent.from_pretrained(d, PROMPTS, device="cpu") for d in (plain, timing, out)]
    for i in range(3):
        item = memory_item(i)
        values = item_head_values(item)
        p_plain, p_timing, p_ensemble = (s.predict(item.query, [memory_item(4)], scene_vector=values)[0]
                                         for s in students)
        assert np.abs(p_plain - p_timing).max() > 1e-3  # the members differ, so the mean is a test
        np.testing.assert_allclose(p_ensemble, (p_plain + p_timing) / 2, atol=1e-6)
    # Its head alone (scoring on cached h_i*) is the same module.
    head = load_decision_head(out)
    assert isinstance(head, HeadEnsemble) and head.scene_dim == HEAD_SCENE_VALUES_DIM


def test_only_students_on_the_same_adapter_form_an_ensemble(members, tmp_path, capsys):
    plain, timing = members
    other = tmp_path / "other"
    shutil.copytree(timing, other)
    adapter = DualHeadStudent.from_pretrained(plain, PROMPTS, device="cpu").merged.state
    save_file({k: v + 1.0 for k, v in adapter.items()}, str(other / files.ADAPTER_FILE))
    files.write_meta(other, files.read_meta(timing)["base_model_hash"], "smollm2-135m-instruct",
                     files.read_meta(timing)["d_model"])
    with pytest.raises(StudentModelFileError, match=f"{other}: its adapter differs from {plain}'s"):
        save_head_ensemble([plain, other], tmp_path / "bad")
    with pytest.raises(StudentModelFileError, match="at least 2 students, got 1"):
        save_head_ensemble([plain], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    # The command line: an ensemble is written, and one cannot be a member of another.
    assert offline_main(["ensemble", "--students", str(plain), str(timing), "--out", str(tmp_path / "ens")]) == 0
    assert "2 heads ->" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="already an ensemble of heads"):
        offline_main(["ensemble", "--students", str(tmp_path / "ens"), str(plain), "--out", str(tmp_path / "x")])
