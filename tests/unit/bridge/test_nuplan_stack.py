"""The full LUNA stack in the nuPlan devkit: ``luna_bridge.stack_planner.make_decision_source`` (the one
factory of a variant's decision source, ``decision_source``, with its settings as keywords) as
``config/planner/luna_stack_planner.yaml`` calls it, with the real bundled student and memory bank
(``models/``), and ``LunaNuPlanPlanner`` deciding and planning with it on real devkit objects where the
devkit is importable (skipped with the reason elsewhere).

One student forward pass per decision costs about a second on this CPU, so the tests retrieve K = 1
item (the bundled student was trained with K <= 1) and make as few decisions as they can.
"""

from __future__ import annotations

import importlib
import re
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from luna_core import types as T
from luna_core.lanes import make_lane
from luna_core.planning.factory import make_planner

from luna_bridge.stack_planner import (StackConfigError, StackSettings, make_decision_source, search_planner)
from tests.unit.bridge.test_nuplan_adapter import T0_US, X0, Y0, FakeMap
from tests.devkit import require_devkit

import luna_bridge.nuplan

CONFIG = Path(luna_bridge.nuplan.__file__).parent / "config" / "planner"


def stack_config() -> dict[str, Any]:
    return yaml.safe_load((CONFIG / "luna_stack_planner.yaml").read_text(encoding="utf-8"))["luna_stack_planner"]


def locate(dotted: str) -> Any:
    """What hydra's ``_target_`` resolves to: the module path, then the attribute."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(scope="module")
def source() -> Any:
    """The YAML's decision source with the bundled student and bank, K = 1 (one short call)."""
    torch.set_num_threads(1)  # the machine is shared
    args = dict(stack_config()["decision_source"])
    assert locate(args.pop("_target_")) is make_decision_source
    assert (args["student"], args["memory_bank"]) == ("", "")  # the bundled models/student, models/memory_bank
    return make_decision_source(**{**args, "k": 1})


def planner_input() -> T.PlannerInput:
    """Two lanes along +x (the ego in the right one, 8 m/s), a slower car 25 m ahead in the ego's lane."""
    graph = T.LaneGraph()
    xs = np.linspace(-50.0, 250.0, 31)
    graph.add(make_lane("right", np.column_stack([xs, np.zeros_like(xs)]), 3.5, 15.0, road_id="r0",
                        left_neighbor="left"))
    graph.add(make_lane("left", np.column_stack([xs, np.full_like(xs, 3.5)]), 3.5, 15.0, road_id="r0",
                        right_neighbor="right"))
    history = [T.EgoState(0.1 * k, 0.8 * k, 0.0, 0.0, 8.0) for k in range(-5, 1)]
    lead = T.TrackedObject("lead", T.ObjectClass.VEHICLE, 25.0, 0.0, 0.0, 5.0, 0.0, 4.6, 1.9)
    return T.PlannerInput(0.0, history, T.TrackedObjects(0.0, [lead]), T.TrafficLights(0.0), graph,
                          T.Route(0.0, ["r0"], 200.0, 0.0, 0.0))


def test_the_stack_config_builds_the_bundled_decision_source_and_it_decides(source) -> None:
    pin = planner_input()
    d = source.decide(pin)
    assert d is not None and d.stamp == pin.time and len(source.decisions) == 1
    T.validate_distribution(d.probabilities)
    assert all(d.probabilities[T.ACTION_INDEX[c]] == 0.0 for c in ("AR", "CR", "DR"))  # no lane on the right
    assert d.candidate_set and all(d.probabilities[T.ACTION_INDEX[c]] >= 0.1 for c in d.candidate_set)
    bank = source.heuristic.bank
    assert len(bank) > 0 and len(d.retrieved_ids) == 1 and d.retrieved_ids[0] in bank  # from the bundled bank
    assert source.scenes and not source.scene_errors
    source.reset()  # a new scenario: nothing of the last one is kept
    assert (source.decisions, source.scenes, source.scene_errors) == ([], [], [])


def test_bad_artifact_paths_and_settings_are_named(source, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_student"
    with pytest.raises(StackConfigError, match=re.escape(f"cannot load the stack's student: {missing}")):
        make_decision_source("luna-k0", student=str(missing))
    empty = tmp_path / "empty_student"
    empty.mkdir()
    with pytest.raises(StackConfigError, match=f"student: .*{re.escape(str(empty))}"):
        make_decision_source("luna-k0", student=str(empty))
    with pytest.raises(StackConfigError, match=f"memory bank: .*{re.escape(str(tmp_path / 'no_bank'))}"):
        make_decision_source("luna", memory_bank=str(tmp_path / "no_bank"))
    with pytest.raises(StackConfigError, match="unknown stack variant 'luna-xl'"):
        make_decision_source("luna-xl")
    with pytest.raises(StackConfigError, match="0 <= gamma_p <= 1"):
        make_decision_source("luna", gamma_p=1.5)


def test_the_stack_config_plans_as_the_eval_stack() -> None:
    """The YAML's planner is the one ``luna-bridge eval --planner luna --replan-every 5`` builds from the
    stack's default settings (``search_planner``), its decisions every T_d of those settings."""
    cfg = stack_config()
    defaults = StackSettings()
    options = dict(cfg["planner_options"])
    assert options.pop("gamma_p") == "${..decision_source.gamma_p}"  # hydra interpolation: one threshold
    assert cfg["decision_source"]["gamma_p"] == defaults.gamma_p and cfg["decision_source"]["k"] == defaults.k
    ours = make_planner(cfg["planner"], {**options, "gamma_p": cfg["decision_source"]["gamma_p"]})
    assert ours.config == search_planner(True, defaults).config
    assert cfg["decision_every"] == defaults.decision_every == 20  # T_d = 2.0 s
    assert cfg["replan_every"] == 5  # replanning every 0.5 s
    assert cfg["planner_name"] == "stack_${.decision_source.variant}"  # runs of each variant named apart
    assert cfg["_target_"] == "luna_bridge.nuplan.planner.LunaNuPlanPlanner"  # imports the devkit: see below
    plain = yaml.safe_load((CONFIG / "luna_planner.yaml").read_text(encoding="utf-8"))["luna_planner"]
    assert plain["decision_source"] is None and set(plain) == set(cfg)


def test_devkit_simulation_config_composes_with_the_stack_on_test14(tmp_path: Path) -> None:
    """The overrides of the documented ``run_simulation.py`` command compose with the devkit's own
    ``default_simulation`` config: our planner (variant selectable) and the Test14 scenario filter."""
    require_devkit("hydra")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from luna_bridge.nuplan.scenario_filter import main as write_filter

    shared = Path(__file__).resolve().parents[3].parent / "shared" / "nuplan"
    tokens = shared / "test14_hard_tokens.txt"
    if not tokens.exists():
        pytest.skip(f"no Test14-Hard token list at {tokens}")
    assert write_filter([str(tokens), str(tmp_path / "scenario_filter" / "test14_hard.yaml")]) == 0
    with initialize_config_module("nuplan.planning.script.config.simulation", version_base=None):
        cfg = compose("default_simulation", overrides=[
            "+simulation=closed_loop_nonreactive_agents", "planner=luna_stack_planner",
            "scenario_builder=nuplan_challenge", "scenario_filter=test14_hard", "worker=sequential",
            "planner.luna_stack_planner.decision_source.variant=luna-k0",
            f"hydra.searchpath=[pkg://luna_bridge.nuplan.config, file://{tmp_path}, "
            "pkg://nuplan.planning.script.config.common, pkg://nuplan.planning.script.experiments]"])
    assert list(cfg.planner) == ["luna_stack_planner"]  # replaces the experiment's simple_planner
    planner = cfg.planner.luna_stack_planner
    assert planner.planner_name == "stack_luna-k0" and planner.planner_options.gamma_p == 0.1
    builder = OmegaConf.to_container(cfg.scenario_builder, resolve=False)  # $NUPLAN_DATA_ROOT may be unset
    assert len(cfg.scenario_filter.scenario_tokens) == 272 and builder["data_root"].endswith("/nuplan-v1.1/test/")


def test_devkit_stack_planner_decides_every_t_d_and_replans_every_half_second_on_real_devkit_objects() -> None:
    """``luna_stack_planner.yaml`` instantiated by hydra as the devkit's ``build_planners`` does, run for
    21 devkit steps on real devkit objects: decisions at steps 0 and 20 only (T_d = 2.0 s), planner calls
    every 5 steps (0.5 s), the planner in decision mode with the fresh decision, and ``initialize``
    resetting the source."""
    require_devkit("hydra")
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from nuplan.common.actor_state.agent import Agent
    from nuplan.common.actor_state.ego_state import EgoState
    from nuplan.common.actor_state.oriented_box import OrientedBox
    from nuplan.common.actor_state.scene_object import SceneObjectMetadata
    from nuplan.common.actor_state.state_representation import StateSE2, StateVector2D, TimePoint
    from nuplan.common.actor_state.tracked_objects import TrackedObjects
    from nuplan.common.actor_state.tracked_objects_types import TrackedObjectType
    from nuplan.common.actor_state.vehicle_parameters import get_pacifica_parameters
    from nuplan.common.maps.maps_datatypes import SemanticMapLayer
    from nuplan.planning.simulation.history.simulation_history_buffer import SimulationHistoryBuffer
    from nuplan.planning.simulation.observation.observation_type import DetectionsTracks
    from nuplan.planning.simulation.planner.abstract_planner import PlannerInitialization, PlannerInput
    from nuplan.planning.simulation.simulation_time_controller.simulation_iteration import SimulationIteration
    from nuplan.planning.simulation.trajectory.interpolated_trajectory import InterpolatedTrajectory

    from luna_bridge.nuplan.planner import LunaNuPlanPlanner

    cfg = OmegaConf.load(CONFIG / "luna_stack_planner.yaml")
    # K = 1 and a small population keep the two cycles short; everything else as shipped.
    cfg.luna_stack_planner.decision_source.k = 1
    cfg.luna_stack_planner.planner_options.population = 16
    planner_cfg = cfg.luna_stack_planner.copy()  # what the devkit's planner builder instantiates
    assert locate(planner_cfg._target_) is LunaNuPlanPlanner and LunaNuPlanPlanner.requires_scenario is False
    planner = instantiate(planner_cfg)
    made = planner._decision_source  # the source hydra built from the YAML
    assert planner.name() == "stack_luna" and made.heuristic.config.k == 1 and made.heuristic.config.gamma_p == 0.1
    assert planner._planner.config.objective.gamma_p == 0.1 and planner._planner.config.deterministic

    params = get_pacifica_parameters()
    ego_states, observations = deque(maxlen=21), deque(maxlen=21)

    def observe(k: int) -> None:  # the ego at 8 m/s along lane L1, a car stopped 35 m ahead of its start
        t = TimePoint(T0_US + k * 100_000)
        ego_states.append(EgoState.build_from_rear_axle(StateSE2(X0 + 10 + 0.8 * k, Y0, 0.0), StateVector2D(8.0, 0.0),
                                                        StateVector2D(0.0, 0.0), 0.0, t, params))
        lead = Agent(TrackedObjectType.VEHICLE, OrientedBox(StateSE2(X0 + 45, Y0, 0.0), 4.6, 1.9, 1.7),
                     StateVector2D(0.0, 0.0), SceneObjectMetadata(t.time_us, "tok", 1, "lead"))
        observations.append(DetectionsTracks(TrackedObjects([lead])))

    for k in range(-20, 1):
        observe(k)
    planner.initialize(PlannerInitialization(["rb1", "rbc1", "rb2"], StateSE2(X0 + 250, Y0, 0.0),
                                             FakeMap(SemanticMapLayer)))
    trajectories, decided_at = [], []
    for step in range(21):  # 2.0 s of devkit steps: decisions every T_d = 20 steps, plans every 5
        if step:
            observe(step)
        history = SimulationHistoryBuffer(deque(ego_states), deque(observations), 0.1)
        before = len(made.decisions)
        trajectories.append(planner.compute_trajectory(
            PlannerInput(SimulationIteration(ego_states[-1].time_point, step), history, [])))
        if len(made.decisions) > before:
            decided_at.append(step)
            last = planner._planner.last
            assert last.decision_stamp == made.decisions[-1].stamp
            assert last.decision_stamp == pytest.approx(ego_states[-1].time_point.time_s)
            # At step 20 the scripted ego, which ignores the plans, is 15 m from the stopped car at 8 m/s:
            # the planner may find nothing feasible then and publish the least-bad trajectory.
            assert last.mode == "decision" if step == 0 else last.mode in ("decision", "least_bad")
    assert decided_at == [0, 20]
    for start in range(0, 20, 5):  # between planner calls the last trajectory is returned as it is
        assert all(t is trajectories[start] for t in trajectories[start + 1:start + 5])
        assert trajectories[start + 5] is not trajectories[start]
    for step in (0, 5):
        traj, now = trajectories[step], T0_US + step * 100_000
        assert isinstance(traj, InterpolatedTrajectory) and traj.start_time.time_us == now
        # The planner scores 4 s (40 x 0.1 s, as PDM-Closed): within them it brakes and stays behind the
        # stopped car. (The unscored tail of the 8 s output may run on: it is replanned every 0.5 s.)
        scored = [s for s in traj.get_sampled_trajectory() if s.time_point.time_us <= now + 4_000_000]
        front = np.array([s.rear_axle.x for s in scored]) - X0 + params.front_length
        assert front.max() < 45 - 4.6 / 2 and scored[-1].dynamic_car_state.speed < 6.0
    for d in made.decisions:
        T.validate_distribution(d.probabilities)
    planner.initialize(PlannerInitialization(["rb1", "rbc1", "rb2"], StateSE2(X0 + 250, Y0, 0.0),
                                             FakeMap(SemanticMapLayer)))
    assert made.decisions == [] and made.scenes == []  # a new scenario starts without the last one's records
