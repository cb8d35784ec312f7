"""Samples kept sorted by stamp (messages arrive out of order across topics), for the progress monitor
and the hindsight recorder."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass
class Stamped:
    stamp: float
    value: object

    def __lt__(self, other: "Stamped") -> bool:
        return self.stamp < other.stamp


class StampedBuffer:
    """Samples sorted by stamp; a repeated stamp replaces the earlier sample (a re-sent message).

    Pruned by its owner (``prune``); capped at ``MAX_SAMPLES`` (oldest dropped) so that a node whose
    checks stop does not grow without bound.
    """

    MAX_SAMPLES = 10_000

    def __init__(self) -> None:
        self.items: list[Stamped] = []

    def insert(self, stamp: float, value: object) -> None:
        i = bisect.bisect_left(self.items, Stamped(stamp, None))
        if i < len(self.items) and self.items[i].stamp == stamp:
            self.items[i] = Stamped(stamp, value)
        else:
            self.items.insert(i, Stamped(stamp, value))
            if len(self.items) > self.MAX_SAMPLES:
                del self.items[0]

    def prune(self, oldest: float) -> None:
        i = bisect.bisect_left(self.items, Stamped(oldest, None))
        del self.items[:i]

    def at_or_before(self, stamp: float) -> Stamped | None:
        i = bisect.bisect_right(self.items, Stamped(stamp, None))
        return self.items[i - 1] if i > 0 else None

    def after(self, stamp: float) -> Stamped | None:
        i = bisect.bisect_right(self.items, Stamped(stamp, None))
        return self.items[i] if i < len(self.items) else None

    def between(self, start: float, end: float) -> list[Stamped]:
        """Samples with start < stamp <= end."""
        lo = bisect.bisect_right(self.items, Stamped(start, None))
        hi = bisect.bisect_right(self.items, Stamped(end, None))
        return self.items[lo:hi]

    def nearest(self, stamp: float, max_gap: float) -> Stamped | None:
        """The sample closest to ``stamp`` if it is at most ``max_gap`` away, else None."""
        candidates = [s for s in (self.at_or_before(stamp), self.after(stamp)) if s is not None]
        if not candidates:
            return None
        best = min(candidates, key=lambda s: abs(s.stamp - stamp))
        return best if abs(best.stamp - stamp) <= max_gap else None
