"""Property test ("Show" of issue 6): the SAT checker agrees with shapely on 100,000 random box pairs.

Pairs mix random placements, exact edge-to-edge and corner-to-edge contacts, near contacts a few
tolerances apart, nested boxes and degenerate boxes (segments, points). Shapely (GEOS, float64) is the
reference: a degenerate box becomes a LineString or Point there, since a zero-area Polygon is invalid.

The documented contract (luna_core.geometry): pairs within ``tolerance`` of each other (touching
included) are reported overlapping, pairs farther apart than ``sqrt(2) * tolerance`` are not. Only
pairs whose shapely distance lies between those bounds may go either way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import shapely
import torch

from luna_core.geometry import TOUCH_TOLERANCE, boxes_overlap
from luna_core.types import box_corners

torch.set_num_threads(2)

N_PAIRS = 100_000
#: Everything sits near a UTM-like point so that the float32 re-centring is exercised too.
OFFSET = np.array([431_250.0, 5_512_875.0])


def _rigid(rng: np.random.Generator, n: int, xa, ya, ha, xb, yb, hb):
    """Apply one random rigid motion per pair to both boxes (pair geometry is invariant)."""
    rot = rng.uniform(-math.pi, math.pi, n)
    tx, ty = rng.uniform(-50.0, 50.0, (2, n))
    c, s = np.cos(rot), np.sin(rot)
    return (c * xa - s * ya + tx, s * xa + c * ya + ty, ha + rot,
            c * xb - s * yb + tx, s * xb + c * yb + ty, hb + rot)


def _sizes(rng: np.random.Generator, n: int, degenerate_share: float):
    length = rng.uniform(0.3, 8.0, n)
    width = rng.uniform(0.3, 3.0, n)
    kind = rng.random(n)
    length = np.where(kind < degenerate_share / 3, 0.0, length)  # segment across the heading
    width = np.where((kind >= degenerate_share / 3) & (kind < degenerate_share), 0.0, width)
    point = kind < degenerate_share / 6
    return np.where(point, 0.0, length), np.where(point, 0.0, width)


def _generate_pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes A and B, each (n, 4, 2), from five families of equal share."""
    fam = rng.integers(0, 5, n)
    la, wa = _sizes(rng, n, 0.15)
    lb, wb = _sizes(rng, n, 0.15)
    xa = np.zeros(n)
    ya = np.zeros(n)
    ha = np.zeros(n)
    # 0: random relative placement and heading
    xb = rng.uniform(-8.0, 8.0, n)
    yb = rng.uniform(-5.0, 5.0, n)
    hb = rng.uniform(-math.pi, math.pi, n)
    # 1: parallel (or perpendicular) boxes with edges in contact, slid along the edge, +- a few tolerances
    quarter = rng.integers(0, 2, n) * (math.pi / 2)
    hlb_x = np.where(quarter > 0, wb, lb) / 2  # B's half extent along x after the quarter turn
    hwb_y = np.where(quarter > 0, lb, wb) / 2
    gap = rng.choice([0.0, 0.0, 0.5, -0.5, 2.0, 5.0], n) * TOUCH_TOLERANCE
    side = rng.choice([-1.0, 1.0], n)
    along = rng.uniform(-1.0, 1.0, n) * (la / 2 + hlb_x)
    m = fam == 1
    xb[m], yb[m], hb[m] = along[m], (side * (wa / 2 + hwb_y + gap))[m], quarter[m]
    # 2: B's corner on A's long edge (B turned by theta in (0, pi/2)), +- a few tolerances
    theta = rng.uniform(0.05, math.pi / 2 - 0.05, n)
    lift = lb / 2 * np.sin(theta) + wb / 2 * np.cos(theta)  # depth of B's lowest corner below its centre
    corner_x = lb / 2 * np.cos(theta) - wb / 2 * np.sin(theta)  # that corner's x offset: R(theta)(hl,-hw)
    contact = rng.uniform(-1.0, 1.0, n) * la / 2
    m = fam == 2
    xb[m] = (contact - corner_x)[m]
    yb[m] = (wa / 2 + lift + gap)[m]
    hb[m] = theta[m]
    # 3: nested: B strictly inside a larger A
    la3 = np.maximum(la, 4.0)
    wa3 = np.maximum(wa, 2.0)
    scale = rng.uniform(0.05, 0.4, n)
    m = fam == 3
    la[m], wa[m] = la3[m], wa3[m]
    lb[m], wb[m] = (la3 * scale)[m], (wa3 * scale)[m]
    hb[m] = rng.uniform(-math.pi, math.pi, n)[m]
    xb[m] = rng.uniform(-0.2, 0.2, n)[m] * la3[m]
    yb[m] = rng.uniform(-0.1, 0.1, n)[m] * wa3[m]
    # 4: near misses: B just outside A along its long axis, a few tolerances to a few centimetres away
    m = fam == 4
    far_gap = rng.choice([0.0, 0.3, 1.5, 3.0, 30.0], n) * TOUCH_TOLERANCE
    xb[m] = (la / 2 + lb / 2 + far_gap)[m]
    yb[m] = rng.uniform(-0.5, 0.5, n)[m] * wa[m]
    hb[m] = 0.0
    xa, ya, ha, xb, yb, hb = _rigid(rng, n, xa, ya, ha, xb, yb, hb)
    a = box_corners(xa + OFFSET[0], ya + OFFSET[1], ha, la, wa)
    b = box_corners(xb + OFFSET[0], yb + OFFSET[1], hb, lb, wb)
    return a, b


def _shapely_geometries(corners: np.ndarray) -> np.ndarray:
    """Polygon for proper boxes, LineString for segments, Point for points (GEOS needs valid input).

    Built relative to OFFSET in float64, so the reference itself is exact to ~1e-12 m.
    """
    local = corners - OFFSET
    e0 = np.linalg.norm(local[:, 1] - local[:, 0], axis=1)
    e1 = np.linalg.norm(local[:, 2] - local[:, 1], axis=1)
    geoms = np.empty(len(local), dtype=object)
    poly = (e0 > 0) & (e1 > 0)
    point = (e0 == 0) & (e1 == 0)
    seg = ~poly & ~point
    geoms[poly] = shapely.polygons(local[poly])
    geoms[point] = shapely.points(local[point, 0])
    geoms[seg] = shapely.linestrings(np.where((e0[seg] > 0)[:, None, None], local[seg][:, :2],
                                              local[seg][:, 1:3]))
    return geoms


@pytest.fixture(scope="module")
def pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20240601)
    a, b = _generate_pairs(rng, N_PAIRS)
    ga, gb = _shapely_geometries(a), _shapely_geometries(b)
    return a, b, shapely.intersects(ga, gb), shapely.distance(ga, gb)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_sat_agrees_with_shapely_outside_the_tolerance(pairs, backend: str) -> None:
    a, b, intersects, distance = pairs
    ours = boxes_overlap(a, b, backend=backend)
    assert ours.shape == (N_PAIRS,)
    # The generator must exercise every regime, or the comparison proves little.
    assert intersects.sum() > 0.3 * N_PAIRS and (~intersects).sum() > 0.3 * N_PAIRS
    assert ((distance > 0) & (distance <= TOUCH_TOLERANCE)).sum() > 1000  # near contacts
    must_overlap = distance <= 0.9 * TOUCH_TOLERANCE  # intersecting or touching, with float32 margin
    must_not = distance > 1.1 * math.sqrt(2.0) * TOUCH_TOLERANCE
    missed = np.nonzero(must_overlap & ~ours)[0]
    false_alarm = np.nonzero(must_not & ours)[0]
    assert missed.size == 0, f"{missed.size} overlapping pairs not reported, e.g. {missed[:5]}"
    assert false_alarm.size == 0, f"{false_alarm.size} separated pairs reported, e.g. {false_alarm[:5]}"
    ambiguous = ~must_overlap & ~must_not
    assert ambiguous.sum() < 0.05 * N_PAIRS  # the band is thin: almost every pair is decided


def test_generator_covers_degenerate_nested_and_exact_contacts(pairs) -> None:
    a, b, intersects, distance = pairs
    extent = np.linalg.norm(b[:, 1] - b[:, 0], axis=1) * np.linalg.norm(b[:, 2] - b[:, 1], axis=1)
    assert (extent == 0).sum() > 0.1 * N_PAIRS  # segments and points
    contained = shapely.contains(_shapely_geometries(a[:2000]), _shapely_geometries(b[:2000]))
    assert contained.sum() > 200  # nested pairs
    touching = np.abs(distance) < 1e-9  # exact contacts (to float64 rounding), GEOS may say either
    assert touching.sum() > 0.1 * N_PAIRS
