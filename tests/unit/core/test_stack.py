"""luna_core.stack, the composition root: each builder makes a working part from its config (a real
untrained student, a real MiniLM bank, a real monitor), and a bad config is refused naming its field."""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest
import torch

from luna_core import types as T
from luna_core.heuristic import HeuristicSystem
from luna_core.llm import LLMConfigError, OpenAIChatModel
from luna_core.memory.bank import MemoryBank, MemoryBankError
from luna_core.monitor import MonitorParameters
from luna_core.scene import SceneConfig, SceneInputError
from luna_core.stack import (FROM_CONFIG, HeuristicStackConfig, LLMClientConfig, MonitorConfig, SceneDescriber,
                             StackConfigError, build_heuristic_system, build_llm_client, build_progress_monitor,
                             executed_decision, load_student, open_memory_bank)
from luna_core.student import StudentError
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir

torch.set_num_threads(1)  # the CI machine is shared


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    bank, ids = make_bank(root)
    return make_student_dir(root), bank, ids


def test_the_heuristic_system_is_built_from_its_config_and_decides(artifacts) -> None:
    student, bank, ids = artifacts
    config = HeuristicStackConfig(student=str(student), memory_bank=str(bank), device="cpu", k=2, gamma_p=0.2,
                                  retrieval_margin=0.0, min_similarity=-0.5)
    system = build_heuristic_system(config)
    assert isinstance(system, HeuristicSystem) and isinstance(system.bank, MemoryBank)
    assert (system.config.k, system.config.gamma_p, system.config.retrieval_margin,
            system.config.min_similarity) == (2, 0.2, 0.0, -0.5)
    d = system.decide(samples.scene())
    assert len(d.retrieved_ids) == 2 and set(d.retrieved_ids) <= set(ids)
    assert math.isclose(float(np.sum(d.probabilities)), 1.0, abs_tol=1e-5)
    # C_t by Eq. 19 at the config's gamma_p, with its fallback (the untrained test head may put no action
    # at 0.2; a fresh-clone run saw max 0.193, and then C_t is the most likely action alone).
    assert d.candidate_set == T.candidate_set(d.probabilities, 0.2)
    # Parts a caller already holds are used as given (the bridge shares one student across variants);
    # the same config and student decide the same, with or without the builder loading them.
    shared = build_heuristic_system(config, student=system.student, bank=None)
    assert shared.student is system.student and shared.bank is None
    again = build_heuristic_system(config, student=system.student, bank=FROM_CONFIG)
    system.reset()
    assert np.array_equal(again.decide(samples.scene()).probabilities, system.decide(samples.scene()).probabilities)


def test_memory_bank_none_decides_without_retrieval(artifacts) -> None:
    student, _, _ = artifacts
    config = HeuristicStackConfig(student=str(student), memory_bank="none", device="cpu")
    assert not config.retrieves
    system = build_heuristic_system(config)
    assert system.bank is None and system.decide(samples.scene()).retrieved_ids == []


def test_missing_artifacts_are_named(tmp_path) -> None:
    missing = tmp_path / "no_student"
    with pytest.raises(StudentError, match=re.escape(str(missing))):
        load_student(HeuristicStackConfig(student=str(missing), device="cpu"))
    with pytest.raises((FileNotFoundError, MemoryBankError), match=re.escape(str(tmp_path / "no_bank"))):
        open_memory_bank(HeuristicStackConfig(memory_bank=str(tmp_path / "no_bank")))


@pytest.mark.parametrize("make, field", [
    (lambda: HeuristicStackConfig(k=-1), "HeuristicStackConfig.k"),
    (lambda: HeuristicStackConfig(k=1.5), "HeuristicStackConfig.k"),
    (lambda: HeuristicStackConfig(gamma_p=1.5), "HeuristicStackConfig.gamma_p"),
    (lambda: HeuristicStackConfig(retrieval_margin=math.nan), "HeuristicStackConfig.retrieval_margin"),
    (lambda: HeuristicStackConfig(lesson_weight=-0.1), "HeuristicStackConfig.lesson_weight"),
    (lambda: HeuristicStackConfig(min_similarity=1.5), "HeuristicStackConfig.min_similarity"),
    (lambda: HeuristicStackConfig(device="tpu"), "HeuristicStackConfig.device"),
    (lambda: HeuristicStackConfig(default_bank="shared"), "HeuristicStackConfig.default_bank"),
    (lambda: HeuristicStackConfig(max_context_tokens=-5), "HeuristicStackConfig.max_context_tokens"),
    (lambda: HeuristicStackConfig(student=None), "HeuristicStackConfig.student"),
    (lambda: LLMClientConfig(endpoint="http://x", timeout=0.0), "LLMClientConfig.timeout"),
    (lambda: MonitorConfig(failure_cooldown=-1.0), "MonitorConfig.failure_cooldown"),
    (lambda: MonitorConfig(parameters={"decision_period": 2.0}), "MonitorConfig.parameters"),
])
def test_a_bad_config_is_refused_naming_the_field(make, field) -> None:
    with pytest.raises(StackConfigError, match=field.replace(".", r"\.")):
        make()


def test_builders_refuse_the_wrong_config_type() -> None:
    with pytest.raises(StackConfigError, match="needs a HeuristicStackConfig, got dict"):
        build_heuristic_system({"k": 3})
    with pytest.raises(StackConfigError, match="needs an LLMClientConfig"):
        build_llm_client(HeuristicStackConfig())
    with pytest.raises(StackConfigError, match="needs a MonitorConfig"):
        build_progress_monitor(MonitorParameters())


def test_the_llm_client_reads_its_key_from_the_environment_and_never_shows_it(monkeypatch, caplog) -> None:
    secret = "sk-test-0123456789abcdef"
    assert build_llm_client(LLMClientConfig()) is None  # no endpoint: the hindsight check writes
    monkeypatch.setenv("LUNA_TEST_REFLECTION_KEY", secret)
    caplog.set_level(logging.DEBUG)
    llm = build_llm_client(LLMClientConfig(endpoint="http://127.0.0.1:9/v1", model="m",
                                           api_key_env="LUNA_TEST_REFLECTION_KEY", timeout=5.0))
    assert isinstance(llm, OpenAIChatModel)
    assert llm.config.max_retries == 0 and llm.config.timeout == 5.0  # the outbox does the retrying
    assert llm.config.api_key_env == "LUNA_TEST_REFLECTION_KEY" and secret not in repr(llm.config)
    monkeypatch.delenv("LUNA_TEST_REFLECTION_KEY")
    with pytest.raises(LLMConfigError, match="LUNA_TEST_REFLECTION_KEY"):
        build_llm_client(LLMClientConfig(endpoint="http://127.0.0.1:9/v1", api_key_env="LUNA_TEST_REFLECTION_KEY"))
    # A key pasted where the variable's name belongs is refused without being echoed.
    with pytest.raises(StackConfigError, match=r"LLMClientConfig\.api_key_env") as info:
        LLMClientConfig(endpoint="http://127.0.0.1:9/v1", api_key_env=secret + " ")
    assert secret not in str(info.value)
    assert secret not in caplog.text


def _stand_still(detector, t_end: float) -> None:
    for k in range(int(round(t_end / 0.05)) + 1):
        detector.monitor.update_ego(T.EgoState(stamp=k * 0.05, x=0.0, y=0.0, heading=0.0, velocity=0.0))
    for k in range(int(round(t_end / 0.1)) + 1):
        detector.monitor.update_objects(T.TrackedObjects(round(k * 0.1, 9), []))


def test_the_monitor_tick_reports_a_lasting_stall_once_per_cooldown() -> None:
    detector = build_progress_monitor(MonitorConfig(MonitorParameters(decision_period=0.5, stall_window_cycles=4),
                                                    failure_cooldown=1.0))
    decision = T.DecisionDistribution(1.0, np.eye(T.NUM_ACTIONS)[T.ACTION_INDEX["SK"]])
    detector.monitor.on_decision(decision)
    _stand_still(detector, 4.0)
    first = detector.tick(2.0)
    assert first.detected is not None and first.detected.stall
    assert first.admitted is not None and first.admitted.stall and first.admitted.issued_decision == "SK"
    second = detector.tick(2.5)  # still standing, within the cooldown: detected, not published again
    assert second.detected is not None and second.detected.stall and second.admitted is None
    third = detector.tick(3.0)  # the cooldown is over
    assert third.admitted is not None and third.admitted.stall
    assert executed_decision([decision], third.admitted) is decision


def test_the_executed_decision_is_the_one_named_by_stamp_else_the_last_before() -> None:
    def d(stamp: float) -> T.DecisionDistribution:
        return T.DecisionDistribution(stamp, np.full(T.NUM_ACTIONS, 0.1))

    decisions = [d(0.0), d(2.0), d(4.0), d(6.0)]
    named = T.FailureEvent(stamp=5.0, issued_decision="CK", decision_stamp=2.0 + 1e-7, stall=True)
    assert executed_decision(decisions, named) is decisions[1]
    # The named decision never arrived (dropped from the history): the last one before the failure.
    unknown = T.FailureEvent(stamp=5.0, issued_decision="CK", decision_stamp=3.0, stall=True)
    assert executed_decision(decisions, unknown) is decisions[2]
    # Nothing issued before the failure: nothing to explain (a later decision is never blamed).
    early = T.FailureEvent(stamp=-1.0, issued_decision="", decision_stamp=0.0, stall=True)
    assert executed_decision(decisions, early) is None
    assert executed_decision([], named) is None


def test_the_scene_describer_carries_the_last_two_top_actions_into_the_scene() -> None:
    from tests.unit.core.test_scene import car, ego_at, junction_world

    graph, route, lights = junction_world()
    describer = SceneDescriber(SceneConfig(max_objects=1))
    objects = T.TrackedObjects(0.0, [car("a", 30.0, 1.75), car("b", 40.0, 1.75)])
    assert describer.describe(ego_at(0.0), objects, lights, route, graph).recent_decisions == []
    for code in ("AK", "CK", "DK"):
        describer.on_decision(T.DecisionDistribution(0.0, np.eye(T.NUM_ACTIONS)[T.ACTION_INDEX[code]]))
    scene = describer.describe(ego_at(0.0), objects, lights, route, graph)
    assert scene.recent_decisions == ["CK", "DK"] and len(scene.objects) == 1  # its config applies
    describer.reset()
    assert describer.describe(ego_at(0.0), objects, lights, route, graph).recent_decisions == []
    with pytest.raises(SceneInputError, match="non-finite"):
        describer.describe(ego_at(math.nan), objects, lights, route, graph)
