"""DecisionGuidedPlanner end to end with the shipped diffusion prior (models/diffusion_prior) on a
hand-built three-lane road: Eq. 19-22 selection, the degraded modes and bad input. A reduced
population keeps each call short; the code path is the one the planner node runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from luna_core.lanes import make_lane
from luna_core.assets import default_path
from luna_core.planning.decision_guided import (MODE_DECISION, MODE_EMERGENCY, MODE_FALLBACK, MODE_LEAST_BAD,
                                                MODE_NO_DECISION, MODE_STOP, DecisionGuidedConfig,
                                                DecisionGuidedPlanner, PlannerInputError)
from luna_core.planning.context import build_planning_context
from luna_core.planning.diffusion import TrajectoryDiffusionPrior
from luna_core.idm import pdm_policy
from luna_core.planning.proposals import following_speed_cap, idm_rollout
from luna_core.planning.diffusion_es import DiffusionESConfig
from luna_core.control import StateIndex
from luna_core.geometry import proposals_vs_objects
from luna_core.planning.objectives import selection_score
from luna_core.planning.scorer import ego_corners
from luna_core.types import (ACTION_INDEX, DecisionDistribution, EgoState, LaneGraph, ObjectClass, PlannerInput,
                             Route, TrackedObject, TrackedObjects, TrafficLights, Trajectory, box_corners)

SEARCH = DiffusionESConfig(population=32, warm_starts=15, iterations=1, renoise_steps=(3,))


@pytest.fixture(scope="module")
def prior() -> TrajectoryDiffusionPrior:
    torch.set_num_threads(1)
    return TrajectoryDiffusionPrior.from_pretrained(default_path("diffusion_prior"))


def road() -> LaneGraph:
    g = LaneGraph()
    g.add(make_lane("A0", [[0, 3.5], [400, 3.5]], 3.5, 15.0, "A", right_neighbor="A1"))
    g.add(make_lane("A1", [[0, 0], [400, 0]], 3.5, 15.0, "A", left_neighbor="A0", right_neighbor="A2"))
    g.add(make_lane("A2", [[0, -3.5], [400, -3.5]], 3.5, 15.0, "A", left_neighbor="A1"))
    return g


def history(x: float = 50.0, y: float = 0.0, speed: float = 10.0, now: float = 10.0) -> list[EgoState]:
    return [EgoState(now - 0.1 * k, x - speed * 0.1 * k, y, 0.0, speed) for k in range(20, -1, -1)]


def decision(probs: dict[str, float], stamp: float = 9.8, candidates: list[str] | None = None) -> DecisionDistribution:
    p = np.zeros(10)
    for code, v in probs.items():
        p[ACTION_INDEX[code]] = v
    return DecisionDistribution(stamp, p, candidates if candidates is not None else list(probs))


def make_input(objects: list[TrackedObject] | None = None, dec: DecisionDistribution | None = None,
               graph: LaneGraph | None = None, hist: list[EgoState] | None = None) -> PlannerInput:
    return PlannerInput(10.0, hist or history(), TrackedObjects(10.0, objects or []), TrafficLights(10.0),
                        road() if graph is None else graph, Route(0.0, ["A"]), dec)


def planner(prior, **kw) -> DecisionGuidedPlanner:
    return DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=60.0, **kw), prior=prior)


def slow_car(x: float = 80.0, y: float = 0.0, speed: float = 3.0) -> TrackedObject:
    return TrackedObject("slow", ObjectClass.VEHICLE, x, y, 0.0, speed, 0.0, 4.5, 1.9)


def assert_valid(traj, ego: EgoState) -> None:
    assert len(traj) == 81 and traj.is_finite()
    assert traj.t[0] == 0.0 and traj.t[-1] == pytest.approx(8.0)
    assert math.hypot(traj.x[0] - ego.x, traj.y[0] - ego.y) < 0.5


def test_it_is_a_planner_and_follows_eq22(prior) -> None:
    pl = planner(prior)
    assert callable(pl.plan) and callable(pl.reset) and isinstance(pl.name, str)  # the Planner protocol
    pi = make_input([slow_car()], decision({"CK": 0.5, "CL": 0.3, "DK": 0.2}))
    res = pl.plan_detailed(pi)
    assert res.mode == MODE_DECISION and res.reasons == [] and res.budget_cut == ""
    assert [c.action for c in res.candidates] == ["CK", "CL", "DK"]
    for c in res.candidates:
        assert c.trajectory is not None
        assert c.selection_score == pytest.approx(float(selection_score(c.probability, c.j_dec, c.j_gen)))
        assert 0.0 <= c.j_dec <= 1.0 and 0.0 <= c.j_gen <= 1.0
        assert c.j_a == pytest.approx(c.j_dec ** 5.0 * c.j_gen, rel=1e-6)
        assert c.ttc == 1.0  # the slow car is far enough ahead: every candidate keeps the TTC bound
    best = max(res.candidates, key=lambda c: c.selection_score)
    assert res.action == best.action
    assert res.trajectory is best.trajectory
    # Evaluation counts the cycles whose Eq. 22 pick is not the most likely candidate (CK here), and those
    # where safety first overruled it (none: all are safe).
    assert pl.cycle_info() == {"mode": MODE_DECISION, "action": best.action, "flip": False,
                               "beside_argmax": best.action != "CK", "safety_gated": False}
    assert_valid(res.trajectory, pi.ego)
    # Left lane change candidates end up in the left lane; the lane keepers stay in theirs.
    cl = next(c for c in res.candidates if c.action == "CL").trajectory
    assert cl.y[-1] > 2.0
    ck = next(c for c in res.candidates if c.action == "CK").trajectory
    assert abs(ck.y[-1]) < 1.5


def test_without_decisions_is_the_diffusion_es_baseline(prior) -> None:
    pl = planner(prior, use_decisions=False)
    assert pl.name == "diffusion_es"
    res = pl.plan_detailed(make_input(dec=decision({"AL": 1.0})))
    assert res.mode == MODE_NO_DECISION and res.action is None
    assert pl.cycle_info() == {"mode": MODE_NO_DECISION, "action": "", "flip": False}
    assert [c.action for c in res.candidates] == [""]
    assert res.candidates[0].j_gen > 0.5
    assert_valid(res.trajectory, make_input().ego)


@pytest.mark.parametrize("dec, reason", [
    (None, "no decision received"),
    (decision({"CK": 1.0}, stamp=1.0), "stale"),
    (decision({"CK": 0.5, "CL": 0.2}), "sums to 0.7"),
    (decision({"CK": 1.0}, candidates=["CK", "XX"]), "unknown action code"),
])
def test_missing_stale_or_invalid_decision_falls_back_to_j_gen(prior, dec, reason) -> None:
    res = planner(prior).plan_detailed(make_input([slow_car()], dec))
    assert res.mode == MODE_FALLBACK and res.degraded
    assert any(reason in r for r in res.reasons), res.reasons
    assert [c.action for c in res.candidates] == [""]
    assert_valid(res.trajectory, make_input().ego)



def test_impossible_lane_change_gives_its_probability_to_keeping_the_lane_at_its_speed(prior) -> None:
    # In the leftmost lane: no left lane. CL's speed intent (cruise) moves to CK, which is not in C_t as
    # published; DL's to DK (in C_t); Eq. 22 then sees CK 0.65 (0.45 + its own 0.2) and DK 0.35.
    dec = decision({"CL": 0.45, "DK": 0.2, "DL": 0.15, "CK": 0.2}, candidates=["CL", "DK", "DL"])
    res = planner(prior).plan_detailed(make_input(dec=dec, hist=history(y=3.5)))
    assert res.mode == MODE_DECISION
    assert [(c.action, round(c.probability, 6)) for c in res.candidates] == [("CK", 0.65), ("DK", 0.35)]
    assert any("CL: no lane on that side" in r and "goes to CK" in r for r in res.reasons), res.reasons
    assert any("DL: no lane on that side" in r and "goes to DK" in r for r in res.reasons), res.reasons


def test_impossible_lane_change_is_dropped_with_a_reason_when_asked(prior) -> None:
    pi = make_input(dec=decision({"CL": 0.6, "CK": 0.4}), hist=history(y=3.5))
    res = planner(prior, blocked_lateral_to_keep=False).plan_detailed(pi)
    assert [c.action for c in res.candidates] == ["CK"]
    assert res.candidates[0].probability == pytest.approx(0.4)
    assert any("CL dropped" in r for r in res.reasons)
    assert res.mode == MODE_DECISION and res.action == "CK"


def _assert_stop(res, ego: EgoState) -> None:
    assert res.mode == MODE_STOP and res.action is None and res.degraded
    v = res.trajectory.velocity
    assert res.trajectory.is_finite() and v[-1] == pytest.approx(0.0, abs=1e-9)
    assert np.all(np.diff(v) <= 1e-9)
    assert np.all(res.trajectory.acceleration >= -2.0 - 1e-9)  # comfortable: 2 m/s^2
    assert math.hypot(res.trajectory.x[0] - ego.x, res.trajectory.y[0] - ego.y) < 1e-6


def test_empty_lane_graph_gives_a_comfortable_stop(prior) -> None:
    pi = make_input(dec=decision({"CK": 1.0}), graph=LaneGraph())
    res = planner(prior).plan_detailed(pi)
    _assert_stop(res, pi.ego)
    assert any("lane graph is empty" in r for r in res.reasons)


def test_ego_off_the_map_gives_a_comfortable_stop(prior) -> None:
    pi = make_input(dec=decision({"CK": 1.0}), hist=history(y=300.0))
    res = planner(prior).plan_detailed(pi)
    _assert_stop(res, pi.ego)
    assert any("no lane" in r for r in res.reasons)


def test_nothing_feasible_publishes_the_least_bad_trajectory_not_a_stop(prior) -> None:
    # The lanes end 6 m ahead of the ego's front at 10 m/s: every trajectory leaves the drivable area
    # (J_gen = 0), none collides. PDM-Closed then drives its least-bad proposal, not a stop: the best
    # weighted score among the members without an at-fault collision.
    g = LaneGraph()
    for lane_id, y, left, right in (("A0", 3.5, None, "A1"), ("A1", 0.0, "A0", "A2"), ("A2", -3.5, "A1", None)):
        g.add(make_lane(lane_id, [[0, y], [60, y]], 3.5, 15.0, "A", left_neighbor=left, right_neighbor=right))
    pi = make_input(dec=decision({"CK": 0.7, "DK": 0.3}), graph=g)
    res = planner(prior).plan_detailed(pi)
    assert res.mode == MODE_LEAST_BAD and res.action is None and res.degraded
    assert any("no feasible trajectory" in r and ("least-bad searched" in r or "PDM-Closed's proposal" in r)
               for r in res.reasons), res.reasons
    assert all(c.j_gen == 0.0 for c in res.candidates)
    assert_valid(res.trajectory, pi.ego)
    assert res.trajectory.velocity[40] > 1.0  # not a stop


def test_everything_colliding_at_speed_falls_back_to_pdm_closeds_own_pick(prior) -> None:
    # Stopped vehicles 8 m ahead across all three lanes at 10 m/s: every scored trajectory hits one at
    # fault. Above 5 m/s PDM-Closed does not emergency-brake: it drives its own pick, the first proposal
    # (centreline, the slowest IDM policy), which brakes for them.
    wall = [TrackedObject(f"w{k}", ObjectClass.VEHICLE, 62.0, y, 0.0, 0.0, 0.0, 1.0, 3.4)
            for k, y in enumerate((-3.5, 0.0, 3.5))]
    pi = make_input(wall, decision({"CK": 0.7, "DK": 0.3}))
    res = planner(prior).plan_detailed(pi)
    assert res.mode == MODE_LEAST_BAD and all(c.j_gen == 0.0 for c in res.candidates)
    assert any("PDM-Closed's proposal 0 (offset +0 m" in r for r in res.reasons), res.reasons
    assert_valid(res.trajectory, pi.ego)
    assert np.all(np.abs(res.trajectory.y) < 0.1) and res.trajectory.velocity[20] < 7.0  # braking for them


def test_imminent_at_fault_collision_at_low_speed_brakes(prior) -> None:
    # A stopped truck across the whole road 1 m ahead at 5 m/s: every trajectory hits it within 2 s.
    wall = [TrackedObject("truck", ObjectClass.VEHICLE, 59.0, 0.0, math.pi / 2, 0.0, 0.0, 40.0, 2.5)]
    pi = make_input(wall, decision({"CK": 1.0}), hist=history(speed=5.0))
    res = planner(prior).plan_detailed(pi)
    assert res.mode == MODE_EMERGENCY and res.degraded
    assert any("emergency brake" in r for r in res.reasons), res.reasons
    v = res.trajectory.velocity
    assert np.all(v <= 5.0) and v[-1] == pytest.approx(0.0, abs=0.05)


def test_objects_without_position_are_left_out_and_reported(prior) -> None:
    nan_obj = TrackedObject("bad", ObjectClass.VEHICLE, math.nan, 0.0, 0.0, 1.0, 0.0, 4.5, 1.9)
    res = planner(prior).plan_detailed(make_input([slow_car(), nan_obj], decision({"CK": 1.0})))
    assert any("1 object(s) without a usable position left out (bad)" in r for r in res.reasons), res.reasons
    assert res.mode == MODE_DECISION and res.trajectory.is_finite()


def test_a_stopped_car_of_unknown_size_ahead_is_braked_for_like_a_known_one(prior) -> None:
    # Issue 17: a car 30 m ahead in the ego lane with NaN length and width was dropped and the planner
    # accelerated towards it. Its position is known: it keeps the default footprint and is braked for.
    def plan(length: float, width: float):
        car = TrackedObject("car", ObjectClass.VEHICLE, 80.0, 0.0, 0.0, 0.0, 0.0, length, width)
        return planner(prior).plan_detailed(make_input([car], decision({"CK": 1.0})))

    free = planner(prior).plan_detailed(make_input([], decision({"CK": 1.0}))).trajectory
    unknown, known = plan(math.nan, math.nan), plan(4.5, 1.9)
    assert any("1 object(s) kept with assumed fields (car): size 5.5 x 2.3 m" in r for r in unknown.reasons)
    rear_of_car = 80.0 - 5.5 / 2
    for res in (unknown, known):
        traj = res.trajectory
        assert traj.velocity[-1] < 1.0 and free.velocity[-1] > 9.0, "stops for the car; drives on without it"
        assert np.max(traj.x) + 3.9 < rear_of_car, "the ego's front (3.9 m ahead of the rear axle) stays clear"


def test_the_following_speed_cap_binds_behind_a_leader_only() -> None:
    car = TrackedObject("car", ObjectClass.VEHICLE, 80.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
    for objects, bound in (([car], True), ([], False)):
        pi = make_input(objects, decision({"CK": 1.0}), hist=history(x=50.0, speed=10.0))
        ctx = build_planning_context(pi)
        path = ctx.paths["K"]
        cap = following_speed_cap(ctx.ego, path.centerline, ctx.forecast.window(0, 41), path.speed_limit, 40, 0.1,
                                  pi.vehicle)
        assert cap.shape == (40,)
        if bound:  # a stopped car 30 m ahead at 10 m/s: IDM brakes towards a standstill behind it
            assert np.all(np.isfinite(cap[5:])) and cap[-1] < 3.0 and np.all(np.diff(cap[np.isfinite(cap)]) <= 1e-9)
        else:
            assert np.all(np.isinf(cap))


def test_the_unscored_tail_stops_at_a_stopped_car_where_idm_braking_comes_too_late(prior) -> None:
    # Issue 17: the 4-8 s tail is an IDM continuation from the scored trajectory's last state. Ending 4 s
    # at 4 m/s with 1.3 m to a stopped car, IDM's bounded braking ran the published tail into the car.
    car = TrackedObject("car", ObjectClass.VEHICLE, 60.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)
    pi = make_input([car], decision({"CK": 1.0}), hist=history(x=36.0, speed=4.0))
    ctx = build_planning_context(pi)
    vehicle = pi.vehicle
    t = np.arange(81) * 0.1
    head = Trajectory(10.0, t, 36.0 + 4.0 * t, np.zeros(81), np.zeros(81), np.full(81, 4.0), np.zeros(81))
    gap = 60.0 - 4.5 / 2 - (head.x[40] + vehicle.front_length)
    assert 0.5 < gap < 2.0
    s, v, _ = idm_rollout(4.0, np.array([head.x[40]]), np.zeros(1, dtype=int), [ctx.paths["K"].centerline],
                          ctx.forecast.window(40), pdm_policy(4.0), np.array([4.0]), 40, 0.1, vehicle)
    assert s[0, -1] + vehicle.front_length > 60.0 - 4.5 / 2, "plain IDM cannot stop in time here"
    tail = planner(prior)._with_tail(head, ctx.paths["K"], ctx.forecast, vehicle)
    assert np.allclose(tail.x[:41], head.x[:41]) and tail.is_finite()
    assert np.max(tail.x) + vehicle.front_length <= 60.0 - 4.5 / 2 + 1e-6, "the tail runs into the car"
    assert tail.x[-1] > head.x[40], "it still closes up to the car"


def test_nan_latest_ego_state_plans_from_the_last_finite_one(prior) -> None:
    hist = history() + [EgoState(10.1, math.nan, 0.0, 0.0, 10.0)]
    res = planner(prior).plan_detailed(make_input(dec=decision({"CK": 1.0}), hist=hist))
    assert any("latest ego state is not finite" in r for r in res.reasons)
    assert res.trajectory.is_finite()
    with pytest.raises(PlannerInputError, match="no finite state"):
        planner(prior).plan_detailed(make_input(hist=[EgoState(1.0, math.nan, 0.0, 0.0, 0.0)]))


class FakeClock:
    """Advances 30 ms per reading: a deterministic stand-in for a slow machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.03
        return self.now


def test_budget_cut_publishes_the_best_warm_start_fake_clock(prior) -> None:
    pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=0.05), prior=prior,
                               clock=FakeClock())
    pi = make_input([slow_car()], decision({"CK": 0.6, "DK": 0.4}))
    res = pl.plan_detailed(pi)
    assert res.budget_cut and any("time budget 50 ms" in r for r in res.reasons)
    assert res.stages_done == ["warm_starts"]
    assert res.mode == MODE_DECISION and res.action in ("CK", "DK")
    assert all(c.origin == "warm_start" for c in res.candidates)
    assert_valid(res.trajectory, pi.ego)


def test_node_facing_api_flat_options_markers_and_reasons(prior) -> None:
    from luna_core.planning.factory import make_planner

    cfg = DecisionGuidedConfig(population=24, gamma_p=0.25, search=SEARCH, time_budget=60.0)
    assert cfg.search.population == 24 and cfg.objective.gamma_p == 0.25
    pl = DecisionGuidedPlanner(cfg, prior=prior)
    assert pl.debug_candidates() == []
    # The candidate set is the one the decision carries; gamma_p only applies to a decision without one.
    pl.plan(make_input([slow_car()], decision({"CK": 0.5, "CL": 0.3, "DK": 0.2})))
    assert [d[0] for d in pl.debug_candidates()] == ["CK", "CL", "DK"]
    pl.reset()
    pl.plan(make_input([slow_car()], decision({"CK": 0.5, "CL": 0.3, "DK": 0.2}, candidates=[])))
    debug = pl.debug_candidates()
    assert [d[0] for d in debug] == ["CK", "CL"]  # DK (0.2) is below gamma_p 0.25
    assert sum(d[3] for d in debug) == 1
    assert pl.last.degraded_reason == ""
    pl.plan(make_input(dec=None))
    assert pl.last.degraded_reason.startswith("mode fallback; no decision received")
    # The planner node builds it by name with flat options.
    built = make_planner("luna", {"population": 16, "gamma_p": 0.2, "time_budget": 0.3})
    assert built.config.search.population == 16 and built.config.time_budget == 0.3


def test_deterministic_mode_ignores_the_clock_and_repeats_fake_clock(prior) -> None:
    """Batch evaluation: with ``deterministic`` every stage runs in full however slow the clock (a
    50 ms budget on a clock that advances 30 ms per reading would otherwise cut the search), and a
    reset planner gives the same trajectory again, call after call (the stage-cost estimates carried
    between calls do not size anything)."""
    pi = make_input([slow_car()], decision({"CK": 0.6, "DK": 0.4}))
    runs = []
    for clock in (FakeClock(), FakeClock()):
        pl = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, time_budget=0.05, deterministic=True),
                                   prior=prior, clock=clock)
        runs.append([pl.plan_detailed(pi) for _ in range(2)])
        pl.reset()
        runs[-1].append(pl.plan_detailed(pi))
    for res in runs[0] + runs[1]:
        assert res.budget_cut == "" and res.stages_done == ["warm_starts", "prior", "iteration 1"]
        assert_valid(res.trajectory, pi.ego)
    first, second = runs
    for a, b in zip(first, second):
        assert np.array_equal(a.trajectory.x, b.trajectory.x) and np.array_equal(a.trajectory.y, b.trajectory.y)
    assert np.array_equal(first[0].trajectory.x, first[2].trajectory.x), "reset restarts the seed sequence"


def test_progress_floor_hand_computed() -> None:
    from luna_core.planning.decision_guided import progress_floor

    # Half of: from standstill at 1 m/s^2 for 4 s = 8 m; from 10 m/s to a 15 m/s limit in 4 s = 48 m;
    # already at the limit = v T; no limit known = 15 m/s.
    assert progress_floor(0.0, 15.0, 4.0) == pytest.approx(4.0)
    assert progress_floor(10.0, 15.0, 4.0) == pytest.approx(24.0)
    assert progress_floor(20.0, 15.0, 4.0) == pytest.approx(40.0)
    assert progress_floor(14.0, 0.0, 4.0) == pytest.approx(0.5 * (14.0 + 0.5 + 15.0 * 3.0))
    assert progress_floor(-1.0, 15.0, 4.0) == pytest.approx(4.0)  # reversing counts as standing



def test_device_option_is_checked_and_auto_is_cpu_without_a_gpu(prior) -> None:
    with pytest.raises(ValueError, match="device must be cpu, cuda, cuda:<n> or auto, got 'gpu'"):
        DecisionGuidedConfig(device="gpu")
    planner = DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, device="auto"))
    assert planner.prior.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_search_noise_is_drawn_on_the_cpu_whatever_the_device(prior) -> None:
    """A seeded search draws the same noise on every device (a CPU generator cannot fill a CUDA tensor);
    on the CPU it is exactly ``torch.randn`` of that generator."""
    expected = torch.randn((4, 3), generator=torch.Generator().manual_seed(7))
    assert torch.equal(prior.noise((4, 3), torch.Generator().manual_seed(7)), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: the CPU/CUDA "
                    "comparison runs where one is present (benchmarks/bench_gpu.py measures it)")
def test_cuda_denoiser_publishes_what_the_cpu_one_does() -> None:
    pi = make_input([slow_car()], decision({"CK": 0.6, "DK": 0.4}))
    runs = [DecisionGuidedPlanner(DecisionGuidedConfig(search=SEARCH, deterministic=True, device=d)).plan_detailed(pi)
            for d in ("cpu", "cuda")]
    assert runs[0].action == runs[1].action
    assert np.abs(runs[0].trajectory.x - runs[1].trajectory.x).max() < 0.5
