"""Progress monitor (luna_core.monitor): collisions over the last T_d (with nuPlan's collision type),
stall detection (Eq. 23) with what legitimately holds the ego (luna_core.holds), the blocked failure,
failure tuple (Eq. 24), stamp alignment and bad input."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from luna_core.failure_gate import FailureGate
from luna_core.holds import HoldParameters, hold_of
from luna_core.monitor import MonitorInputError, MonitorParameters, ProgressMonitor
from luna_core.prompts import PromptManager
from luna_core.scene import FIELD_OF_VIEW, LEFT_LANE, SAME_LANE
from luna_core.types import (DecisionDistribution, EgoState, ObjectClass, ObjectDescription, RoadSection,
                             SceneDescriptor, TrackedObject, TrackedObjects, TrafficLightPhase)

ODOM_DT = 0.05  # 20 Hz odometry
PERCEPTION_DT = 0.1  # 10 Hz objects
# The mechanics are tested on a short decision cycle (T_d = 0.5 s, H = 10: a 4.5 s window); the node's
# defaults (T_d = 2 s) only change the window lengths.
PARAMS = MonitorParameters(decision_period=0.5, stall_window_cycles=10)


def _ego(t: float, speed: float, heading: float = 0.0, x0: float = 0.0) -> EgoState:
    return EgoState(stamp=t, x=x0 + speed * t * math.cos(heading), y=speed * t * math.sin(heading),
                    heading=heading, velocity=speed)


def _car(object_id: str, x: float, y: float, heading: float = 0.0, length: float = 4.5,
         width: float = 1.9) -> TrackedObject:
    return TrackedObject(object_id, ObjectClass.VEHICLE, x, y, heading, 0.0, 0.0, length, width)


def _scene(t: float, speed: float, light: TrafficLightPhase = TrafficLightPhase.NONE,
           objects: tuple[ObjectDescription, ...] = ()) -> SceneDescriptor:
    return SceneDescriptor(stamp=t, road_section=RoadSection.NORMAL_MULTI_LANE, num_lanes=2, ego_lane_index=1,
                           ego_speed=speed, objects=list(objects), traffic_light=light, has_right_lane=True)


def _described(object_id: str, ahead: float, speed: float = 0.0, lateral: float = 0.0, relation: str = SAME_LANE,
               cls: ObjectClass = ObjectClass.VEHICLE, heading: float = 0.0, length: float = 4.5) -> ObjectDescription:
    """An object as the scene descriptor states it, ``ahead`` / ``lateral`` m from the ego box centre."""
    return ObjectDescription(object_id, cls, math.hypot(ahead, lateral), math.atan2(lateral, ahead), heading, speed,
                             length, 1.9, relation)


def _feed(monitor: ProgressMonitor, t_end: float, speed: float, objects_at, t_start: float = 0.0,
          light=None, scene_objects=None) -> None:
    """Drive straight along +x at ``speed``; ``objects_at(t)`` lists the objects perceived at t; a scene
    every perception frame when ``light(t)`` or ``scene_objects(t)`` says what it holds."""
    for k in range(int(round((t_end - t_start) / ODOM_DT)) + 1):
        monitor.update_ego(_ego(t_start + k * ODOM_DT, speed))
    for k in range(int(round((t_end - t_start) / PERCEPTION_DT)) + 1):
        t = round(t_start + k * PERCEPTION_DT, 9)
        monitor.update_objects(TrackedObjects(t, objects_at(t)))
        if light is not None or scene_objects is not None:
            monitor.update_scene(_scene(t, speed, light(t) if light else TrafficLightPhase.NONE,
                                        tuple(scene_objects(t)) if scene_objects else ()))


def _decision(stamp: float, code: str) -> DecisionDistribution:
    p = np.full(10, 0.02)
    p[["AK", "AL", "AR", "CK", "CL", "CR", "DK", "DL", "DR", "SK"].index(code)] = 0.82
    return DecisionDistribution(stamp=stamp, probabilities=p)


def test_free_driving_reports_nothing_and_fills_diagnostics() -> None:
    m = ProgressMonitor(PARAMS)
    _feed(m, 2.0, 10.0, lambda t: [_car("lead", 10.0 * t + 30.0, 0.0), _car("side", 10.0 * t, 4.0)])
    assert m.check(2.0) is None
    d = m.diagnostics
    assert d.frames_checked == 5  # (1.5, 2.0] at 10 Hz
    assert d.objects_checked == 2
    assert d.latency > 0.0 and not d.failure


def test_collision_in_the_window_gives_the_failure_tuple() -> None:
    m = ProgressMonitor(PARAMS)
    for stamp, code in ((0.0, "AK"), (0.5, "CK"), (1.0, "DK")):
        m.on_decision(_decision(stamp, code))
    # A stopped car (rear at 13.25 m): the ego front (4.05 m ahead of the rear axle) reaches it in (0.9, 1.0].
    _feed(m, 1.0, 10.0, lambda t: [_car("stopped", 15.5, 0.0), _car("far", 80.0, 0.0)])
    event = m.check(1.0)
    assert event is not None
    assert event.colliding_ids == ["stopped"] and event.collision and not event.stall
    assert event.issued_decision == "CK" and event.decision_stamp == 0.5  # issued at t - T_d
    assert event.stamp == 1.0 and m.diagnostics.failure


def test_consecutive_windows_partition_time() -> None:
    m = ProgressMonitor(PARAMS)
    # The object overlaps the ego only in the frame at 0.9 s.
    _feed(m, 1.5, 5.0, lambda t: [_car("blip", 5.0 * t + 2.0, 0.0)] if abs(t - 0.9) < 1e-6 else [])
    assert m.check(0.5) is None
    assert m.check(1.0).colliding_ids == ["blip"]
    assert m.check(1.5) is None


def test_a_late_check_covers_the_frames_since_the_last_one() -> None:
    # A timer held up by load: the check due at 1.0 s runs at 1.6 s. Its window starts at the last check
    # (0.5 s), not at 1.6 - T_d = 1.1 s, which would skip the frame at 0.9 s; the check on time at 2.0 s
    # after it starts at 1.6 s (each frame once). a~ is the decision in force at the late window's start.
    m = ProgressMonitor(PARAMS)
    for stamp, code in ((0.4, "CK"), (1.2, "DK")):
        m.on_decision(_decision(stamp, code))
    _feed(m, 2.0, 5.0, lambda t: [_car("blip", 5.0 * t + 2.0, 0.0)] if abs(t - 0.9) < 1e-6 else [])
    assert m.check(0.5) is None
    event = m.check(1.6)
    assert event.colliding_ids == ["blip"] and (event.issued_decision, event.decision_stamp) == ("CK", 0.4)
    assert m.diagnostics.frames_checked == 11  # (0.5, 1.6] at 10 Hz
    assert m.check(2.0) is None and m.diagnostics.frames_checked == 4  # (1.6, 2.0]
    # Beyond the buffers' history the window reaches back only as far as they do; a clock that went
    # back (a replay started again) starts afresh with (now - T_d, now].
    assert m.check(1.0).colliding_ids == ["blip"] and m.diagnostics.frames_checked == 5
    far = ProgressMonitor(PARAMS)
    _feed(far, 30.0, 5.0, lambda t: [])
    far.check(0.5)
    assert far.check(30.0) is None and far.diagnostics.frames_checked == int(round(PARAMS.history / 0.1))


def test_objects_missing_from_frames_are_masked_and_objects_without_position_dropped() -> None:
    m = ProgressMonitor(PARAMS)

    def objects(t: float) -> list[TrackedObject]:
        out = [_car("nan", math.nan, 0.0)]
        if t <= 0.75:  # "ghost" is no longer tracked when the ego reaches its last position
            out.append(_car("ghost", 14.5, 0.0))
        return out

    _feed(m, 1.0, 10.0, objects)
    event = m.check(1.0)  # no collision with the ghost's last position; heading for it was a near miss
    assert event.colliding_ids == [] and set(event.near_misses) == {"ghost"}
    assert m.diagnostics.dropped_objects == 11
    assert m.diagnostics.objects_checked == 1


def test_object_of_unknown_size_still_collides_with_its_default_footprint() -> None:
    # Issue 17: NaN length/width made the monitor drop the object: a collision it could not see.
    m = ProgressMonitor(PARAMS)
    _feed(m, 1.0, 10.0, lambda t: [_car("unsized", 14.5, 0.0, length=math.nan, width=math.nan)])
    event = m.check(1.0)
    assert event is not None and event.colliding_ids == ["unsized"]
    assert m.diagnostics.assumed_objects == 11 and m.diagnostics.dropped_objects == 0


def test_stall_when_slow_under_permissive_lights_only() -> None:
    params = MonitorParameters(decision_period=0.5, stall_window_cycles=4, stall_speed_threshold=0.5)
    m = ProgressMonitor(params)
    _feed(m, 3.0, 0.2, lambda t: [], light=lambda t: TrafficLightPhase.GREEN)
    event = m.check(3.0)
    assert event is not None and event.stall and not event.colliding_ids
    assert m.diagnostics.mean_speed == pytest.approx(0.2)
    m.update_scene(_scene(2.0, 0.2, TrafficLightPhase.RED))  # one red instant in W = {3.0, 2.5, 2.0, 1.5}
    assert m.check(3.0) is None
    assert not m.diagnostics.lights_permissive

    moving = ProgressMonitor(params)
    _feed(moving, 3.0, 0.8, lambda t: [], light=lambda t: TrafficLightPhase.NONE)
    assert moving.check(3.0) is None
    assert moving.diagnostics.mean_speed == pytest.approx(0.8)


def test_no_stall_claim_without_history() -> None:
    m = ProgressMonitor(PARAMS)  # needs 4.5 s of samples
    _feed(m, 3.0, 0.0, lambda t: [])
    assert m.check(3.0) is None
    assert not m.diagnostics.stall_window_full
    _feed(m, 5.0, 0.0, lambda t: [], t_start=3.0)
    assert m.check(5.0).stall  # no light messages at all: phases count as None


def test_out_of_order_stamps_give_the_same_result() -> None:
    def run(shuffle: bool):
        m = ProgressMonitor(PARAMS)
        msgs = [("ego", _ego(k * ODOM_DT, 10.0)) for k in range(21)]
        msgs += [("obj", TrackedObjects(round(k * PERCEPTION_DT, 9), [_car("stopped", 15.5, 0.0)]))
                 for k in range(11)]
        if shuffle:
            random.Random(5).shuffle(msgs)
        for kind, msg in msgs:
            m.update_ego(msg) if kind == "ego" else m.update_objects(msg)
        return m.check(1.0), m.diagnostics.frames_checked

    ordered, shuffled = run(False), run(True)
    assert ordered[0].colliding_ids == shuffled[0].colliding_ids == ["stopped"]
    assert ordered[1] == shuffled[1] == 5


def test_a_wild_future_stamp_does_not_wipe_the_buffers() -> None:
    m = ProgressMonitor(PARAMS)
    _feed(m, 1.0, 10.0, lambda t: [_car("stopped", 15.5, 0.0)])
    m.update_objects(TrackedObjects(1.0e9, []))
    m.update_ego(_ego(1.0e9, 0.0))
    assert m.check(1.0).colliding_ids == ["stopped"]


def test_ego_pose_interpolation_wraps_heading() -> None:
    m = ProgressMonitor(PARAMS)
    # Heading near +-pi: driving towards -x; the samples straddle the wrap-around.
    m.update_ego(EgoState(0.0, 0.0, 0.0, math.pi - 0.05, 0.0))
    m.update_ego(EgoState(0.2, 0.0, 0.0, -math.pi + 0.05, 0.0))
    # A small box 3.5 m along -x: inside the ego box only if the heading is about pi (not about 0).
    m.update_objects(TrackedObjects(0.1, [_car("behind_axle", -3.5, 0.0, 0.0, 0.5, 0.5)]))
    assert m.check(0.2).colliding_ids == ["behind_axle"]


def test_frames_without_an_ego_pose_nearby_are_not_checked() -> None:
    m = ProgressMonitor(PARAMS)
    m.update_ego(_ego(0.0, 0.0))
    m.update_ego(_ego(2.0, 0.0))  # odometry gap of 2 s
    m.update_objects(TrackedObjects(1.0, [_car("on_top", 1.4, 0.0)]))
    assert m.check(1.2) is None
    assert m.diagnostics.frames_checked == 0


def test_issued_decision_falls_back_to_the_first_in_window_and_to_none() -> None:
    m = ProgressMonitor(PARAMS)
    assert m.issued_decision(1.0) == ("", 0.0)
    m.on_decision("DK", stamp=0.8)
    assert m.issued_decision(1.0) == ("DK", 0.8)
    m.on_decision("AK", stamp=0.3)
    assert m.issued_decision(1.0) == ("AK", 0.3)


def test_bad_input_raises_clear_errors() -> None:
    m = ProgressMonitor(PARAMS)
    with pytest.raises(MonitorInputError, match="non-finite"):
        m.update_ego(EgoState(0.0, math.nan, 0.0, 0.0, 1.0))
    with pytest.raises(MonitorInputError, match="objects frame: stamp"):
        m.update_objects(TrackedObjects(math.inf, []))
    with pytest.raises(MonitorInputError, match="SceneDescriptor"):
        m.update_scene(TrafficLightPhase.GREEN)  # type: ignore[arg-type]
    with pytest.raises(MonitorInputError, match="scene: stamp"):
        m.update_scene(_scene(math.nan, 0.0))
    with pytest.raises(MonitorInputError, match="needs its stamp"):
        m.on_decision("CK")
    with pytest.raises(MonitorInputError, match="check time"):
        m.check(math.nan)
    with pytest.raises(ValueError, match="stall_window_cycles"):
        MonitorParameters(stall_window_cycles=0)
    with pytest.raises(ValueError, match="decision_period"):
        MonitorParameters(decision_period=-0.5)


# --------------------------------------------------------------------------------------------------
# What holds the ego; blocked is not a stall
# --------------------------------------------------------------------------------------------------

STALL = MonitorParameters(decision_period=0.5, stall_window_cycles=4, stall_speed_threshold=0.5)


def test_standing_behind_a_stopped_car_is_blocked_not_a_stall_and_never_asks_to_accelerate() -> None:
    # The make-demo case of the issue: the ego stands 0.5 m behind a stationary car in its lane.
    gap = 0.5
    centre_ahead = gap + (5.176 + 4.5) / 2.0
    m = ProgressMonitor(STALL)
    m.on_decision("CK", stamp=2.4)
    _feed(m, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [_described("parked", centre_ahead)])
    event = m.check(3.0)
    assert event is not None
    assert not event.stall and event.blocked and event.blocked_by == "parked"
    assert m.diagnostics.hold.startswith("leader: vehicle parked 0.5 m ahead at 0.0 m/s")
    # The failure text says what happened; it does not claim that nothing required the stop.
    text = PromptManager.failure_text(event)
    assert "stood behind the stopped object parked" in text and "no red light or obstacle" not in text
    # A lasting blocked ego is reported once per cooldown, as a stall would be.
    gate = FailureGate(cooldown=5.0)
    assert gate.admit(event).blocked_by == "parked"
    assert gate.admit(m.check(3.0)) is None


def test_a_slower_leader_within_the_stopping_distance_holds_the_ego_a_leaving_one_does_not() -> None:
    crawling = ProgressMonitor(STALL)
    _feed(crawling, 3.0, 0.3, lambda t: [], scene_objects=lambda t: [_described("queue", 9.0, speed=0.4)])
    assert crawling.check(3.0) is None  # queued behind a crawling car: neither a stall nor blocked
    assert crawling.diagnostics.hold.startswith("leader: vehicle queue")

    leaving = ProgressMonitor(STALL)  # the leader drives off at 3 m/s and the ego stays put
    _feed(leaving, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [_described("gone", 6.0 + 3.0 * t, speed=3.0)])
    event = leaving.check(3.0)
    assert event is not None and event.stall and not event.blocked

    far = ProgressMonitor(STALL)  # a stopped car 30 m ahead does not explain standing still here
    _feed(far, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [_described("far", 30.0)])
    assert far.check(3.0).stall

    beside = ProgressMonitor(STALL)  # a stopped car in the next lane holds nothing
    _feed(beside, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [_described("side", 5.0, lateral=3.5,
                                                                                relation=LEFT_LANE)])
    assert beside.check(3.0).stall


def test_a_crossing_pedestrian_holds_the_ego_one_walking_away_does_not() -> None:
    crossing = ProgressMonitor(STALL)  # 6 m ahead, 4 m to the right, walking left at 1.4 m/s
    _feed(crossing, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [
        _described("ped0", 6.0, 1.4, -4.0, FIELD_OF_VIEW, ObjectClass.PEDESTRIAN, math.pi / 2, 0.6)])
    assert crossing.check(3.0) is None
    assert crossing.diagnostics.hold.startswith("vru: pedestrian ped0")

    away = ProgressMonitor(STALL)  # the same pedestrian walking away from the ego path
    _feed(away, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [
        _described("ped0", 6.0, 1.4, -4.0, FIELD_OF_VIEW, ObjectClass.PEDESTRIAN, -math.pi / 2, 0.6)])
    assert away.check(3.0).stall


def test_blocked_needs_the_stopped_leader_at_every_instant() -> None:
    # Stopped car for the first half of the window, then it moves on (the ego is slow to follow):
    # held at some instants, free at others -> neither blocked nor a stall.
    m = ProgressMonitor(STALL)
    _feed(m, 3.0, 0.0, lambda t: [], scene_objects=lambda t: [
        _described("lead", 6.0 + max(0.0, t - 2.2) * 3.0, speed=0.0 if t < 2.2 else 3.0)])
    assert m.check(3.0) is None


def test_hold_parameters_scale_the_stopping_distance() -> None:
    scene = _scene(0.0, 10.0, objects=(_described("slow", 30.0, speed=5.0),))
    # 10 m/s: 8 + 15 + 16.7 m of reach; the slower car 30 m ahead (25.2 m bumper gap) holds the ego.
    assert hold_of(scene, 0.5).object_id == "slow"
    assert hold_of(scene, 0.5, HoldParameters(hold_headway=0.0)) is None  # 24.7 m of reach
    with pytest.raises(ValueError, match="hold_deceleration"):
        HoldParameters(hold_deceleration=0.0)


def test_a_collision_says_its_nuplan_type_a_pedestrian_walking_into_a_standing_ego_is_not_at_fault() -> None:
    m = ProgressMonitor()
    for k in range(21):
        m.update_ego(_ego(k * ODOM_DT, 0.0))  # the ego stands at the origin
    for k in range(11):  # a pedestrian walks into the ego's side
        t = round(k * PERCEPTION_DT, 9)
        m.update_objects(TrackedObjects(t, [TrackedObject("ped0", ObjectClass.PEDESTRIAN, 1.5, -2.2 + 1.4 * t,
                                                          math.pi / 2, 0.0, 1.4, 0.6, 0.6)]))
    event = m.check(1.0)
    assert event.colliding_ids == ["ped0"]
    assert event.collision_kinds == {"ped0": "STOPPED_EGO"}
    # Still overlapping at the next check: the type of the first contact is kept.
    for k in range(21, 31):
        m.update_ego(_ego(k * ODOM_DT, 0.0))
    for k in range(11, 16):
        m.update_objects(TrackedObjects(round(k * PERCEPTION_DT, 9), [
            TrackedObject("ped0", ObjectClass.PEDESTRIAN, 1.5, -0.8, math.pi / 2, 0.0, 1.4, 0.6, 0.6)]))
    assert m.check(1.5).collision_kinds == {"ped0": "STOPPED_EGO"}

    moving = ProgressMonitor()
    _feed(moving, 1.0, 10.0, lambda t: [_car("stopped", 15.5, 0.0)])
    assert moving.check(1.0).collision_kinds == {"stopped": "STOPPED_TRACK"}


def _lead_that_leaves(t: float) -> list[TrackedObject]:
    """A car 4 m/s ahead in the ego lane that a 10 m/s ego closes in on; it changes lanes after 0.8 s.
    Bumper gap 7.7 - 6 t m, so the projected time to collision is 0.7 s at 0.6 s and 0.5 s at 0.8 s."""
    return [TrackedObject("lead", ObjectClass.VEHICLE, 14.0 + 4.0 * t, 0.0 if t <= 0.8 + 1e-9 else 3.5, 0.0,
                          4.0, 0.0, 4.5, 1.9)]


def test_a_projected_time_to_collision_below_the_bound_is_a_near_miss() -> None:
    m = ProgressMonitor(PARAMS)
    m.on_decision(_decision(0.5, "CK"))
    _feed(m, 1.0, 10.0, _lead_that_leaves)
    event = m.check(1.0)
    assert event is not None and event.near_miss and not event.collision and not event.stall
    assert event.near_misses == {"lead": pytest.approx(0.5)}
    assert event.issued_decision == "CK"
    assert m.diagnostics.min_time_to_collision == pytest.approx(0.5)
    # The same drive with the check off, and the window before the lead came close: nothing.
    off = ProgressMonitor(MonitorParameters(decision_period=0.5, stall_window_cycles=10, near_miss_ttc=0.0))
    _feed(off, 1.0, 10.0, _lead_that_leaves)
    assert off.check(1.0) is None
    early = ProgressMonitor(PARAMS)
    _feed(early, 0.2, 10.0, _lead_that_leaves)
    assert early.check(0.2) is None and early.diagnostics.min_time_to_collision > 0.95


def test_no_near_miss_from_behind_or_while_standing_and_none_for_an_object_that_collided() -> None:
    behind = ProgressMonitor(PARAMS)  # a faster car closing in from behind (0.4 s at 1 s): nuPlan looks ahead only
    _feed(behind, 1.0, 10.0, lambda t: [TrackedObject("rear", ObjectClass.VEHICLE, -12.0 + 16.0 * t, 0.0, 0.0,
                                                       16.0, 0.0, 4.5, 1.9)])
    assert behind.check(1.0) is None
    standing = ProgressMonitor(PARAMS)  # the ego stands; a car drives towards it and stops 1 m short
    _feed(standing, 1.0, 0.0, lambda t: [TrackedObject("oncoming", ObjectClass.VEHICLE, 9.0 - 2.0 * min(t, 0.9),
                                                        0.0, math.pi, 2.0, 0.0, 4.5, 1.9)])
    assert standing.check(1.0) is None
    hit = ProgressMonitor(PARAMS)  # approached, then touched: a collision, not also a near miss
    _feed(hit, 1.0, 10.0, lambda t: [_car("stopped", 15.5, 0.0)])
    event = hit.check(1.0)
    assert event.colliding_ids == ["stopped"] and not event.near_miss


def test_in_a_junction_the_near_miss_check_looks_wider_as_nuplans_rule() -> None:
    # A car crossing from the left, 35 deg off the ego heading (projected TTC 0.6 s at 0.6 s): outside the
    # 30 deg cone on a plain road, relevant in a junction (the scene descriptor says the ego is in one).
    def crossing(t: float) -> list[TrackedObject]:
        return [TrackedObject("cross", ObjectClass.VEHICLE, 16.0, 11.8 - 8.0 * t, -math.pi / 2, 0.0, -8.0, 4.5, 1.9)]

    def junction_scene(m: ProgressMonitor, in_junction: bool) -> None:
        for k in range(11):
            scene = _scene(round(k * PERCEPTION_DT, 9), 10.0)
            scene.road_section = RoadSection.JUNCTION if in_junction else RoadSection.NORMAL_MULTI_LANE
            m.update_scene(scene)

    results = {}
    for in_junction in (False, True):
        m = ProgressMonitor(PARAMS)
        junction_scene(m, in_junction)
        _feed(m, 0.6, 10.0, crossing)
        results[in_junction] = m.check(0.6)
    assert results[False] is None
    assert results[True] is not None and results[True].near_misses == {"cross": pytest.approx(0.6)}
