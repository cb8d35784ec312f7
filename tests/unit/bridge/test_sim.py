"""Closed-loop simulator: log replay, planner failures, replanning, reactive IDM agents, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.lanes import make_lane
from luna_core.types import (ACTION_CODES, DecisionDistribution, EgoState, LaneGraph, ObjectClass, PlannerInput,
                             Route, Trajectory, TrafficLightPhase)
from luna_bridge.scenario import SIM_DT, AgentTrack, Scenario, TrafficLightTimeline
from luna_bridge.sim import LogReplayPlanner, SimulationConfig, simulate
from luna_bridge.sim.agents import driven_path, straight_end


def _track(track_id: str, t0: float, x: np.ndarray, y: float, v: np.ndarray, cls=ObjectClass.VEHICLE,
           length: float = 4.5, width: float = 1.9) -> AgentTrack:
    n = len(x)
    return AgentTrack(track_id, cls, length, width, t0 + SIM_DT * np.arange(n), np.asarray(x, float),
                      np.full(n, y), np.zeros(n), np.asarray(v, float), np.zeros(n))


def straight_scenario(ego_speed: float = 8.0, agents: list[AgentTrack] | None = None,
                      lights: list[TrafficLightTimeline] | None = None, duration: float = 6.0) -> Scenario:
    """Two-lane straight road along +x; the expert drives lane 0 (y = 0) at constant speed."""
    g = LaneGraph()
    g.add(make_lane("a0", [[-50, 0], [150, 0]], 3.5, 15.0, "A", successors=["b0"], left_neighbor="a1"))
    g.add(make_lane("a1", [[-50, 3.5], [150, 3.5]], 3.5, 15.0, "A", right_neighbor="a0"))
    g.add(make_lane("b0", [[150, 0], [400, 0]], 3.5, 15.0, "B", predecessors=["a0"]))
    n = int(round((duration + 2.0) / SIM_DT)) + 1
    t = -2.0 + SIM_DT * np.arange(n)
    expert = _track("ego", -2.0, ego_speed * t, 0.0, np.full(n, ego_speed))
    return Scenario("straight", "following_lane_with_lead", g, Route(0.0, ["A", "B"]),
                    EgoState(0.0, 0.0, 0.0, 0.0, ego_speed), expert, agents or [], lights or [], duration)


def test_log_replay_follows_the_expert_and_is_deterministic() -> None:
    sc = straight_scenario()
    log = simulate(sc, LogReplayPlanner(sc))
    assert len(log.t) == sc.num_steps == 61
    e = log.ego_array()
    np.testing.assert_allclose(e[:, 0], 8.0 * log.t, atol=0.05)
    assert np.max(np.abs(e[:, 1])) < 1e-6
    assert log.planner_failures == 0 and len(log.planner_latency) == 60
    again = simulate(sc, LogReplayPlanner(sc))
    np.testing.assert_array_equal(again.ego_array(), e)


class _Recorder:
    name = "recorder"

    def __init__(self, inner) -> None:
        self.inner = inner
        self.inputs: list[PlannerInput] = []

    def reset(self) -> None:
        self.inputs.clear()

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        self.inputs.append(planner_input)
        return self.inner.plan(planner_input)


def test_planner_input_history_objects_and_replan_period() -> None:
    lead = _track("lead", 0.0, 30.0 + 8.0 * np.arange(61) * SIM_DT, 0.0, np.full(61, 8.0))
    sc = straight_scenario(agents=[lead])
    rec = _Recorder(LogReplayPlanner(sc))
    log = simulate(sc, rec, config=SimulationConfig(replan_every=5))
    np.testing.assert_allclose(log.plan_times, np.arange(0.0, 6.0, 0.5))
    first = rec.inputs[0]
    assert len(first.ego_history) == 21  # 2 s of logged history + the current state
    assert first.ego_history[0].stamp == pytest.approx(-2.0) and first.ego.stamp == 0.0
    assert [o.id for o in first.objects.objects] == ["lead"]
    assert rec.inputs[3].time == pytest.approx(1.5)
    assert rec.inputs[3].objects.objects[0].x == pytest.approx(30.0 + 8.0 * 1.5)
    assert first.route.road_ids == ["A", "B"] and "a0" in first.lane_graph.lanes


class _Broken:
    name = "broken"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def reset(self) -> None:
        pass

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        if self.mode == "raise":
            raise RuntimeError("boom")
        t = np.arange(10) * 0.1
        return Trajectory(planner_input.time, t, np.full(10, np.nan), t, t, t, t)


@pytest.mark.parametrize("mode,text", [("raise", "raised RuntimeError: boom"), ("nan", "NaN")])
def test_planner_failure_is_logged_and_the_ego_stops(mode: str, text: str) -> None:
    sc = straight_scenario(ego_speed=6.0)
    log = simulate(sc, _Broken(mode))
    assert log.planner_failures == 60
    assert text in log.failure_messages[0] and log.failure_messages[0].startswith("t=0.0s")
    v = log.ego_array()[:, 3]
    assert v[-1] < 0.3 and np.all(np.diff(v) <= 1e-6)
    assert np.max(np.abs(np.diff(v))) / SIM_DT <= 3.0 + 1e-6  # comfortable


def test_reactive_agent_stops_behind_a_stopped_ego_where_the_log_drives_through() -> None:
    # The ego log stands still at x = 0; a logged car from behind drives straight through it.
    n = 101
    follower = _track("follower", 0.0, -40.0 + 8.0 * np.arange(n) * SIM_DT, 0.0, np.full(n, 8.0))
    sc = straight_scenario(ego_speed=0.0, agents=[follower], duration=10.0)
    nr = simulate(sc, LogReplayPlanner(sc), reactive=False)
    r = simulate(sc, LogReplayPlanner(sc), reactive=True)
    ego_rear_bumper = -sc.vehicle.rear_length
    nr_x = [objs.objects[0].x for objs in nr.objects]
    r_x = [objs.objects[0].x for objs in r.objects]
    assert max(nr_x) + 4.5 / 2 > ego_rear_bumper  # the replayed log runs into the ego
    assert max(r_x) + 4.5 / 2 < ego_rear_bumper - 0.5  # the IDM agent keeps a gap
    assert r.objects[-1].objects[0].speed < 0.5


def test_reactive_agent_never_turns_round_on_a_log_that_jitters_back_at_its_end() -> None:
    # A recorded car drives 3 m/s for 2 s and stands for 6 s, its position jittering 1 cm back and forth
    # (as recorded CommonRoad tracks do); the last logged step is a backward one.
    n = 81
    x = 20.0 + np.minimum(np.arange(n), 20) * 0.3
    x[21:] += np.where(np.arange(n - 21) % 2 == 0, -0.01, 0.0)
    v = np.where(np.arange(n) < 20, 3.0, 0.0)
    car = _track("car", 0.0, x, 0.0, v)
    path = driven_path(car)
    assert np.all(np.diff(path.points[:, 0]) > 0.0) and path.points[-1, 0] == pytest.approx(26.0)
    sc = straight_scenario(ego_speed=0.0, agents=[car], duration=8.0)
    r = simulate(sc, LogReplayPlanner(sc), reactive=True)
    states = [o.objects[0] for o in r.objects if o.objects]
    # IDM drives it on past its logged stop (nothing holds it there); forward, never back towards the ego.
    assert np.all(np.diff([o.x for o in states]) >= -1e-9) and states[-1].x > 30.0
    assert max(abs(o.heading) for o in states) < 1e-6


def test_past_its_path_an_agent_drives_on_along_the_path_not_along_a_sideways_last_step() -> None:
    from luna_core.lanes import Polyline

    straight = Polyline(np.column_stack([np.arange(0.0, 5.01, 0.3), np.zeros(17)]))
    assert straight_end(straight) is straight  # its last segment extrapolates as it should
    # A stop's last step: 5 mm forward, 1 cm to the left (63 deg off the path).
    jitter = Polyline(np.vstack([straight.points, straight.points[-1] + [0.005, 0.01]]))
    fixed = straight_end(jitter)
    np.testing.assert_array_equal(fixed.points[-1], jitter.points[-1])  # it still ends where the log did
    x, y, h = fixed.interpolate(fixed.length + 10.0)  # and drives on along the road
    assert x == pytest.approx(fixed.points[-1, 0] + 10.0, abs=0.01) and abs(y) < 0.3 and abs(h) < 0.03
    assert abs(jitter.interpolate(jitter.length + 10.0)[2]) > 1.0  # the raw path turned it 63 deg


def test_reactive_agent_stops_for_a_red_light() -> None:
    g_sc = straight_scenario(ego_speed=8.0)
    # A car ahead of the ego in the other lane; its lane's successor is controlled by a red light.
    g = g_sc.lane_graph
    g.lanes["a1"].successors.append("c1")
    g.add(make_lane("c1", [[150, 3.5], [300, 3.5]], 3.5, 15.0, "C", predecessors=["a1"]))
    n = 101
    car = _track("car", 0.0, 100.0 + 10.0 * np.arange(n) * SIM_DT, 3.5, np.full(n, 10.0))
    red = TrafficLightTimeline("c1", [-2.0], [TrafficLightPhase.RED])
    sc = straight_scenario(ego_speed=8.0, agents=[car], lights=[red], duration=10.0)
    sc.lane_graph = g
    r = simulate(sc, LogReplayPlanner(sc), reactive=True)
    front = [o.objects[0].x + 4.5 / 2 for o in r.objects if o.objects]
    assert max(front) <= 150.0 + 0.5
    assert r.objects[-1].objects[0].speed < 0.5


class _Decider:
    def decide(self, planner_input: PlannerInput) -> DecisionDistribution:
        p = np.zeros(len(ACTION_CODES))
        p[ACTION_CODES.index("CK")] = 1.0
        return DecisionDistribution(planner_input.time, p)


def test_decision_source_is_called_every_decision_period() -> None:
    sc = straight_scenario()
    rec = _Recorder(LogReplayPlanner(sc))
    log = simulate(sc, rec, decision_source=_Decider(), config=SimulationConfig(decision_every=5))
    assert [t for t, _ in log.decisions] == pytest.approx(list(np.arange(0.0, 6.0, 0.5)))
    assert {a for _, a in log.decisions} == {"CK"}
    assert all(p.decision is not None for p in rec.inputs)


def test_reactive_runs_are_deterministic() -> None:
    n = 101
    agents = [_track(f"car{k}", 0.0, -30.0 + 12.0 * k + 7.0 * np.arange(n) * SIM_DT, 3.5 * (k % 2),
                     np.full(n, 7.0)) for k in range(4)]
    sc = straight_scenario(ego_speed=6.0, agents=agents, duration=10.0)
    a = simulate(sc, LogReplayPlanner(sc), reactive=True)
    b = simulate(sc, LogReplayPlanner(sc), reactive=True)
    np.testing.assert_array_equal(a.ego_array(), b.ego_array())
    xa = [[(o.id, o.x, o.y, o.vx) for o in objs.objects] for objs in a.objects]
    xb = [[(o.id, o.x, o.y, o.vx) for o in objs.objects] for objs in b.objects]
    assert xa == xb
    # and reactive differs from the replayed log where agents interact with the ego
    nr = simulate(sc, LogReplayPlanner(sc), reactive=False)
    assert [[o.x for o in objs.objects] for objs in nr.objects] != [[o.x for o in objs.objects] for objs in a.objects]
