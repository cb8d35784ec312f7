"""Parity of the two ways of running the full stack (issue 15): ``luna`` with the default student in
process (``luna-bridge eval``: ``stack_planner.make_stack_planner``) and as real ROS nodes
(``scene_descriptor``, ``decision_stack``, ``planner``) driven by the simulator in lock step
(``luna-bridge ros``: ``ros_bridge.RosStackPlanner``) decide and plan the same.

One short synthetic scenario, the same settings on both paths: models/student, the bundled memory bank
(and, for a lane change, the previous 672-item bank with the session-11 head, which changes lanes there
where the default student keeps its lane) as built (K = 1: a K the students were trained with, and a prompt
inside their 2048-token window; read-only, no reload), T_d = 2 s, gamma_p 0.1, replanning every 0.5 s, the
deterministic search with a small population. Asserted: the same decision instants, the same scene
queries (prompt text) and retrieved items, the same distributions and candidate sets, the same planned
trajectory in every cycle, and hence the same driven ego track. The default case drives the scenario a
second time on the same running stack, at a later ROS time with a new route (a new mission, as ``luna
demo`` drives its scenarios one after another): that run must match the in-process one as well.

Tolerances, and why not bit equality. Every value crossing ROS is a float64 field (probabilities,
scene fields, trajectory points), so values survive the wire exactly; what does not quite is *time*
and *heading*. Stamps travel as integer nanoseconds (``builtin_interfaces/Time``) with
``TIME_OFFSET`` = 100 s added (sim time 0.3 s comes back as 0.29999999999999716), a trajectory point's
``time_from_start`` is rounded to 1 ns, and a heading travels as a quaternion (yaw -> quaternion ->
yaw, ~1e-16 rad). Measured on the reference machine: probabilities, prompts and positions bit-equal,
``t`` within 9e-16 s, heading and y within 2e-17. Asserted: the prompt text, retrieved ids and
candidate sets equal; probabilities within ``PROB_ATOL`` = 1e-12 (one deterministic forward pass on
the same prompt, observed bit-equal; the margin only allows another BLAS summation order in the node's
process);
stamps and every trajectory field within 1e-9 (the 0.5 ns rounding of a duration, far above the
quaternion's error, far below any effect on a decision or a metric).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import yaml

from luna_bridge.ros_bridge import (TIME_OFFSET, LockstepConfig, RosStackPlanner, in_process_config,
                                   lockstep_simulation_config)
from luna_bridge.scenario import SIM_DT, SimulationLog
from luna_bridge.sim.simulator import simulate
from luna_bridge.stack_planner import StackSettings, make_stack_planner
from luna_core.assets import default_path, unpacked
from luna_core.types import DecisionDistribution, PlannerInput, Trajectory
from tests.ros.helpers import ros_env, stop_process
from tests.scenario_samples import lead_vehicle_scenario

REPO = Path(__file__).resolve().parents[2]
COMMON_PARAMS = REPO / "ros_ws/src/luna_bringup/config/common.param.yaml"

DURATION = 4.5  # s of sim time: decisions at 0, 2 and 4 s (the last step is recorded, not planned)
REPLAN = 0.5  # s between planning cycles on both paths
MISSION_GAP = 10.0  # s of ROS time between consecutive missions on one stack (a multiple of T_d)
# The previous default bank (672 MiniLM items) and the session-11 default student (its head beside the
# shared adapter): with them the student decides CL at t = 0 here, so the two paths must agree through a
# lane change too (they did not until the planner stopped reading a steering angle that Odometry does not
# carry). The default student decides CK / DK here with either bank.
LANE_CHANGE_BANK = REPO / "benchmarks" / "data" / "bank_minilm672"
LANE_CHANGE_HEAD = REPO / "benchmarks" / "data" / "student_s11_head"
SETTINGS = StackSettings(student=str(REPO / "models/student"), memory_bank=str(default_path("memory_bank")),
                         k=1, gamma_p=0.1, decision_every=20, population=8, iterations=2, time_budget=0.0,
                         device="cpu")

# The prompts and retrieved ids are compared exactly. The distributions agree to float32 rounding, not
# bit for bit: about one run in seven (fresh clones, 2026-11-27) differed by up to 1.4e-6 in one decision
# with the same prompt and items; the cause (something in the decision process's torch state) is not
# found yet, and a different prompt or item moves the distribution by far more than this bound.
PROB_ATOL = 1e-5
STAMP_ATOL = 1e-9
TRAJ_ATOL = 1e-9


@dataclass
class Run:
    """What one path decided and planned."""

    log: SimulationLog
    decisions: list[DecisionDistribution]
    plans: list[tuple[float, Trajectory]] = field(default_factory=list)  # (cycle time, trajectory)


class RecordingPlanner:
    """Records the trajectory in force after each planning cycle (every ``REPLAN`` s of sim time) of
    the planner it wraps; the lock-step bridge is called every step and answers anew at those instants."""

    def __init__(self, planner, plans: list[tuple[float, Trajectory]]) -> None:
        self.planner = planner
        self.name = planner.name
        self.plans = plans

    def reset(self) -> None:
        self.planner.reset()

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        traj = self.planner.plan(planner_input)
        t = planner_input.time
        if abs(t / REPLAN - round(t / REPLAN)) < 1e-6:
            self.plans.append((t, traj))
        return traj


def _in_process(settings: StackSettings) -> Run:
    planner = make_stack_planner("luna", settings=settings)
    plans: list[tuple[float, Trajectory]] = []
    config = dataclasses.replace(in_process_config(REPLAN), decision_every=settings.decision_every)
    log = simulate(lead_vehicle_scenario(DURATION), RecordingPlanner(planner, plans), reactive=False, config=config,
                   decision_source=planner.decision_source)
    return Run(log, list(planner.decision_source.decisions), plans)


def _start_stack(tmp_path: Path, settings: StackSettings) -> list[subprocess.Popen]:
    """The three nodes of the decision path as the stack runs them: each process reads the shared
    parameters first, then its nodes' own (``settings``), on sim time."""
    model = {"student_model": settings.student, "memory_bank": settings.memory_bank, "device": settings.device,
             "k": settings.k}
    nodes = {
        "scene_descriptor": {"scene_descriptor": {"input_sync_timeout": 60.0}},
        # memory_reload false: the bank as loaded (a reload could not change a read-only bundled bank
        # anyway, but the run must not depend on when one would land).
        "decision_stack": {"decision_inference": {**model, "memory_reload": False, "input_sync_timeout": 60.0},
                           "explainer": model},
        "planner": {"planner": {"planner": "luna", "replan_period": REPLAN, "population": settings.population,
                                "input_sync_timeout": 60.0}},
    }
    procs = []
    for exe, params in nodes.items():
        path = tmp_path / f"{exe}.params.yaml"
        path.write_text(yaml.safe_dump({name: {"ros__parameters": p} for name, p in params.items()}))
        procs.append(subprocess.Popen(
            [str(Path(sys.executable).parent / exe), "--ros-args", "-p", "use_sim_time:=true",
             "--params-file", str(COMMON_PARAMS), "--params-file", str(path)],
            env=ros_env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _over_ros(tmp_path: Path, ros_context, settings: StackSettings, missions: int = 1) -> list[Run]:
    """The scenario driven ``missions`` times in a row on one running stack (as ``luna demo`` drives its
    scenarios), each at a later ROS time with its own route: a new mission, which must start afresh."""
    procs = _start_stack(tmp_path, settings)
    runs: list[Run] = []
    outputs: list[str] = []
    bridge = None
    try:
        # One bridge node drives every mission, as `luna demo` does (RosStackPlanner.drive_next). Wall-time
        # bounds only (lock step waits for every answer): the student loads in the decision process before
        # the first instant can be decided, on a loaded 2-core machine.
        config = LockstepConfig(replan_period=REPLAN, timeout=180.0, connect_timeout=180.0,
                                time_offset=TIME_OFFSET, expect_decisions=True)
        bridge = RosStackPlanner(lead_vehicle_scenario(DURATION), config, context=ros_context)
        for m in range(missions):
            bridge.drive_next(lead_vehicle_scenario(DURATION), TIME_OFFSET + m * MISSION_GAP)
            plans: list[tuple[float, Trajectory]] = []
            log = simulate(bridge.scenario, RecordingPlanner(bridge, plans), reactive=False,
                           config=lockstep_simulation_config(REPLAN))
            last_instant = (bridge.scenario.num_steps - 2) * SIM_DT  # the last planned step
            bridge.await_decisions(settings.decision_period, last_instant, timeout=30.0)
            runs.append(Run(log, sorted(bridge.decisions, key=lambda d: d.stamp), plans))
    finally:
        if bridge is not None:
            bridge.close()
        outputs = [stop_process(p, timeout=30.0) for p in procs]
        for p, out in zip(procs, outputs):
            # pytest shows captured output only for a failing test: the nodes' logs come with any failure.
            print(f"--- {Path(p.args[0]).name} (exit {p.returncode}) ---\n{out}")
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, f"{p.args[0]} exited with {p.returncode}:\n{out}"
    return runs


def _lane_change_student(tmp_path: Path) -> Path:
    """The session-11 head (its config and file hashes) with the adapter it shares with models/student."""
    folder = tmp_path / "student_s11"
    shutil.copytree(LANE_CHANGE_HEAD, folder)
    shutil.copy(REPO / "models/student/adapter.safetensors", folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("bank", ["default", "lane-change"])
def test_luna_in_process_and_over_ros_decide_and_plan_the_same(tmp_path, ros_context, bank):
    settings = SETTINGS if bank == "default" else dataclasses.replace(
        SETTINGS, memory_bank=str(unpacked(LANE_CHANGE_BANK)), student=str(_lane_change_student(tmp_path)))
    # The default case drives the scenario twice on one stack: the second mission must not inherit the
    # first one's recent decisions, retrieved items or warm start (the demo's second scenario once did).
    ours, runs = _in_process(settings), _over_ros(tmp_path, ros_context, settings, 2 if bank == "default" else 1)
    for mission, theirs in enumerate(runs):
        _assert_same(ours, theirs, bank, f"mission {mission + 1} over ROS: ")


def _assert_same(ours: Run, theirs: Run, bank: str, where: str) -> None:
    assert ours.log.planner_failures == 0, ours.log.failure_messages
    assert theirs.log.planner_failures == 0, theirs.log.failure_messages

    # Decisions: the same instants, prompts, retrieved items and distributions.
    expected_instants = [0.0, 2.0, 4.0]
    assert [d.stamp for d in ours.decisions] == pytest.approx(expected_instants, abs=STAMP_ATOL)
    assert [d.stamp for d in theirs.decisions] == pytest.approx(expected_instants, abs=STAMP_ATOL), \
        f"{where}decision stamps: {[d.stamp for d in theirs.decisions]}"
    for a, b in zip(ours.decisions, theirs.decisions):
        at = f"{where}decision at t={a.stamp:.1f} s"
        assert a.query == b.query, f"{at}: the scene queries differ:\n--- in process\n{a.query}\n--- over ROS\n{b.query}"
        assert a.retrieved_ids == b.retrieved_ids, at
        assert np.allclose(a.probabilities, b.probabilities, rtol=0.0, atol=PROB_ATOL), \
            f"{at}: probabilities differ by up to {np.abs(a.probabilities - b.probabilities).max():.3g}\n" \
            f"in process {a.probabilities.tolist()}\nover ROS   {b.probabilities.tolist()}"
        assert a.candidate_set == b.candidate_set, at
        assert a.scene_stamp == pytest.approx(b.scene_stamp, abs=STAMP_ATOL), at

    # The compared prompts carry what each path gets its own way (the simulator's acceleration, which
    # differed before; the recent decisions the scene node hears over ROS; a tracked object).
    later = ours.decisions[-1].query
    assert "acceleration 0.00 m/s^2" not in later and "Recent decisions: none." not in later \
        and "lead vehicle" in later, later

    # Trajectories: the same cycles, each planned the same.
    assert [t for t, _ in ours.plans] == pytest.approx([t for t, _ in theirs.plans], abs=STAMP_ATOL)
    assert len(ours.plans) == int((DURATION - SIM_DT) / REPLAN + 1e-9) + 1  # every cycle up to the last step
    for (t, a), (_, b) in zip(ours.plans, theirs.plans):
        assert a.stamp == pytest.approx(b.stamp, abs=STAMP_ATOL), f"{where}cycle t={t:.1f} s"
        assert len(a) == len(b), f"{where}cycle t={t:.1f} s: {len(a)} vs {len(b)} points"
        for name in ("t", "x", "y", "heading", "velocity", "acceleration"):
            da, db = getattr(a, name), getattr(b, name)
            assert np.allclose(da, db, rtol=0.0, atol=TRAJ_ATOL), \
                f"{where}cycle t={t:.1f} s: {name} differs by up to {np.abs(da - db).max():.3g}"
    a, b = ours.log.ego_array(), theirs.log.ego_array()
    assert a.shape == b.shape and np.allclose(a, b, rtol=0.0, atol=TRAJ_ATOL), \
        f"{where}driven ego track differs by up to {np.abs(a - b).max():.3g}"
    assert a[-1, 0] - a[0, 0] > 10.0, "the ego should have driven along the road"
    if bank == "lane-change":  # the case must keep covering lateral motion, or it tests nothing more
        assert ours.decisions[0].top_action[1] != "K" and np.ptp(a[:, 1]) > 1.0, \
            f"no lane change to compare: decided {[d.top_action for d in ours.decisions]}, lateral range " \
            f"{np.ptp(a[:, 1]):.2f} m; pick a bank or scenario where the student changes lanes"
