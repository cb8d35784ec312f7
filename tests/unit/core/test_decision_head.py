"""The decision-probability head on h_{i*} alone (Eq. 16) and beside the scene vector xi_t
(``StudentConfig.head_scene_dim``): its input checks, its standardisation and its saved state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core.scene import (HEAD_SCENE_PARTS, HEAD_SCENE_VALUES_DIM, SCENE_TIMING_DIM, SCENE_VECTOR_DIM,
                             SCENE_VECTOR_EGO_ROAD_DIM)
from luna_core.student import SceneVectorError, StudentConfig, StudentConfigError
from luna_core.student.head import DecisionHead
from luna_core.student.model import decision_head, scene_tensor


def test_a_head_on_h_alone_ignores_no_input_and_has_no_scene_state():
    head = DecisionHead(8, 16, 10)
    assert head(torch.zeros(2, 8)).shape == (2, 10)
    assert set(head.state_dict()) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}


def test_a_scene_head_standardises_the_vector_with_its_training_rows_and_saves_the_scale():
    torch.manual_seed(0)
    head = DecisionHead(4, 16, 10, scene_dim=3)
    rows = torch.tensor([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 6.0]])  # the middle feature is constant
    head.set_scene_normalisation(rows)
    assert torch.allclose(head.scene_mean, torch.tensor([3.0, 5.0, 4.0]))
    assert torch.allclose(head.scene_scale, torch.tensor([2.0, 1.0, 2.0]))  # constant: scale 1, not 0
    h = torch.randn(3, 4)
    z = (rows - head.scene_mean) / head.scene_scale
    assert torch.allclose(head(h, rows), head.net(torch.cat([h, z], dim=1)))
    # One scene vector serves a batch of states (the vector is broadcast).
    assert torch.allclose(head(h, rows[0]), head.net(torch.cat([h, z[:1].expand(3, 3)], dim=1)))
    copy = DecisionHead(4, 16, 10, scene_dim=3)
    copy.load_state_dict(head.state_dict())  # the standardisation travels with the weights
    assert torch.equal(copy(h, rows), head(h, rows))
    with pytest.raises(ValueError, match="reads the scene vector .3 values. beside h_i.: pass scene"):
        head(h)
    with pytest.raises(ValueError, match="scene vector of 2 values, the head reads 3"):
        head(h, rows[:, :2])


def test_scene_tensor_names_a_missing_short_or_non_finite_vector():
    plain, fused = StudentConfig(), StudentConfig(head_scene_dim=SCENE_VECTOR_DIM)
    assert scene_tensor(plain, None, torch.device("cpu")) is None
    assert scene_tensor(plain, np.ones(3), torch.device("cpu")) is None  # a head on h alone ignores it
    v = scene_tensor(fused, np.arange(SCENE_VECTOR_DIM, dtype=np.float64), torch.device("cpu"))
    assert v.dtype == torch.float32 and v.shape == (SCENE_VECTOR_DIM,)
    with pytest.raises(SceneVectorError, match=f"reads {SCENE_VECTOR_DIM} scene values .* pass scene_vector"):
        scene_tensor(fused, None, torch.device("cpu"))
    with pytest.raises(SceneVectorError,
                       match=f"expected {SCENE_VECTOR_DIM} or {HEAD_SCENE_VALUES_DIM} finite values, got 5"):
        scene_tensor(fused, np.ones(5), torch.device("cpu"))
    # A head on the ego-and-road part takes the whole xi_t and reads its leading values.
    part = scene_tensor(StudentConfig(head_scene_dim=SCENE_VECTOR_EGO_ROAD_DIM),
                        np.arange(SCENE_VECTOR_DIM, dtype=np.float64), torch.device("cpu"))
    assert torch.equal(part, torch.arange(SCENE_VECTOR_EGO_ROAD_DIM, dtype=torch.float32))
    with pytest.raises(SceneVectorError, match=f"finite values, got {SCENE_VECTOR_EGO_ROAD_DIM}"):
        scene_tensor(fused, np.ones(SCENE_VECTOR_EGO_ROAD_DIM), torch.device("cpu"))
    # The timing part reads the ego-and-road values and the objects' timing after xi_t, so it needs them all.
    timing = StudentConfig(head_scene_dim=SCENE_VECTOR_EGO_ROAD_DIM + SCENE_TIMING_DIM)
    values = np.arange(HEAD_SCENE_VALUES_DIM, dtype=np.float64)
    expected = np.r_[values[:SCENE_VECTOR_EGO_ROAD_DIM], values[SCENE_VECTOR_DIM:]]
    assert torch.equal(scene_tensor(timing, values, torch.device("cpu")), torch.from_numpy(expected).float())
    with pytest.raises(SceneVectorError,
                       match=f"expected {HEAD_SCENE_VALUES_DIM} finite values, got {SCENE_VECTOR_DIM}"):
        scene_tensor(timing, np.ones(SCENE_VECTOR_DIM), torch.device("cpu"))
    bad = np.ones(SCENE_VECTOR_DIM)
    bad[3] = np.nan
    with pytest.raises(SceneVectorError, match="with NaN or inf"):
        scene_tensor(fused, bad, torch.device("cpu"))


def test_a_head_trained_on_another_scene_vector_layout_is_refused():
    with pytest.raises(StudentConfigError, match="head_scene_dim: must be an integer >= 0"):
        StudentConfig(head_scene_dim=-1)
    assert decision_head(StudentConfig(head_scene_dim=SCENE_VECTOR_DIM), 8).scene_dim == SCENE_VECTOR_DIM
    ego_road = StudentConfig(head_scene_dim=SCENE_VECTOR_EGO_ROAD_DIM)
    assert decision_head(ego_road, 8).scene_dim == SCENE_VECTOR_EGO_ROAD_DIM
    for name, part in HEAD_SCENE_PARTS.items():
        assert decision_head(StudentConfig(head_scene_dim=len(part)), 8).scene_dim == len(part), name
    assert len({len(p) for p in HEAD_SCENE_PARTS.values()}) == len(HEAD_SCENE_PARTS)  # a length names its part
    with pytest.raises(StudentConfigError, match="trained on 7 scene values; .* 97 in 'all'"):
        decision_head(StudentConfig(head_scene_dim=7), 8)
