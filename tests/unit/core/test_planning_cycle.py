"""The planner node's cycle policy (luna_core.planning.cycle), without ROS: degraded modes, the decision
contract's staleness report, and what the planner itself says, with a real planner (IDM) and a real
failing one."""

from __future__ import annotations

import math

import numpy as np

from luna_core.decision import DecisionTiming
from luna_core.planning.cycle import ERROR, WARN, Condition, CycleInputs, CyclePolicy, instant_missing, plan_cycle
from luna_core.planning.factory import make_planner
from luna_core.types import EgoState, LaneGraph, PlannerInput, Route, Trajectory, VehicleParameters
from tests import samples

POLICY = CyclePolicy(max_input_age=1.0, timing=DecisionTiming(period=2.0), follows_decisions=True)


def history(now: float, velocity: float = 8.0) -> list[EgoState]:
    return [EgoState(round(now - 0.1 * k, 3), 20.0 - 0.8 * k, 0.0, 0.0, velocity) for k in range(5, -1, -1)]


def inputs(now: float = 10.0, **changes) -> CycleInputs:
    base = dict(now=now, history=history(now), graph=samples.lane_graph(), route=Route(now, ["r0", "j"]),
                decision=None)
    base.update(changes)
    return CycleInputs(**base)


def is_stop(t: Trajectory) -> bool:
    return t.velocity[-1] < 0.1 and np.all(np.diff(t.velocity) <= 1e-9)


class Failing:
    """A planner that raises, as a broken one would."""

    def plan(self, pin: PlannerInput) -> Trajectory:
        raise RuntimeError("model file vanished")


def test_nominal_cycle_plans_with_the_planner_and_clears_conditions():
    out = plan_cycle(make_planner("idm"), inputs(), POLICY)
    assert out.planned and out.trajectory is not None and out.trajectory.stamp == 10.0
    assert out.conditions["inputs"] is None and out.conditions["planning"] is None
    # No decision for a planner that follows decisions: reported, the planner still plans.
    assert out.conditions["decision"] == Condition(WARN, "no valid decision received: fallback objective without "
                                                         "the decision term")


def test_decision_in_force_and_stale_by_the_contract_timing():
    fresh = samples.decision()  # stamp 13.0
    out = plan_cycle(make_planner("idm"), inputs(now=16.0, decision=fresh), POLICY)
    assert out.conditions["decision"] is None  # 3 s old <= 2 T_d = 4 s
    out = plan_cycle(make_planner("idm"), inputs(now=17.5, decision=fresh), POLICY)
    assert out.conditions["decision"] == Condition(WARN, "decision is stale (4.50 s old > 4.00 s = 2 T_d): "
                                                         "fallback objective without the decision term")
    quiet = CyclePolicy(1.0, DecisionTiming(2.0), follows_decisions=False)
    assert plan_cycle(make_planner("idm"), inputs(now=17.5, decision=fresh), quiet).conditions["decision"] is None


def test_no_odometry_publishes_nothing():
    out = plan_cycle(make_planner("idm"), inputs(history=[]), POLICY)
    assert out.trajectory is None and not out.planned
    assert out.conditions == {"inputs": Condition(WARN, "waiting for odometry: nothing to plan from")}


def test_missing_map_empty_map_or_stale_odometry_stop_comfortably():
    out = plan_cycle(make_planner("idm"), inputs(graph=None), POLICY)
    assert not out.planned and is_stop(out.trajectory)
    assert out.conditions["inputs"] == Condition(WARN, "waiting for lane graph: comfortable stop")
    out = plan_cycle(make_planner("idm"), inputs(graph=LaneGraph()), POLICY)
    assert not out.planned and is_stop(out.trajectory)
    assert out.conditions["planning"] == Condition(WARN, "lane graph has no lanes: comfortable stop straight ahead")
    out = plan_cycle(make_planner("idm"), inputs(now=12.0, history=history(10.5)), POLICY)
    assert not out.planned and is_stop(out.trajectory) and out.trajectory.stamp == 12.0
    assert out.conditions["inputs"] == Condition(WARN, "odometry is stale (1.50 s old)")


def test_the_planner_input_carries_the_configured_vehicle():
    seen = []

    class Recording:
        def plan(self, pin: PlannerInput) -> Trajectory:
            seen.append(pin.vehicle)
            return make_planner("idm").plan(pin)

    truck = VehicleParameters(width=2.6, front_length=7.5, rear_length=1.5, wheelbase=5.5)
    policy = CyclePolicy(1.0, DecisionTiming(2.0), follows_decisions=False, vehicle=truck)
    assert plan_cycle(Recording(), inputs(), policy).planned and seen == [truck]
    plan_cycle(Recording(), inputs(), POLICY)
    assert seen[-1] == VehicleParameters()


def test_planner_failure_stops_comfortably_and_is_counted():
    out = plan_cycle(Failing(), inputs(), POLICY)
    assert not out.planned and is_stop(out.trajectory) and all(map(math.isfinite, out.trajectory.x))
    assert out.conditions["planning"] == Condition(ERROR, "planner failed (model file vanished): comfortable stop")
    assert out.counts == ["planner_failures"]


def test_an_instant_is_complete_with_its_odometry_acceleration_inputs_and_decision():
    from luna_core.ego_history import EgoHistory
    from luna_core.types import TrackedObjects, TrafficLights

    ego = EgoHistory()
    for state in history(4.0):
        ego.add_state(state)
    at = inputs(now=4.0, history=[], objects=TrackedObjects(4.0), lights=None)
    waiting = CyclePolicy(1.0, DecisionTiming(period=2.0), follows_decisions=True)
    assert instant_missing(ego, at, waiting) == ["decision (latest never)"], \
        "4.0 is a decision instant (T_d = 2 s): its decision is due"
    assert instant_missing(ego, inputs(now=4.0, objects=TrackedObjects(4.0), decision=samples.decision()),
                           waiting) == [], "a decision stamped after the instant counts as in"
    no_decisions = CyclePolicy(1.0, DecisionTiming(period=2.0), follows_decisions=False)
    assert instant_missing(ego, at, no_decisions) == []
    assert instant_missing(ego, inputs(now=4.0, lights=TrafficLights(3.9)), no_decisions) == \
        ["lights (latest 3.90 s)"]
    assert instant_missing(ego, inputs(now=4.0, route=None), no_decisions) == ["route"]
    ego.add_acceleration(3.9, 0.0)  # the acceleration topic is heard: the instant's own is awaited
    assert instant_missing(ego, at, no_decisions) == ["acceleration (latest 3.90 s)"]
    ego.add_acceleration(4.0, 0.0)
    assert instant_missing(ego, at, no_decisions) == []
    assert instant_missing(ego, inputs(now=4.1), no_decisions) == ["odometry (latest 4.00 s)",
                                                                   "acceleration (latest 4.00 s)"], \
        "odometry of 4.1 not in, nor its acceleration"


def test_what_the_planner_says_of_its_cycle_is_counted():
    class Reporting:
        """The IDM planner, reporting a decision cycle where a* flipped and safety first overruled Eq. 22."""

        def __init__(self, info: dict) -> None:
            self.info = info

        def plan(self, pin: PlannerInput) -> Trajectory:
            return make_planner("idm").plan(pin)

        def cycle_info(self) -> dict:
            return self.info

    out = plan_cycle(Reporting({"mode": "decision", "flip": True, "safety_gated": True}), inputs(), POLICY)
    assert out.planned and out.counts == ["mode_decision", "decision_flips", "safety_gated"]
    out = plan_cycle(Reporting({"mode": "least_bad", "flip": False, "safety_gated": False}), inputs(), POLICY)
    assert out.counts == ["mode_least_bad"]
