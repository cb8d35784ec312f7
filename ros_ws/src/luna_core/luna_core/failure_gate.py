"""Debounce failure events so one lasting stall or collision triggers one explanation and reflection.

The progress monitor reports zeta_t every T_d while a failure lasts (a stall holds for seconds; two
overlapping boxes overlap for several cycles). Each reported failure costs an explanation and a
reflection request, so the gate lets a failure through only if it brings something new within the
cooldown: a colliding object or a near miss with an object not reported recently, or a stall (or a
blocked ego) when none was reported recently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from luna_core.types import FailureEvent


@dataclass
class FailureGate:
    cooldown: float = 5.0  # s
    _last_stall: float = float("-inf")
    _last_blocked: float = float("-inf")
    _last_collision: dict[str, float] = field(default_factory=dict)
    _last_near_miss: dict[str, float] = field(default_factory=dict)

    def admit(self, event: FailureEvent) -> FailureEvent | None:
        """The part of ``event`` that is new (or None if nothing is), recording it as reported."""
        now = event.stamp
        new_ids = [i for i in event.colliding_ids if now - self._last_collision.get(i, float("-inf")) >= self.cooldown]
        new_near = {i: t for i, t in event.near_misses.items()
                    if now - self._last_near_miss.get(i, float("-inf")) >= self.cooldown}
        new_stall = event.stall and now - self._last_stall >= self.cooldown
        new_blocked = event.blocked and now - self._last_blocked >= self.cooldown
        if not new_ids and not new_near and not new_stall and not new_blocked:
            return None
        for i in new_ids:
            self._last_collision[i] = now
        for i in new_near:
            self._last_near_miss[i] = now
        if new_stall:
            self._last_stall = now
        if new_blocked:
            self._last_blocked = now
        return FailureEvent(stamp=now, issued_decision=event.issued_decision, decision_stamp=event.decision_stamp,
                            colliding_ids=new_ids, stall=new_stall, blocked_by=event.blocked_by if new_blocked else "",
                            collision_kinds={i: event.collision_kinds[i] for i in new_ids if i in event.collision_kinds},
                            near_misses=new_near)
