from luna_core.failure_gate import FailureGate
from luna_core.types import FailureEvent


def test_lasting_stall_reported_once_per_cooldown():
    gate = FailureGate(cooldown=5.0)
    admitted = [gate.admit(FailureEvent(t, "CK", t - 0.5, [], True)) for t in (10.0, 10.5, 14.5, 15.0)]
    assert [a is not None for a in admitted] == [True, False, False, True]


def test_new_collision_passes_during_stall_cooldown_and_repeats_are_dropped():
    gate = FailureGate(cooldown=5.0)
    assert gate.admit(FailureEvent(1.0, "AK", 0.5, ["a"], True)).colliding_ids == ["a"]
    second = gate.admit(FailureEvent(1.5, "AK", 0.5, ["a", "b"], True))
    assert second.colliding_ids == ["b"] and second.stall is False
    assert gate.admit(FailureEvent(2.0, "AK", 0.5, ["a", "b"], False)) is None


def test_blocked_is_debounced_on_its_own_and_keeps_its_leader():
    gate = FailureGate(cooldown=5.0)
    first = gate.admit(FailureEvent(1.0, "SK", 0.5, [], False, "parked"))
    assert first.blocked_by == "parked" and not first.stall
    assert gate.admit(FailureEvent(1.5, "SK", 1.0, [], False, "parked")) is None
    # A stall after the blocked report is new (the leader left, the ego did not follow).
    assert gate.admit(FailureEvent(2.0, "SK", 1.5, [], True)).stall


def test_a_near_miss_is_debounced_per_object_and_a_new_object_passes():
    gate = FailureGate(cooldown=5.0)
    first = gate.admit(FailureEvent(1.0, "CK", 0.5, [], False, near_misses={"cut-in": 0.6}))
    assert first.near_misses == {"cut-in": 0.6} and not first.collision
    assert gate.admit(FailureEvent(3.0, "CK", 2.5, [], False, near_misses={"cut-in": 0.3})) is None
    second = gate.admit(FailureEvent(3.5, "CK", 2.5, [], False, near_misses={"cut-in": 0.3, "ped": 0.8}))
    assert second.near_misses == {"ped": 0.8}
    assert gate.admit(FailureEvent(6.0, "CK", 5.5, [], False, near_misses={"cut-in": 0.2})).near_misses == {"cut-in": 0.2}
