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
