"""The reflection round's parts without models: failure detection on simulated runs (the progress
monitor replayed over a log, as the node sees it), the bank copy, the outbox draining, the command's
input errors."""

import socket

import numpy as np
import pytest

from luna_bridge import cli
from luna_bridge.reflection_round import (ReflectionRoundError, RoundConfig, copy_bank, detect_failures,
                                          executed_decision, reflect_all)
from luna_bridge.sim import simulate
from luna_core.llm import EndpointConfig, OpenAIChatModel
from luna_core.memory.bank import MemoryBank, stored_version
from luna_core.memory.embedders import MiniLMEmbedder
from luna_core.monitor import MonitorParameters
from luna_core.planning.factory import make_planner
from luna_core.prompts import PromptManager
from luna_core.reflection import Outbox, ReflectionRequest, ReflectionSystem
from luna_core.types import ACTION_CODES, DecisionDistribution, MemoryItem, TrafficLightPhase
from tests import samples
from tests.scenario_samples import blocked_lane_scenario, rear_end_scenario


def _decisions(duration: float, code: str = "CK") -> list[DecisionDistribution]:
    p = np.zeros(len(ACTION_CODES))
    p[ACTION_CODES.index(code)] = 1.0
    return [DecisionDistribution(float(t), p) for t in np.arange(0.0, duration, 0.5)]


def _lights(duration: float, phase: TrafficLightPhase) -> list[tuple[float, TrafficLightPhase]]:
    return [(float(t), phase) for t in np.arange(0.0, duration, 0.5)]


@pytest.fixture(scope="module")
def rear_end_log():
    scenario = rear_end_scenario()
    return simulate(scenario, make_planner("idm"))


@pytest.fixture(scope="module")
def blocked_log():
    scenario = blocked_lane_scenario()
    return simulate(scenario, make_planner("idm"))


def test_collision_is_reported_once_per_cooldown_with_the_decision_in_force(rear_end_log):
    decisions = _decisions(3.0)
    failures = detect_failures(rear_end_log, decisions, _lights(3.0, TrafficLightPhase.GREEN), MonitorParameters(decision_period=0.5, stall_window_cycles=10),
                               cooldown=5.0)
    assert len(failures) == 1
    f = failures[0]
    assert f.colliding_ids == ["rear"] and not f.stall
    assert f.issued_decision == "CK"
    # The decision issued about T_d before the check is the one explained.
    assert executed_decision(decisions, f).stamp == pytest.approx(f.decision_stamp)
    assert f.stamp - f.decision_stamp == pytest.approx(0.5)
    # Without the gate's cooldown the overlap is reported at every check while it lasts.
    repeated = detect_failures(rear_end_log, decisions, _lights(3.0, TrafficLightPhase.GREEN), MonitorParameters(decision_period=0.5, stall_window_cycles=10),
                               cooldown=0.0)
    assert len(repeated) > 1 and all(r.colliding_ids == ["rear"] for r in repeated)


def test_stall_behind_a_parked_car_is_a_failure_only_under_a_permissive_light(blocked_log):
    speeds = np.array([e.velocity for e in blocked_log.ego])
    assert speeds[-30:].max() < 0.5, "the IDM ego should stand behind the parked car"
    green = detect_failures(blocked_log, _decisions(12.0, "SK"), _lights(12.0, TrafficLightPhase.GREEN),
                            MonitorParameters(decision_period=0.5, stall_window_cycles=10), cooldown=5.0)
    assert green and all(f.stall and not f.colliding_ids for f in green)
    assert green[0].issued_decision == "SK"
    red = detect_failures(blocked_log, _decisions(12.0, "SK"), _lights(12.0, TrafficLightPhase.RED),
                          MonitorParameters(decision_period=0.5, stall_window_cycles=10), cooldown=5.0)
    assert red == []


def test_failure_before_any_decision_has_nothing_to_explain(rear_end_log):
    failures = detect_failures(rear_end_log, [], _lights(3.0, TrafficLightPhase.NONE), MonitorParameters(decision_period=0.5, stall_window_cycles=10), 5.0)
    assert failures and failures[0].issued_decision == ""
    assert executed_decision([], failures[0]) is None


@pytest.fixture(scope="module")
def source_bank(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "bank"
    prompts = PromptManager()
    with MemoryBank.create(path, MiniLMEmbedder()) as bank:
        bank.append(MemoryItem(id="seed", query=prompts.decision_query(samples.scene()),
                               answer="Recommended decisions: CK\nExplanations: keep the lane.",
                               distribution=np.eye(len(ACTION_CODES))[ACTION_CODES.index("CK")]))
    return path


def test_bank_copy_leaves_the_source_alone_and_refuses_to_reuse_an_earlier_copy(source_bank, tmp_path):
    target = tmp_path / "round" / "memory_bank"
    copy_bank(source_bank, target)
    before = (source_bank / "items.jsonl").read_bytes()
    with MemoryBank.open(target, writable=True) as bank:
        bank.append(MemoryItem(id="refl-x", query=PromptManager().decision_query(samples.scene()),
                               answer="Recommended decisions: DK", distribution=None, source="reflection"))
        assert len(bank) == 2
    assert (source_bank / "items.jsonl").read_bytes() == before and stored_version(source_bank) == 1
    with pytest.raises(ReflectionRoundError, match="already exists"):
        copy_bank(source_bank, target)
    with pytest.raises(ReflectionRoundError, match="no memory bank"):
        copy_bank(tmp_path / "nowhere", tmp_path / "other")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_leaves_requests_in_the_outbox(source_bank, tmp_path):
    target = tmp_path / "memory_bank"
    copy_bank(source_bank, target)
    llm = OpenAIChatModel(EndpointConfig(model="m", base_url=f"http://127.0.0.1:{_closed_port()}/v1", timeout=2.0,
                                         max_retries=0))
    config = RoundConfig(out_dir=tmp_path, endpoint_wait=0.3, backoff_base=0.1, backoff_max=0.1)
    with MemoryBank.open(target, writable=True) as bank:
        outbox = Outbox(tmp_path / "outbox")
        outbox.put(ReflectionRequest.from_events(samples.explanation(), samples.failure()))
        results = reflect_all(ReflectionSystem(llm, PromptManager(), bank), outbox, config)
        assert results == {} and len(outbox) == 1
        outbox.close()
        assert len(bank) == 1
    assert len(Outbox(tmp_path / "outbox")) == 1  # still there for a later round


def test_command_reports_bad_input_clearly(tmp_path, capsys):
    code = cli.main(["reflect", "--suite", "no-such-suite", "--out", str(tmp_path / "o")])
    assert code == 2 and "unknown suite 'no-such-suite'" in capsys.readouterr().err
    code = cli.main(["reflect", "--suite", "synthetic-hard", "--limit", "1", "--out", str(tmp_path / "o"),
                     "--planner-option", "population"])
    assert code == 2 and "expected KEY=VALUE" in capsys.readouterr().err
    code = cli.main(["reflect", "--suite", "synthetic-hard", "--limit", "1", "--out", str(tmp_path / "o"),
                     "--memory-bank", str(tmp_path / "missing")])
    assert code == 2 and "no memory bank" in capsys.readouterr().err
    assert not (tmp_path / "o" / "memory_bank").exists()


def test_configuration_errors_stop_the_round_before_it_drives(source_bank, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LUNA_TEST_NO_SUCH_KEY", raising=False)
    base = ["reflect", "--suite", "synthetic-hard", "--limit", "1", "--memory-bank", str(source_bank)]
    code = cli.main(base + ["--out", str(tmp_path / "a"), "--endpoint", "http://127.0.0.1:9/v1",
                            "--api-key-env", "LUNA_TEST_NO_SUCH_KEY"])
    assert code == 2 and "LUNA_TEST_NO_SUCH_KEY" in capsys.readouterr().err
    code = cli.main(base + ["--out", str(tmp_path / "b"), "--planner-option", "warp_speed=9"])
    assert code == 2 and "unknown option(s) ['warp_speed']" in capsys.readouterr().err
    assert not (tmp_path / "a" / "memory_bank").exists() and not (tmp_path / "b" / "memory_bank").exists()
