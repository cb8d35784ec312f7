"""Progress monitor (luna_core.monitor): collisions over the last T_d, stall detection (Eq. 23),
failure tuple (Eq. 24), stamp alignment and bad input."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from luna_core.monitor import MonitorInputError, MonitorParameters, ProgressMonitor
from luna_core.types import (DecisionDistribution, EgoState, ObjectClass, TrackedObject, TrackedObjects,
                             TrafficLightPhase)

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


def _feed(monitor: ProgressMonitor, t_end: float, speed: float, objects_at, t_start: float = 0.0,
          light=None) -> None:
    """Drive straight along +x at ``speed``; ``objects_at(t)`` lists the objects perceived at t."""
    for k in range(int(round((t_end - t_start) / ODOM_DT)) + 1):
        monitor.update_ego(_ego(t_start + k * ODOM_DT, speed))
    for k in range(int(round((t_end - t_start) / PERCEPTION_DT)) + 1):
        t = round(t_start + k * PERCEPTION_DT, 9)
        monitor.update_objects(TrackedObjects(t, objects_at(t)))
        if light is not None:
            monitor.update_light(t, light(t))


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


def test_objects_missing_from_frames_are_masked_and_nan_objects_dropped() -> None:
    m = ProgressMonitor(PARAMS)

    def objects(t: float) -> list[TrackedObject]:
        out = [_car("nan", math.nan, 0.0)]
        if t <= 0.75:  # "ghost" is no longer tracked when the ego reaches its last position
            out.append(_car("ghost", 14.5, 0.0))
        return out

    _feed(m, 1.0, 10.0, objects)
    assert m.check(1.0) is None
    assert m.diagnostics.dropped_objects == 11
    assert m.diagnostics.objects_checked == 1


def test_stall_when_slow_under_permissive_lights_only() -> None:
    params = MonitorParameters(decision_period=0.5, stall_window_cycles=4, stall_speed_threshold=0.5)
    m = ProgressMonitor(params)
    _feed(m, 3.0, 0.2, lambda t: [], light=lambda t: TrafficLightPhase.GREEN)
    event = m.check(3.0)
    assert event is not None and event.stall and not event.colliding_ids
    assert m.diagnostics.mean_speed == pytest.approx(0.2)
    m.update_light(2.0, TrafficLightPhase.RED)  # one red instant in W = {3.0, 2.5, 2.0, 1.5}
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
    with pytest.raises(MonitorInputError, match="TrafficLightPhase"):
        m.update_light(0.0, "Green")  # type: ignore[arg-type]
    with pytest.raises(MonitorInputError, match="needs its stamp"):
        m.on_decision("CK")
    with pytest.raises(MonitorInputError, match="check time"):
        m.check(math.nan)
    with pytest.raises(ValueError, match="stall_window_cycles"):
        MonitorParameters(stall_window_cycles=0)
    with pytest.raises(ValueError, match="decision_period"):
        MonitorParameters(decision_period=-0.5)
