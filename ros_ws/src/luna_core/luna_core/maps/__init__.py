"""HD-map readers: map formats -> ``LaneGraph`` (pure Python; each format's library imported lazily).

``commonroad``: CommonRoad XML lanelet networks (commonroad-io). ``lanelet2``: Lanelet2 OSM maps (the
``lanelet2`` package). ``luna_core.map_files.load_map`` picks one by file format.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)


def connected_roads(ids: Iterable[K], neighbours: Callable[[K], Iterable[K]]) -> dict[K, K]:
    """Group lanes into roads (nuPlan roadblocks): the connected components of same-direction
    adjacency. Returns lane id -> the smallest id of its road, a stable name for the road."""
    members_of: dict[K, K] = {}
    known = set(ids)
    for start in sorted(known):
        if start in members_of:
            continue
        stack, members = [start], []
        while stack:
            lane = stack.pop()
            if lane in members_of or lane not in known:
                continue
            members_of[lane] = start
            members.append(lane)
            stack.extend(neighbours(lane))
        road = min(members)
        for lane in members:
            members_of[lane] = road
    return members_of
