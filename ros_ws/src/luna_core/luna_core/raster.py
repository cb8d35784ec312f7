"""Exact point-in-polygon tests through a lane-id raster (the scorer's lane tests, issue 14).

``shapely.intersects_xy`` (GEOS) costs about a microsecond per point and polygon, and the planner's
scorer asks it for every footprint corner of every proposal state (60 000 points in a batch of 384
proposals) against every nearby lane and the drivable area. ``PolygonRaster`` answers most of those
from a raster on a global lattice of square cells (side ``cell``, a power of two, so that the cell of
a point, ``floor(x / cell)``, is computed without rounding). Per geometry, each cell is

* EDGE if its box, grown by ``MARGIN``, meets the geometry's linework (polygon rings, and any lines
  or points ``make_valid`` left): points there are asked from GEOS;
* otherwise wholly INSIDE or wholly OUTSIDE: the consecutive non-edge cells of a row form a
  connected set that no boundary meets, so one GEOS test at the centre of the run's first cell
  classifies the whole run.

The INSIDE and EDGE cells of all geometries are stored by cell (compressed rows: the geometries
present in each cell), so a point costs one lookup whatever the number of geometries, and every
answer is GEOS's own, boundary points included.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import shapely

CELL = 0.25  # m; lanes are ~3.5 m wide, so about a third of a lane's cells are edge cells
MARGIN = 1e-6  # m; far above the rounding of segment pieces for coordinates up to ~1e7 m
MAX_CELLS = 1 << 22  # lattice cells over all geometries; a larger map doubles the cell size
INSIDE, EDGE = 1, 2


class PolygonRaster:
    """``shapely.intersects_xy(g, x, y)`` for each of G geometries and flat coordinate arrays, from a
    raster where the answer is certain and from GEOS near the geometries' linework."""

    def __init__(self, geometries: Sequence[shapely.Geometry], cell: float = CELL) -> None:
        self.geometries = list(geometries)
        for g in self.geometries:
            shapely.prepare(g)
        bounds = np.asarray(shapely.bounds(np.array(self.geometries, dtype=object)), dtype=np.float64)
        used = np.all(np.isfinite(bounds), axis=1) & ~shapely.is_empty(np.array(self.geometries, dtype=object))
        lo = np.min(bounds[used, :2], axis=0) if used.any() else np.zeros(2)
        hi = np.max(bounds[used, 2:], axis=0) if used.any() else np.zeros(2)
        while math.prod(np.floor(hi / cell) - np.floor(lo / cell) + 1) > MAX_CELLS:
            cell *= 2.0
        self.cell = cell
        self.origin = np.floor(lo / cell)  # lattice index (x, y) of the first cell
        self.shape = (np.floor(hi / cell) - self.origin + 1).astype(np.intp)  # (x, y) cells
        keys, kinds, owners = [], [], []
        for k in np.flatnonzero(used):
            key, kind = self._cells(self.geometries[k], bounds[k])
            keys.append(key)
            kinds.append(kind)
            owners.append(np.full(len(key), k, dtype=np.intp))
        key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.intp)
        order = np.argsort(key, kind="stable")
        self.kind = (np.concatenate(kinds) if kinds else np.zeros(0, dtype=np.int8))[order]
        self.owner = (np.concatenate(owners) if owners else np.zeros(0, dtype=np.intp))[order]
        counts = np.bincount(key, minlength=int(np.prod(self.shape)))
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)  # 16 MB at MAX_CELLS

    def _cells(self, geometry: shapely.Geometry, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, kinds) of the INSIDE and EDGE cells of one geometry (flat lattice keys)."""
        cell = self.cell
        first = np.floor(bounds[:2] / cell)
        nx, ny = (np.floor(bounds[2:] / cell) - first + 1).astype(np.intp)
        status = np.zeros((ny, nx), dtype=np.int8)
        segments = _segments(geometry)
        if len(segments):  # EDGE: cut segments into pieces no longer than a cell; mark the <= 3 x 3
            a, b = segments[:, 0], segments[:, 1]  # cells meeting each piece's box grown by 2 MARGIN
            pieces = np.maximum(np.ceil(np.hypot(*(b - a).T) / cell), 1).astype(np.intp)
            seg = np.repeat(np.arange(len(segments)), pieces)
            k = (np.arange(len(seg)) - np.repeat(np.cumsum(pieces) - pieces, pieces))[:, None]
            p0 = a[seg] + (b - a)[seg] * (k / pieces[seg][:, None])
            p1 = a[seg] + (b - a)[seg] * ((k + 1) / pieces[seg][:, None])
            low = np.floor((np.minimum(p0, p1) - 2 * MARGIN) / cell) - first
            high = np.floor((np.maximum(p0, p1) + 2 * MARGIN) / cell) - first
            c0, r0 = np.clip(low, 0, [nx - 1, ny - 1]).astype(np.intp).T
            c1, r1 = np.clip(high, 0, [nx - 1, ny - 1]).astype(np.intp).T
            for dr in range(3):
                for dc in range(3):
                    keep = (r0 + dr <= r1) & (c0 + dc <= c1)
                    status[r0[keep] + dr, c0[keep] + dc] = EDGE
        free = status != EDGE  # runs of non-edge cells: one GEOS test at each run's first cell
        starts = free & ~np.pad(free, ((0, 0), (1, 0)))[:, :-1]
        row, col = np.nonzero(starts)
        if len(row):
            inside = shapely.intersects_xy(geometry, (first[0] + col + 0.5) * cell, (first[1] + row + 0.5) * cell)
            run = np.cumsum(starts.ravel()).reshape(free.shape) - 1  # run index of each cell
            status[free] = np.where(inside[run[free]], INSIDE, 0)
        row, col = np.nonzero(status)
        keys = (row + int(first[1] - self.origin[1])) * self.shape[0] + col + int(first[0] - self.origin[0])
        return keys, status[row, col]

    def membership(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(N, G) bool: point (x[i], y[i]) touches geometry g, as GEOS says (flat float arrays)."""
        out = np.zeros((len(x), len(self.geometries)), dtype=bool)
        ix = np.floor(x / self.cell) - self.origin[0]
        iy = np.floor(y / self.cell) - self.origin[1]
        ok = (ix >= 0) & (ix < self.shape[0]) & (iy >= 0) & (iy < self.shape[1])  # False for NaN
        pts = np.flatnonzero(ok)
        key = iy[pts].astype(np.intp) * self.shape[0] + ix[pts].astype(np.intp)
        start = self.offsets[key]
        count = self.offsets[key + 1] - start
        point = np.repeat(pts, count)  # one (point, entry) pair per geometry present in its cell
        entry = np.repeat(start - np.cumsum(count) + count, count) + np.arange(len(point))
        owner, kind = self.owner[entry], self.kind[entry]
        inside = kind == INSIDE
        out[point[inside], owner[inside]] = True
        edge = np.flatnonzero(~inside)
        edge = edge[np.argsort(owner[edge], kind="stable")]
        for part in np.split(edge, np.flatnonzero(np.diff(owner[edge])) + 1) if len(edge) else []:
            p, g = point[part], owner[part[0]]
            out[p, g] = shapely.intersects_xy(self.geometries[g], x[p], y[p])
        return out


def _segments(geometry: shapely.Geometry) -> np.ndarray:
    """(S, 2, 2) segments of all linework of a geometry: polygon rings, lines, and points (as
    zero-length segments), through any multi-part or collection nesting."""
    out = []
    stack = [geometry]
    while stack:
        g = stack.pop()
        kind = shapely.get_type_id(g)
        if kind in (4, 5, 6, 7):  # multi-point, multi-line, multi-polygon, collection
            stack.extend(shapely.get_parts(g))
        elif kind == 3:  # polygon: its exterior and interior rings
            stack.extend(shapely.get_rings(g))
        elif not shapely.is_empty(g):  # point, line string, linear ring
            xy = shapely.get_coordinates(g)
            if len(xy) == 1:
                xy = np.vstack([xy, xy])
            out.append(np.stack([xy[:-1], xy[1:]], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2, 2))
