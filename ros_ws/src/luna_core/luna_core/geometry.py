"""Batched collision checking of oriented boxes by the Separating Axis Theorem (LUNA-AD Algorithm 1).

Boxes are given as corners ``(..., 4, 2)`` in cyclic order (as :func:`luna_core.types.box_corners`
produces them: front-left, rear-left, rear-right, front-right, in metres). Three forms are offered:

* :func:`colliding_objects` - Algorithm 1: ``(N_obj, T, 4, 2)`` with the ego at index 0 -> the indices
  of the objects that overlap the ego at any time step of the window (the set I_coll of Eq. 24).
* :func:`pairwise_overlaps` - all pairs: ``(N, T, 4, 2)`` -> ``(N, N, T)`` overlap booleans.
* :func:`proposals_vs_objects` - planner scoring: ego proposals ``(P, T, 4, 2)`` against objects
  ``(N, T, 4, 2)`` -> ``(P, N, T)`` overlap booleans.

How Algorithm 1 is generalised. Algorithm 1 projects both boxes' 8 corners onto the 8 (unnormalised)
edge normals. A rectangle has only two distinct edge directions, so 4 axes (two unit axes per box)
are enough, and with unit axes each box's projection interval has a closed form (centre projection
+- half extents), which is the classic oriented-box test: per pair ~40 flops instead of 8 x 8
projections. Unit axes also make the tolerance a distance in metres. Taking each box's axes from its
longer edge (rather than from edge normals) keeps the test exact for degenerate boxes: a zero-width
box is a segment and a zero-size box a point, and SAT over the rectangle axes is still exact for those
(collinear segments are separated along their common direction, which edge normals would miss).

Touching and the tolerance. Boxes are closed sets: touching boxes overlap (as shapely's
``intersects``). A pair is reported overlapping unless some axis separates it by more than
``tolerance`` (default :data:`TOUCH_TOLERANCE` = 1 mm), so a gap <= tolerance on every axis counts as
a collision (the conservative side for safety). Consequences, checked by the property test against
shapely: every intersecting pair (touching included) is reported; a pair is never reported when its
Euclidean distance exceeds ``sqrt(2) * tolerance`` (the largest axis gap is at least distance /
sqrt(2), since for rectangles the closest-feature direction is within 45 degrees of a box axis).
The tolerance also absorbs float32 rounding: coordinates are re-centred (in the input precision) on
the first box's centre before the float32 computation, so rounding stays ~1e-5 m for boxes within a
few hundred metres of each other.

Backends. One kernel, written with array operators only, runs on torch tensors (``backend="torch"``:
CUDA when available, else CPU; tensors stay on their device) and on NumPy arrays (``backend="numpy"``).
By default (``backend=None``) torch tensors are processed by torch on their device; NumPy inputs go to
torch on CUDA when there is a GPU and to NumPy otherwise, because on a CPU the torch path pays ~5-10 us
per operator and, with several intra-op threads on a loaded machine, far more (docs/benchmarks.md).
NumPy inputs come back as NumPy outputs. There are no Python loops over objects or time steps; only the
all-pairs and proposal forms process the leading dimension in chunks to bound memory.

torch is imported only when a torch path runs (torch inputs, ``backend="torch"``, or the GPU probe of
``backend=None`` on a machine with a GPU device node): importing it costs ~3 s, which the light nodes
(progress monitor, reflection client) would otherwise pay at every (re)start for NumPy-only work.
"""

from __future__ import annotations

import glob
import re
import sys
from functools import lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch

#: Default gap (m) under which boxes count as touching, hence overlapping (see the module docstring).
TOUCH_TOLERANCE = 1e-3
#: Relative tolerance of the rectangle-shape check on the inputs (fraction of the box size).
_SHAPE_RTOL = 1e-3
#: Upper bound on elements per intermediate pairwise tensor; the leading dimension is chunked to stay
#: below it (about 64 MB of float32 per intermediate).
_CHUNK_ELEMENTS = 1 << 24

Array = Any  # np.ndarray | torch.Tensor
Backend = Literal["torch", "numpy"]


class GeometryError(ValueError):
    """Invalid boxes: wrong shape, non-finite corners, or corners that do not form a rectangle."""


def _torch() -> ModuleType:
    """The torch module, imported on first use (see the module docstring)."""
    import torch

    return torch


def _is_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor; without importing torch (no tensor exists before torch is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


#: Device nodes through which torch can reach a GPU (NVIDIA desktop/server, Jetson, ROCm, WSL2). Where
#: none exists, ``torch.cuda.is_available()`` is False, so ``backend=None`` can decide without torch.
_GPU_DEVICE_GLOBS = ("/dev/nvidia[0-9]*", "/dev/nvhost-*", "/dev/nvgpu*", "/dev/kfd", "/dev/dxg")


@lru_cache(maxsize=1)
def _gpu_device_node() -> bool:
    return any(glob.glob(pattern) for pattern in _GPU_DEVICE_GLOBS)


def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch where no GPU device node exists."""
    if "torch" not in sys.modules and not _gpu_device_node():
        return False
    return bool(_torch().cuda.is_available())


def default_device() -> torch.device:
    """CUDA when present (the vehicle computer), CPU otherwise."""
    return _torch().device("cuda" if _cuda_available() else "cpu")


#: Device names the stack's options accept (planner, stack settings); also "cuda:<n>".
DEVICE_NAMES = ("auto", "cpu", "cuda")
#: Dtypes of torch autocast for the models' matrix products (the student's and the denoiser's); "none" = off.
AUTOCASTS = ("none", "bfloat16")


def is_device_name(name: object) -> bool:
    """Whether ``name`` is one of ``DEVICE_NAMES`` or ``cuda:<n>`` (checked without importing torch)."""
    return isinstance(name, str) and (name in DEVICE_NAMES or re.fullmatch(r"cuda:\d+", name) is not None)


# --------------------------------------------------------------------------------------------------
# Kernel (shared by torch and NumPy through the array namespace ``xp``)
# --------------------------------------------------------------------------------------------------


class _Frames(NamedTuple):
    """Rectangles in closed form, one array of the boxes' batch shape per field (separate x and y
    components keep every pairwise operation on contiguous arrays)."""

    cx: Array  # centre
    cy: Array
    ux: Array  # unit vector along the longer edge
    uy: Array
    half_long: Array  # half extent along u
    half_short: Array  # half extent across it
    radius: Array  # circumradius, for the cheap bounding-circle pre-test

    def map(self, fn) -> "_Frames":
        return _Frames(*(fn(x) for x in self))


def _box_frames(xp: ModuleType, corners: Array) -> _Frames:
    """Closed-form frames of rectangles given by corners (..., 4, 2).

    Taking the longer of the first two edges as the axis keeps a segment's direction (one edge has
    zero length); a point (both edges zero) gets the x axis, which is as good as any for a point.
    """
    x, y = corners[..., 0], corners[..., 1]
    cx, cy = (x[..., 0] + x[..., 2]) * 0.5, (y[..., 0] + y[..., 2]) * 0.5
    e0x, e0y = x[..., 1] - x[..., 0], y[..., 1] - y[..., 0]
    e1x, e1y = x[..., 2] - x[..., 1], y[..., 2] - y[..., 1]
    len0 = xp.sqrt(e0x * e0x + e0y * e0y)
    len1 = xp.sqrt(e1x * e1x + e1y * e1y)
    use0 = len0 >= len1
    long = xp.where(use0, len0, len1)
    is_point = long <= 0.0
    inv = 1.0 / xp.where(is_point, xp.ones_like(long), long)
    ux = xp.where(is_point, xp.ones_like(long), xp.where(use0, e0x, e1x) * inv)
    uy = xp.where(is_point, xp.zeros_like(long), xp.where(use0, e0y, e1y) * inv)
    half_long = long * 0.5
    half_short = xp.where(use0, len1, len0) * 0.5
    radius = xp.sqrt(half_long * half_long + half_short * half_short)
    return _Frames(cx, cy, ux, uy, half_long, half_short, radius)


def _separated(fa: _Frames, fb: _Frames, tolerance: float) -> Array:
    """True where boxes a and b (broadcast frames) are separated by more than ``tolerance``.

    SAT on the 4 unit axes u_a, v_a, u_b, v_b (v = u rotated by +90 degrees). The projection radius of
    box b on u_a is hl_b |u_b.u_a| + hw_b |v_b.u_a| = hl_b |c| + hw_b |s| with c = u_a.u_b, s = u_a x u_b.
    Written with operators only, so it runs on NumPy arrays and torch tensors alike.
    """
    dx, dy = fb.cx - fa.cx, fb.cy - fa.cy
    uax, uay, ubx, uby = fa.ux, fa.uy, fb.ux, fb.uy
    hla, hwa, hlb, hwb = fa.half_long, fa.half_short, fb.half_long, fb.half_short
    c = abs(uax * ubx + uay * uby)
    s = abs(uax * uby - uay * ubx)
    sep = abs(dx * uax + dy * uay) > hla + hlb * c + hwb * s + tolerance
    sep |= abs(dy * uax - dx * uay) > hwa + hlb * s + hwb * c + tolerance
    sep |= abs(dx * ubx + dy * uby) > hlb + hla * c + hwa * s + tolerance
    sep |= abs(dy * ubx - dx * uby) > hwb + hla * s + hwa * c + tolerance
    return sep


def _overlap(xp: ModuleType, fa: _Frames, fb: _Frames, tolerance: float) -> Array:
    """Overlap of broadcast frames: a bounding-circle pre-test, then SAT on the remaining pairs only.

    In traffic most pairs are far apart, so the circle test (a few operations per pair) settles them
    and the SAT test (about 40) runs on the gathered near pairs.
    """
    dx, dy = fb.cx - fa.cx, fb.cy - fa.cy
    reach = (fa.radius + tolerance) + fb.radius
    near = dx * dx + dy * dy <= reach * reach
    if near.ndim == 0:  # a single pair: nothing to gather
        return near & ~_separated(fa, fb, tolerance)
    idx = np.nonzero(near) if xp is np else xp.nonzero(near, as_tuple=True)
    if idx[0].shape[0] == 0:
        return near
    shape = tuple(near.shape)

    def gather(x: Array) -> Array:
        return (np.broadcast_to(x, shape) if xp is np else x.expand(shape))[idx]

    near[idx] = ~_separated(fa.map(gather), fb.map(gather), tolerance)
    return near


# --------------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------------


def _check_boxes(xp: ModuleType, corners: Array, name: str, valid: Array | None) -> Array:
    """Validate shape, finiteness and rectangle shape; invalid (masked) boxes are zeroed, not checked."""
    if corners.ndim < 2 or tuple(corners.shape[-2:]) != (4, 2):
        raise GeometryError(f"{name}: expected corners of shape (..., 4, 2), got {tuple(corners.shape)}")
    if valid is not None:
        if tuple(valid.shape) != tuple(corners.shape[:-2]):
            raise GeometryError(f"{name}: validity mask shape {tuple(valid.shape)} does not match "
                                f"boxes {tuple(corners.shape[:-2])}")
        corners = xp.where(valid[..., None, None], corners, xp.zeros_like(corners))
    finite = xp.isfinite(corners).all(-1).all(-1)
    if not bool(finite.all()):
        bad = _first_index(xp, ~finite)
        raise GeometryError(f"{name}: non-finite corner coordinates at box index {bad}")
    # A rectangle: opposite edges equal and opposite, adjacent edges orthogonal.
    e0 = corners[..., 1, :] - corners[..., 0, :]
    e1 = corners[..., 2, :] - corners[..., 1, :]
    e2 = corners[..., 3, :] - corners[..., 2, :]
    scale = abs(e0).sum(-1) + abs(e1).sum(-1) + 1e-6
    parallelogram = abs(e0 + e2).sum(-1) <= _SHAPE_RTOL * scale
    orthogonal = abs((e0 * e1).sum(-1)) <= _SHAPE_RTOL * scale * scale
    rect = parallelogram & orthogonal
    if not bool(rect.all()):
        bad = _first_index(xp, ~rect)
        raise GeometryError(f"{name}: corners at box index {bad} do not form a rectangle in cyclic "
                            f"order (expected the layout of luna_core.types.box_corners)")
    return corners


def _first_index(xp: ModuleType, mask: Array) -> tuple[int, ...]:
    if mask.ndim == 0:  # a single box
        return ()
    idx = xp.nonzero(mask) if xp is np else xp.nonzero(mask, as_tuple=True)
    return tuple(int(i[0]) for i in idx)


def _origin(arrays: list[Array | None]) -> np.ndarray | torch.Tensor | None:
    """Centre of the first finite box of the first corner array: the re-centring reference."""
    for b in arrays[::2]:  # even positions hold corner arrays, odd positions masks
        if b is None or tuple(np.shape(b)[-2:]) != (4, 2) or int(np.prod(np.shape(b))) == 0:
            continue
        flat = b.reshape(-1, 4, 2)
        if _is_tensor(flat):
            torch = _torch()
            finite = torch.isfinite(flat[:1]).flatten(1).all(1)  # usually the first box: no full scan
            if not bool(finite[0]):
                finite = torch.isfinite(flat).flatten(1).all(1)
            if bool(finite.any()):
                return flat[int(torch.argmax(finite.to(torch.uint8)))].mean(0)
        else:
            finite = np.isfinite(flat[:1]).reshape(1, -1).all(1)  # usually the first box: no full scan
            if not finite[0]:
                finite = np.isfinite(flat).reshape(len(flat), -1).all(1)
            if finite.any():
                return np.asarray(flat[int(np.argmax(finite))], dtype=np.float64).mean(0)
    return None


def _prepare(arrays: list[Array | None], backend: Backend | None,
             device: torch.device | str | None) -> tuple[ModuleType, list[Array | None], bool]:
    """Convert ``[corners, mask, corners, mask]`` to the backend, re-centred before the float32 cast.

    Returns the namespace, the converted arrays (masks as bool) and whether the caller gave NumPy
    (then results are returned as NumPy).
    """
    given_numpy = not any(_is_tensor(a) for a in arrays if a is not None)
    if backend is None:
        on_gpu = _torch().device(device).type == "cuda" if device is not None else _cuda_available()
        backend = "numpy" if given_numpy and not on_gpu else "torch"
    origin = _origin(arrays)
    out: list[Array | None] = []
    for i, a in enumerate(arrays):
        is_mask = i % 2 == 1
        if a is None:
            out.append(None)
        elif backend == "numpy":
            arr = a.detach().cpu().numpy() if _is_tensor(a) else np.asarray(a)
            if is_mask:
                out.append(arr.astype(bool))
            else:
                o = origin.detach().cpu().numpy() if _is_tensor(origin) else origin
                arr = arr.astype(np.float64, copy=False)
                out.append((arr - o if o is not None else arr).astype(np.float32))
        else:
            torch = _torch()
            dev = torch.device(device) if device is not None else (
                a.device if isinstance(a, torch.Tensor) else default_device())
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
            if is_mask:
                out.append(t.to(device=dev, dtype=torch.bool))
                continue
            if not t.is_floating_point():
                t = t.to(torch.float64)
            if origin is not None:
                o = origin if isinstance(origin, torch.Tensor) else torch.from_numpy(origin)
                t = t - o.to(device=t.device, dtype=t.dtype)
            out.append(t.to(device=dev, dtype=torch.float32))
    return (np if backend == "numpy" else _torch()), out, given_numpy


def _to_output(x: Array, as_numpy: bool) -> Array:
    if as_numpy and _is_tensor(x):
        return x.cpu().numpy()
    return x


def _chunked_overlap(xp: ModuleType, fa: _Frames, fb: _Frames, tolerance: float, rows: int,
                     pair_size: int) -> Array:
    """:func:`_overlap` with the leading dimension (``rows``) of ``fa`` processed in chunks."""
    step = max(1, _CHUNK_ELEMENTS // max(1, pair_size))
    if step >= rows:
        return _overlap(xp, fa, fb, tolerance)
    parts = [_overlap(xp, fa.map(lambda x: x[start:start + step]), fb, tolerance)
             for start in range(0, rows, step)]  # chunks of rows, not a loop over individual objects
    return xp.concatenate(parts, 0) if xp is np else xp.cat(parts, 0)


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def boxes_overlap(a: Array, b: Array, tolerance: float = TOUCH_TOLERANCE, *,
                  backend: Backend | None = None, device: torch.device | str | None = None) -> Array:
    """Elementwise overlap of boxes ``a (..., 4, 2)`` and ``b (..., 4, 2)`` (batch shapes broadcast).

    Returns booleans of the broadcast batch shape: True where the boxes intersect or are within
    ``tolerance`` metres (touching counts as overlapping). NumPy in -> NumPy out.
    """
    xp, (ta, _, tb, _), as_numpy = _prepare([a, None, b, None], backend, device)
    ta = _check_boxes(xp, ta, "a", None)
    tb = _check_boxes(xp, tb, "b", None)
    return _to_output(_overlap(xp, _box_frames(xp, ta), _box_frames(xp, tb), tolerance), as_numpy)


def colliding_objects(boxes: Array, valid: Array | None = None, tolerance: float = TOUCH_TOLERANCE, *,
                      backend: Backend | None = None,
                      device: torch.device | str | None = None) -> np.ndarray:
    """LUNA-AD Algorithm 1: indices of the objects overlapping the ego at any step of the window.

    Args:
        boxes: box trajectories ``(N_obj, T, 4, 2)``, the ego at index 0.
        valid: optional ``(N_obj, T)`` mask; False where an object was not observed at that step
            (such steps never collide; their corners may be anything, NaN included).
        tolerance: touching gap in metres (see the module docstring).
    Returns:
        sorted int64 NumPy array of colliding indices in ``1..N_obj-1`` (empty if none or N_obj <= 1).
    """
    if boxes.ndim != 4:
        raise GeometryError(f"boxes: expected (N_obj, T, 4, 2), got {tuple(boxes.shape)}")
    if boxes.shape[0] <= 1 or boxes.shape[1] == 0:
        return np.zeros(0, dtype=np.int64)
    xp, (t, m, _, _), _ = _prepare([boxes, valid, None, None], backend, device)
    t = _check_boxes(xp, t, "boxes", m)
    f = _box_frames(xp, t)
    hit = _overlap(xp, f.map(lambda x: x[0:1]), f.map(lambda x: x[1:]), tolerance)  # (N_obj - 1, T)
    if m is not None:
        hit = hit & m[0:1] & m[1:]
    idx = xp.nonzero(hit.any(1))[0] + 1 if xp is np else xp.nonzero(hit.any(1))[:, 0] + 1
    return np.asarray(idx.cpu().numpy() if _is_tensor(idx) else idx, dtype=np.int64)


def pairwise_overlaps(boxes: Array, valid: Array | None = None, tolerance: float = TOUCH_TOLERANCE, *,
                      backend: Backend | None = None, device: torch.device | str | None = None) -> Array:
    """All-pairs overlap: ``(N, T, 4, 2)`` -> ``(N, N, T)`` booleans, symmetric, False on the diagonal.

    ``valid`` is an optional ``(N, T)`` observation mask (unobserved boxes overlap nothing).
    """
    if boxes.ndim != 4:
        raise GeometryError(f"boxes: expected (N, T, 4, 2), got {tuple(boxes.shape)}")
    xp, (t, m, _, _), as_numpy = _prepare([boxes, valid, None, None], backend, device)
    t = _check_boxes(xp, t, "boxes", m)
    n, steps = t.shape[0], t.shape[1]
    f = _box_frames(xp, t)
    hit = _chunked_overlap(xp, f.map(lambda x: x[:, None]), f.map(lambda x: x[None]), tolerance, n,
                           n * steps)
    eye = np.eye(n, dtype=bool) if xp is np else xp.eye(n, dtype=xp.bool, device=hit.device)
    hit = hit & ~eye[:, :, None]
    if m is not None:
        hit = hit & m[:, None] & m[None]
    return _to_output(hit, as_numpy)


def proposals_vs_objects(proposals: Array, objects: Array, objects_valid: Array | None = None,
                         tolerance: float = TOUCH_TOLERANCE, *, backend: Backend | None = None,
                         device: torch.device | str | None = None, validate_proposals: bool = True) -> Array:
    """Overlap of each ego proposal with each object at each step, for the planner's scorer.

    Args:
        proposals: ego boxes along P proposals ``(P, T, 4, 2)``.
        objects: object boxes ``(N, T, 4, 2)`` on the same time grid (e.g. predicted or constant
            velocity futures).
        objects_valid: optional ``(N, T)`` mask; False steps never overlap.
        tolerance: touching gap in metres.
        validate_proposals: False skips the finiteness and rectangle checks of ``proposals``, for a
            caller whose boxes are ``box_corners`` of states it has checked (the planner's scorer:
            the checks cost a third of the call there).
    Returns:
        ``(P, N, T)`` booleans (NumPy if the inputs were NumPy, else a tensor on the inputs' device).
    """
    if proposals.ndim != 4 or objects.ndim != 4 or proposals.shape[1] != objects.shape[1]:
        raise GeometryError(f"proposals {tuple(proposals.shape)} and objects {tuple(objects.shape)}: "
                            "expected (P, T, 4, 2) and (N, T, 4, 2) with the same T")
    xp, (tp, _, to, m), as_numpy = _prepare([proposals, None, objects, objects_valid], backend, device)
    if validate_proposals:
        tp = _check_boxes(xp, tp, "proposals", None)
    to = _check_boxes(xp, to, "objects", m)
    p, n, steps = tp.shape[0], to.shape[0], tp.shape[1]
    fp = _box_frames(xp, tp).map(lambda x: x[:, None])
    fo = _box_frames(xp, to).map(lambda x: x[None])
    hit = _chunked_overlap(xp, fp, fo, tolerance, p, n * steps)
    if m is not None:
        hit = hit & m[None]
    return _to_output(hit, as_numpy)
