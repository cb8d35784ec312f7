"""Hindsight check (luna_core.hindsight): the alternatives of a failed decision rolled out from its state
against what was perceived after it, with the teacher's rollouts; the observation a node records; the
grounded revision and the check of other answers against it."""

from __future__ import annotations

import json
import math

import pytest

from luna_core.hindsight import (HindsightConfig, HindsightError, HindsightObservation, HindsightRecorder,
                                 crop_lane_graph, hindsight_check, observed_boxes)
from luna_core.lanes import make_lane
from luna_core.prompts.parsers import action_name_errors, parse_ranked_answer
from luna_core.types import (ACTION_CODES, EgoState, LaneGraph, ObjectClass, Route, TrackedObject, TrackedObjects,
                             TrafficLights, TrafficLightPhase, TrafficLightState, VehicleParameters)

FRONT = VehicleParameters().front_length  # rear axle -> front bumper
KEEP_ONLY = ["AK", "CK", "DK", "SK"]


def road(lanes: int = 2) -> LaneGraph:
    """A straight road along +x: lane a0 at y = 0, a1 (left of it) at y = 3.5; 15 m/s limit."""
    g = LaneGraph()
    g.add(make_lane("a0", [[-50, 0], [400, 0]], 3.5, 15.0, "A", left_neighbor="a1" if lanes > 1 else ""))
    if lanes > 1:
        g.add(make_lane("a1", [[-50, 3.5], [400, 3.5]], 3.5, 15.0, "A", right_neighbor="a0"))
    return g


def car(object_id: str, x: float, y: float = 0.0, vx: float = 0.0) -> TrackedObject:
    return TrackedObject(object_id, ObjectClass.VEHICLE, x, y, 0.0, vx, 0.0, 4.5, 1.9)


def observe(objects_at, speed: float = 0.0, lanes: int = 2, lights_at=None) -> HindsightObservation:
    """What a node records: the ego driving along a0 at ``speed`` and 10 Hz frames ``objects_at(t)``
    for 8 s; the observation of the decision at t = 0."""
    rec = HindsightRecorder()
    rec.set_map(road(lanes))
    rec.set_route(Route(0.0, ["A"]))
    for k in range(81):
        t = round(0.1 * k, 9)
        rec.update_ego(EgoState(t, speed * t, 0.0, 0.0, speed))
        rec.update_objects(TrackedObjects(t, objects_at(t)))
        if lights_at is not None:
            rec.update_lights(lights_at(t))
    assert rec.observed(0.0, 8.0) and not rec.observed(0.0, 5.0)
    return rec.observation(0.0)


@pytest.mark.parametrize("gap,lanes", [(0.5, 2), (7.5, 2), (7.5, 1)])
def test_blocked_behind_a_stopped_car_never_yields_accelerate(gap, lanes):
    # The make-demo case of the issue (0.5 m behind a stationary car) and a longer standstill gap.
    obs = observe(lambda t: [car("parked", FRONT + gap + 2.25)], lanes=lanes)
    allowed = list(ACTION_CODES[:1]) + ["AL", "CK", "CL", "DK", "DL", "SK"] if lanes > 1 else KEEP_ONLY
    for executed in ("SK", "CK", "AK"):
        verdict = hindsight_check(obs, allowed, executed)
        assert "AK" not in verdict.safe and "AK" not in verdict.listed
        assert verdict.unsafe["AK"].startswith("cannot be executed as asked")
        assert "behind parked" in verdict.unsafe["AK"]
    # Standing behind it was as good as anything: nothing to write (no lesson "accelerate").
    assert not hindsight_check(obs, allowed, "SK").revise
    # Had it accelerated, the revision is to stand (never AK).
    verdict = hindsight_check(obs, allowed, "AK")
    assert verdict.revise and verdict.best in ("SK", "DK", "CK")


def test_behind_a_stalled_car_the_revision_goes_around_it_in_the_free_lane():
    # 10 m/s towards a car standing 45 m ahead; the left lane is free (the teacher's own case).
    obs = observe(lambda t: [car("stalled", 45.0)], speed=10.0)
    verdict = hindsight_check(obs, ["AK", "AL", "CK", "CL", "DK", "DL", "SK"], "CK")
    assert verdict.revise and verdict.best in ("CL", "AL")
    assert "CK" in verdict.unsafe and "AK" in verdict.unsafe
    answer = verdict.answer()
    parsed = parse_ranked_answer(answer, ["AK", "AL", "CK", "CL", "DK", "DL", "SK"], kind="reflection")
    assert parsed.ranked[0] == verdict.best and set(parsed.ranked) <= set(verdict.safe)
    assert action_name_errors(answer) == []
    assert f"- {verdict.best}: " in answer and "CK instead: blocked behind stalled." in answer


def test_a_revision_that_collides_in_hindsight_is_rejected():
    # A car alongside in the left lane at the ego's speed; a stalled car 35 m ahead in the ego lane.
    obs = observe(lambda t: [car("beside", 1.0 + 8.0 * t, 3.5, 8.0), car("stalled", 35.0)], speed=8.0)
    allowed = ["AK", "AL", "CK", "CL", "DK", "DL", "SK"]
    verdict = hindsight_check(obs, allowed, "CK")
    assert verdict.outcomes["CL"].collision and "collides with beside" in verdict.unsafe["CL"]
    assert verdict.revise and verdict.best in ("DK", "SK") and "CL" not in verdict.listed
    assert verdict.disagreement(["CL", verdict.best]).startswith("the answer ranks CL first")
    assert verdict.disagreement([verdict.best, "CL"]) == \
        f"the answer lists actions that are unsafe in hindsight: CL {verdict.unsafe['CL']}"
    assert verdict.disagreement(verdict.listed) == ""


def test_standing_at_a_red_light_is_no_stall_and_gets_no_revision():
    # Road A ends at x = 10 in a junction lane J (red), then road B: the ego stands 6 m before the line.
    g = LaneGraph()
    g.add(make_lane("a0", [[-50, 0], [10, 0]], 3.5, 15.0, "A", successors=["j0"]))
    g.add(make_lane("j0", [[10, 0], [30, 0]], 3.5, 15.0, "J", predecessors=["a0"], successors=["b0"], in_junction=True))
    g.add(make_lane("b0", [[30, 0], [300, 0]], 3.5, 15.0, "B", predecessors=["j0"]))
    rec = HindsightRecorder()
    rec.set_map(g)
    rec.set_route(Route(0.0, ["A", "J", "B"]))
    red = [TrafficLightState("j0", TrafficLightPhase.RED)]
    for k in range(81):
        t = round(0.1 * k, 9)
        rec.update_ego(EgoState(t, 10.0 - FRONT - 6.0, 0.0, 0.0, 0.0))
        rec.update_objects(TrackedObjects(t, []))
        rec.update_lights(TrafficLights(t, red))
    obs = rec.observation(0.0)
    assert obs.stop_lanes[0] == ["j0"] and obs.stop_lanes[-1] == ["j0"]
    verdict = hindsight_check(obs, KEEP_ONLY, "SK")
    assert not verdict.revise and "SK" in verdict.safe and "AK" in verdict.unsafe


def test_observation_round_trips_through_json_and_gives_the_same_verdict():
    obs = observe(lambda t: [car("stalled", 40.0), car("beside", 1.0 + 8.0 * t, 3.5, 8.0)], speed=8.0)
    back = HindsightObservation.from_dict(json.loads(json.dumps(obs.to_dict(), allow_nan=False)))
    allowed = ["AK", "AL", "CK", "CL", "DK", "DL", "SK"]
    a, b = hindsight_check(obs, allowed, "CK"), hindsight_check(back, allowed, "CK")
    assert a.listed == b.listed and a.safe == b.safe
    assert all(math.isclose(a.outcomes[c].score, b.outcomes[c].score, abs_tol=1e-6) for c in allowed)
    with pytest.raises(HindsightError, match="malformed hindsight observation"):
        HindsightObservation.from_dict({"time": 0.0})


def test_observed_boxes_interpolate_park_unseen_objects_and_continue_lost_ones():
    ego = EgoState(0.0, 0.0, 0.0, 0.0, 5.0)
    frames = [TrackedObjects(0.2 * k, [car("a", 10.0 + 2.0 * k, vx=10.0)] + ([car("late", 30.0)] if k >= 5 else []))
              for k in range(6)]  # frames every 0.2 s up to 1.0 s
    boxes = observed_boxes(frames, ego, 0.0, 20, 0.1, 80.0)
    a, late = boxes.ids.index("a"), boxes.ids.index("late")
    assert boxes.pose[a, 1, 0] == pytest.approx(11.0)  # between frames
    assert boxes.pose[a, 15, 0] == pytest.approx(25.0)  # 0.5 s after the last frame, at 10 m/s
    assert boxes.pose[late, 9, 0] > 1e5 and boxes.pose[late, 10, 0] == pytest.approx(30.0)
    assert boxes.speed[a] == pytest.approx(10.0)
    assert observed_boxes(frames, ego, 0.0, 20, 0.1, 5.0).ids == []  # nothing within 5 m


def test_recorder_without_a_map_or_an_ego_sample_says_so():
    rec = HindsightRecorder()
    with pytest.raises(HindsightError, match="no lane graph"):
        rec.observation(0.0)
    rec.set_map(road())
    rec.set_route(Route(0.0, ["A"]))
    rec.update_ego(EgoState(5.0, 0.0, 0.0, 0.0, 0.0))
    with pytest.raises(HindsightError, match="no ego state within 0.3 s"):
        rec.observation(0.0)
    cropped = crop_lane_graph(road(), 0.0, 0.0, 10.0)
    assert set(cropped.lanes) == {"a0", "a1"}
    assert crop_lane_graph(road(), 1000.0, 1000.0, 10.0).lanes == {}


def test_a_decision_is_checked_on_the_map_and_route_it_was_made_on():
    rec = HindsightRecorder()
    first, second = road(1), road(2)
    first.stamp, second.stamp = 0.0, 100.0  # the next scenario of a lock-step run brings its own map
    rec.set_map(first)
    rec.set_route(Route(0.0, ["A"]))
    rec.set_map(second)
    rec.set_route(Route(100.0, ["A"]))
    for t in (5.0, 105.0):
        rec.update_ego(EgoState(t, 0.0, 0.0, 0.0, 0.0))
    assert set(rec.observation(5.0).lane_graph.lanes) == {"a0"}
    assert set(rec.observation(105.0).lane_graph.lanes) == {"a0", "a1"}
    rec.prune(130.0)  # keep = 30 s: the first map goes, the one in force at 100 s stays
    assert set(rec.observation(105.0).lane_graph.lanes) == {"a0", "a1"}


def test_after_a_collision_or_near_miss_the_recorder_gives_the_earlier_decisions_with_their_observations():
    import numpy as np

    from luna_core.types import DecisionDistribution, FailureEvent

    rec = HindsightRecorder(HindsightConfig(earlier_decisions=2))
    rec.set_map(road())
    rec.set_route(Route(0.0, ["A"]))
    for k in range(101):
        rec.update_ego(EgoState(round(0.1 * k, 9), 0.8 * k, 0.0, 0.0, 8.0))
    decisions = [DecisionDistribution(t, np.eye(10)[3]) for t in (0.0, 2.0, 4.0, 6.0)]
    collision = FailureEvent(8.0, "CK", 6.0, ["stalled"])
    assert [d.stamp for d, _ in rec.earlier(decisions, collision)] == [4.0, 2.0]
    assert [o.time for _, o in rec.earlier(decisions, collision)] == [4.0, 2.0]
    near_miss = FailureEvent(8.0, "CK", 6.0, near_misses={"stalled": 0.4})  # as after a collision
    assert [d.stamp for d, _ in rec.earlier(decisions, near_miss)] == [4.0, 2.0]
    assert rec.earlier(decisions, FailureEvent(8.0, "CK", 6.0, [], True)) == []  # a stall: the failed one only
