"""Unit tests of the batched SAT collision checker (luna_core.geometry, LUNA-AD Algorithm 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from luna_core import geometry
from luna_core.geometry import (TOUCH_TOLERANCE, GeometryError, boxes_overlap, colliding_objects,
                                pairwise_overlaps, proposals_vs_objects)
from luna_core.types import box_corners

torch.set_num_threads(2)


def _box(x: float, y: float, heading: float = 0.0, length: float = 4.0, width: float = 2.0) -> np.ndarray:
    return box_corners(x, y, heading, length, width)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_touching_counts_as_overlap_and_gap_beyond_tolerance_does_not(backend: str) -> None:
    a = _box(0.0, 0.0)
    assert boxes_overlap(a, _box(4.0, 0.0), backend=backend)  # edges touch
    assert boxes_overlap(a, _box(4.0 + 0.5 * TOUCH_TOLERANCE, 0.0), backend=backend)
    assert not boxes_overlap(a, _box(4.0 + 2.0 * TOUCH_TOLERANCE, 0.0), backend=backend)
    assert not boxes_overlap(a, _box(0.0, 2.01), backend=backend)


def test_rotated_boxes_separated_only_on_a_diagonal_axis() -> None:
    # A 45-degree square whose corner points at the corner of an axis-aligned square: the projections
    # on both axes of the first box overlap, only the second box's axes separate them.
    a = _box(0.0, 0.0, 0.0, 2.0, 2.0)
    r = math.sqrt(2.0)
    near = _box(1.0 + r / 2 + 0.3, 1.0 + r / 2 + 0.3, math.pi / 4, 2.0, 2.0)
    far_x = _box(1.0 + r + 0.05, 0.0, math.pi / 4, 2.0, 2.0)
    assert not boxes_overlap(a, near)
    assert not boxes_overlap(a, far_x)
    assert boxes_overlap(a, _box(1.0 + r - 0.05, 0.0, math.pi / 4, 2.0, 2.0))


def test_nested_boxes_overlap() -> None:
    assert boxes_overlap(_box(0, 0, 0.3, 10, 6), _box(0.5, 0.2, 1.2, 1, 0.5))
    assert boxes_overlap(_box(0.5, 0.2, 1.2, 1, 0.5), _box(0, 0, 0.3, 10, 6))


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_degenerate_boxes_segments_and_points(backend: str) -> None:
    seg = _box(0.0, 0.0, 0.0, 2.0, 0.0)
    # Collinear segments: only the along-segment axis separates them (edge normals would not).
    assert not boxes_overlap(seg, _box(2.5, 0.0, 0.0, 2.0, 0.0), backend=backend)
    assert boxes_overlap(seg, _box(1.9, 0.0, 0.0, 2.0, 0.0), backend=backend)
    # Zero length instead of zero width: the same segment along y.
    assert not boxes_overlap(_box(0, 0, 0, 0.0, 2.0), _box(0, 2.5, 0, 0.0, 2.0), backend=backend)
    assert boxes_overlap(_box(0, 0, 0, 0.0, 2.0), _box(0, 1.9, 0, 0.0, 2.0), backend=backend)
    assert not boxes_overlap(_box(0, 0, 0, 0.0, 2.0), _box(0.5, 0, 0, 0.0, 2.0), backend=backend)
    # Boxes wider than long (the longer edge is the second one).
    assert boxes_overlap(_box(0, 0, 0, 1.0, 6.0), _box(0, 3.5, 0, 1.0, 1.0), backend=backend)
    assert not boxes_overlap(_box(0, 0, 0, 1.0, 6.0), _box(1.5, 0, 0, 1.0, 1.0), backend=backend)
    # Crossing segments and a segment through a box.
    assert boxes_overlap(seg, _box(0.0, 0.0, math.pi / 2, 2.0, 0.0), backend=backend)
    assert boxes_overlap(_box(0, 0, 0.7, 20.0, 0.0), _box(0, 0), backend=backend)
    point = _box(1.0, 0.0, 0.0, 0.0, 0.0)
    assert boxes_overlap(point, seg, backend=backend)  # the point is the segment's end
    assert not boxes_overlap(point, _box(1.0, 0.01, 0.0, 0.0, 0.0), backend=backend)
    assert boxes_overlap(point, _box(1.0, 0.0, 0.0, 0.0, 0.0), backend=backend)
    assert boxes_overlap(_box(2.0, 1.0, 0, 0, 0), _box(0, 0), backend=backend)  # on a corner
    assert not boxes_overlap(_box(2.0, 1.01, 0, 0, 0), _box(0, 0), backend=backend)


def test_far_from_origin_keeps_millimetre_accuracy() -> None:
    # UTM-like coordinates: float32 alone would round these to ~3 cm; re-centring keeps the tolerance.
    x0, y0 = 512_345.678, 5_403_210.987
    a = _box(x0, y0, 0.4)
    touching = _box(x0 + 4.0 * math.cos(0.4), y0 + 4.0 * math.sin(0.4), 0.4)
    gap = _box(x0 + 4.005 * math.cos(0.4), y0 + 4.005 * math.sin(0.4), 0.4)
    assert boxes_overlap(a, touching)
    assert not boxes_overlap(a, gap)
    boxes = np.stack([a, touching, gap])[:, None]  # (3, T=1, 4, 2)
    assert colliding_objects(boxes).tolist() == [1]


def _scripted_window(steps: int = 10) -> np.ndarray:
    """Ego driving +x at 1 m/step; object 1 far ahead, 2 crosses the path late, 3 parked beside."""
    t = np.arange(steps, dtype=np.float64)
    ego = box_corners(t, 0.0, 0.0, 4.6, 1.9)
    far = box_corners(100.0 + t, 0.0, 0.0, 4.6, 1.9)
    crossing = box_corners(np.full(steps, 9.0), 12.0 - 1.5 * t, np.pi / 2, 4.6, 1.9)
    parked = box_corners(5.0 + 0 * t, 3.0, 0.0, 4.6, 1.9)
    return np.stack([ego, far, crossing, parked])


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_algorithm1_returns_colliding_indices_over_the_window(backend: str) -> None:
    boxes = _scripted_window()
    idx = colliding_objects(boxes, backend=backend)
    assert isinstance(idx, np.ndarray) and idx.dtype == np.int64
    assert idx.tolist() == [2]
    assert colliding_objects(torch.from_numpy(boxes), backend=backend).tolist() == [2]
    # Only the first steps: the crossing object has not arrived yet.
    assert colliding_objects(boxes[:, :3], backend=backend).tolist() == []


def test_algorithm1_edge_cases() -> None:
    boxes = _scripted_window()
    assert colliding_objects(boxes[:1]).tolist() == []  # ego only (Algorithm 1, line 1)
    assert colliding_objects(boxes[:, :0]).tolist() == []  # empty window
    with pytest.raises(GeometryError, match="N_obj, T, 4, 2"):
        colliding_objects(boxes[0])


def test_validity_mask_ignores_unobserved_steps_even_with_nan() -> None:
    boxes = _scripted_window()
    valid = np.ones(boxes.shape[:2], dtype=bool)
    valid[2, 6:] = False  # the crossing object is unobserved when it would collide
    boxes[2, 6:] = np.nan
    assert colliding_objects(boxes, valid).tolist() == []
    valid[2, 6:] = True
    with pytest.raises(GeometryError, match=r"non-finite .* box index \(2, 6\)"):
        colliding_objects(boxes, valid)


def test_bad_shapes_and_non_rectangles_are_rejected_with_the_argument_name() -> None:
    good = _box(0, 0)
    with pytest.raises(GeometryError, match=r"a: expected corners of shape"):
        boxes_overlap(good[:3], good)
    skewed = good.copy()
    skewed[1] += 0.5  # no longer a rectangle
    with pytest.raises(GeometryError, match="b: corners at box index .* rectangle"):
        boxes_overlap(good, skewed)
    reordered = good[[0, 2, 1, 3]]  # self-intersecting order
    with pytest.raises(GeometryError, match="rectangle"):
        boxes_overlap(reordered, good)
    with pytest.raises(GeometryError, match="same T"):
        proposals_vs_objects(np.zeros((2, 3, 4, 2)), np.zeros((2, 4, 4, 2)))
    with pytest.raises(GeometryError, match="validity mask shape"):
        colliding_objects(_scripted_window(), np.ones((2, 2), dtype=bool))


def _random_trajectories(rng: np.random.Generator, n: int, steps: int, spread: float) -> np.ndarray:
    x = rng.uniform(-spread, spread, (n, 1)) + np.cumsum(rng.normal(0, 0.5, (n, steps)), 1)
    y = rng.uniform(-spread, spread, (n, 1)) + np.cumsum(rng.normal(0, 0.5, (n, steps)), 1)
    h = rng.uniform(-np.pi, np.pi, (n, 1)) + np.cumsum(rng.normal(0, 0.1, (n, steps)), 1)
    length = rng.uniform(0.5, 6.0, (n, 1)) * np.ones((1, steps))
    width = rng.uniform(0.5, 2.5, (n, 1)) * np.ones((1, steps))
    return box_corners(x, y, h, length, width)


def test_all_forms_agree_with_elementwise_check_and_between_backends() -> None:
    rng = np.random.default_rng(7)
    boxes = _random_trajectories(rng, 12, 5, 8.0)
    pairs = pairwise_overlaps(boxes)
    assert isinstance(pairs, np.ndarray) and pairs.shape == (12, 12, 5)
    assert pairs.any() and not pairs.all()  # the scene has both outcomes
    expected = boxes_overlap(boxes[:, None], boxes[None])
    np.fill_diagonal(expected[..., 0], False)
    for k in range(1, 5):
        np.fill_diagonal(expected[..., k], False)
    np.testing.assert_array_equal(pairs, expected)
    np.testing.assert_array_equal(pairs, pairs.transpose(1, 0, 2))
    np.testing.assert_array_equal(pairwise_overlaps(boxes, backend="numpy"), pairs)
    np.testing.assert_array_equal(pairwise_overlaps(boxes, backend="torch", device="cpu"), pairs)
    props = proposals_vs_objects(boxes[:4], boxes[4:])
    np.testing.assert_array_equal(props, pairs[:4, 4:])
    ego_hits = np.nonzero(pairs[0, 1:].any(-1))[0] + 1
    np.testing.assert_array_equal(colliding_objects(boxes), ego_hits)


def test_torch_in_tensor_out_on_the_input_device() -> None:
    rng = np.random.default_rng(3)
    props = torch.from_numpy(_random_trajectories(rng, 6, 4, 5.0))
    objs = torch.from_numpy(_random_trajectories(rng, 5, 4, 5.0))
    out = proposals_vs_objects(props, objs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bool and out.device == props.device
    assert out.shape == (6, 5, 4)
    np.testing.assert_array_equal(out.numpy(), proposals_vs_objects(props.numpy(), objs.numpy()))


def test_chunked_evaluation_matches_unchunked(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    props = _random_trajectories(rng, 9, 6, 6.0)
    objs = _random_trajectories(rng, 7, 6, 6.0)
    valid = rng.random((7, 6)) > 0.2
    whole = proposals_vs_objects(props, objs, valid)
    whole_pairs = pairwise_overlaps(objs)
    monkeypatch.setattr(geometry, "_CHUNK_ELEMENTS", 50)  # forces chunks of a single row
    np.testing.assert_array_equal(proposals_vs_objects(props, objs, valid), whole)
    np.testing.assert_array_equal(pairwise_overlaps(objs), whole_pairs)
    assert not whole[:, ~valid].any()


def test_box_corners_equal_the_rotation_matrix_product_bit_for_bit() -> None:
    """box_corners writes the rotation out; it must give exactly what the matrix form gave (the
    scorer's collision and lane tests must not change), for broadcast sizes too."""
    rng = np.random.default_rng(11)
    x, y = rng.normal(0, 300, (50, 41)), rng.normal(0, 300, (50, 41))
    heading = np.concatenate([rng.uniform(-7, 7, (50, 37)), np.tile([0.0, -0.0, np.pi, -np.pi / 2], (50, 1))], axis=1)
    length, width = rng.uniform(0.5, 12, (50, 1)), rng.uniform(0.5, 3, (50, 1))
    c, s = np.cos(heading), np.sin(heading)
    hl, hw = np.broadcast_to(length / 2.0, heading.shape), np.broadcast_to(width / 2.0, heading.shape)
    local = np.stack([np.stack([hl, hw], -1), np.stack([-hl, hw], -1),
                      np.stack([-hl, -hw], -1), np.stack([hl, -hw], -1)], -2)
    rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)
    expected = np.einsum("...ij,...vj->...vi", rot, local) + np.stack([x, y], -1)[..., None, :]
    got = box_corners(x, y, heading, length, width)
    assert got.shape == (50, 41, 4, 2)
    assert np.array_equal(got, expected)
    # scalars: front-left, rear-left, rear-right, front-right of a 4 x 2 box at (1, 2), heading 0
    np.testing.assert_array_equal(box_corners(1.0, 2.0, 0.0, 4.0, 2.0), [[3, 3], [-1, 3], [-1, 1], [3, 1]])
