"""The reflection round's parts without models: failure detection on simulated runs (the progress
monitor replayed over a log, as the node sees it), the bank copy, the outbox draining, the command's
input errors."""

import json
from dataclasses import asdict
import socket

import numpy as np
import pytest

from luna_bridge import cli
from luna_bridge.reflection_round import (ReflectionRoundError, RoundConfig, copy_bank, detect_failures,
                                          executed_decision, hindsight_recorder, reflect_all)
from luna_bridge.sim import simulate
from luna_core.llm import EndpointConfig, OpenAIChatModel
from luna_core.memory.bank import MemoryBank, stored_version
from luna_core.memory.embedders import MiniLMEmbedder
from luna_core.hindsight import HindsightConfig
from luna_core.monitor import MonitorParameters
from luna_core.planning.factory import make_planner
from luna_core.prompts import PromptManager
from luna_core.reflection import Outbox, ReflectionSystem
from luna_core.scene import build_scene
from luna_core.types import ACTION_CODES, DecisionDistribution, MemoryItem, TrafficLightPhase
from tests import samples
from tests.scenario_samples import blocked_lane_scenario, rear_end_scenario
from tests.unit.core.test_reflection import _request as grounded_request


# The monitor at T_d = 0.5 s, H = 10 (these logs are built around it; the default is T_d = 2 s, H = 3).
HALF_SECOND = MonitorParameters(decision_period=0.5, stall_window_cycles=10)


def _decisions(duration: float, code: str = "CK") -> list[DecisionDistribution]:
    p = np.zeros(len(ACTION_CODES))
    p[ACTION_CODES.index(code)] = 1.0
    return [DecisionDistribution(float(t), p) for t in np.arange(0.0, duration, 0.5)]


def _scenes(log, phase: TrafficLightPhase, every: int = 5) -> list:
    """The scene descriptor every T_d of a run, as the decision source builds it, under light ``phase``."""
    scenes = []
    for ego, objects in list(zip(log.ego, log.objects))[::every]:
        scene = build_scene(ego, objects, None, log.scenario.route, log.scenario.lane_graph)
        scene.traffic_light = phase
        scenes.append(scene)
    return scenes


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
    failures = detect_failures(rear_end_log, decisions, _scenes(rear_end_log, TrafficLightPhase.GREEN),
                               HALF_SECOND, cooldown=5.0)
    assert len(failures) == 1
    f = failures[0]
    assert f.colliding_ids == ["rear"] and not f.stall
    assert f.collision_kinds == {"rear": "ACTIVE_REAR"}  # the metrics do not count it at fault either
    assert f.issued_decision == "CK"
    # The decision issued about T_d before the check is the one explained.
    assert executed_decision(decisions, f).stamp == pytest.approx(f.decision_stamp)
    assert f.stamp - f.decision_stamp == pytest.approx(0.5)
    # Without the gate's cooldown the overlap is reported at every check while it lasts.
    repeated = detect_failures(rear_end_log, decisions, _scenes(rear_end_log, TrafficLightPhase.GREEN),
                               HALF_SECOND, cooldown=0.0)
    assert len(repeated) > 1 and all(r.colliding_ids == ["rear"] for r in repeated)


def test_standing_behind_a_parked_car_is_blocked_not_a_stall_and_nothing_under_a_red_light(blocked_log):
    speeds = np.array([e.velocity for e in blocked_log.ego])
    assert speeds[-30:].max() < 0.5, "the IDM ego should stand behind the parked car"
    green = detect_failures(blocked_log, _decisions(12.0, "SK"), _scenes(blocked_log, TrafficLightPhase.GREEN),
                            HALF_SECOND, cooldown=5.0)
    assert green and all(f.blocked_by == "parked" and not f.stall and not f.colliding_ids for f in green)
    assert green[0].issued_decision == "SK"
    red = detect_failures(blocked_log, _decisions(12.0, "SK"), _scenes(blocked_log, TrafficLightPhase.RED),
                          HALF_SECOND, cooldown=5.0)
    assert red == []
    # Without the scene descriptor (no decision source) nothing is known to hold the ego: a stall.
    blind = detect_failures(blocked_log, _decisions(12.0, "SK"), [], HALF_SECOND, cooldown=5.0)
    assert blind and all(f.stall for f in blind)


def test_the_blocked_run_seen_in_hindsight_from_its_log_never_asks_to_accelerate(blocked_log):
    from luna_core.hindsight import hindsight_check
    from luna_core.prompts import allowed_actions

    scenes = _scenes(blocked_log, TrafficLightPhase.GREEN)
    failure = detect_failures(blocked_log, _decisions(12.0, "SK"), scenes, HALF_SECOND, cooldown=5.0)[0]
    observation = hindsight_recorder(blocked_log, scenes, HindsightConfig()).observation(failure.decision_stamp)
    assert "parked" in observation.objects.ids and observation.scene is not None
    for executed in ("SK", "AK"):
        verdict = hindsight_check(observation, allowed_actions(observation.scene), executed)
        assert "AK" not in verdict.listed and "AK" in verdict.unsafe


def test_failure_before_any_decision_has_nothing_to_explain(rear_end_log):
    failures = detect_failures(rear_end_log, [], _scenes(rear_end_log, TrafficLightPhase.NONE), HALF_SECOND, 5.0)
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
        outbox.put(grounded_request())  # a revision is due: the LLM is asked to write it
        results = reflect_all(ReflectionSystem(llm, PromptManager(), bank), outbox, config)
        assert results == {} and len(outbox) == 1
        outbox.close()
        assert len(bank) == 1
    assert len(Outbox(tmp_path / "outbox")) == 1  # still there for a later round


def test_command_reports_bad_input_clearly(tmp_path, capsys):
    code = cli.main(["reflect", "--suite", "no-such-suite", "--out", str(tmp_path / "o")])
    assert code == 2 and "unknown suite 'no-such-suite'" in capsys.readouterr().err
    code = cli.main(["reflect", "--suite", "synthetic-hard", "--limit", "1", "--out", str(tmp_path / "o"),
                     "--rounds", "0"])
    assert code == 2 and "--rounds must be >= 1" in capsys.readouterr().err
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
    code = cli.main(base + ["--out", str(tmp_path / "b"), "--population", "2"])
    assert code == 2 and "population >= 4" in capsys.readouterr().err
    assert not (tmp_path / "a" / "memory_bank").exists() and not (tmp_path / "b" / "memory_bank").exists()


def test_the_rounds_table_counts_reflection_items_that_repeat_an_earlier_one(source_bank, tmp_path):
    from luna_bridge import reflection_round as rr

    bank_path = tmp_path / "round_1" / "memory_bank"
    copy_bank(source_bank, bank_path)
    query = PromptManager().decision_query(samples.scene())
    with MemoryBank.open(bank_path, writable=True) as bank:
        for item_id, answer in (("refl-1", "Recommended decisions: DK\nExplanations:\n- DK: slow."),
                                ("refl-2", "Recommended decisions: SK\nExplanations:\n- SK: stop."),
                                ("refl-3", "Recommended decisions: DK\nExplanations:\n- DK: slow.")):  # refl-1 again
            bank.append(MemoryItem(id=item_id, query=query, answer=answer, source="reflection"))
    assert rr._bank_sizes(bank_path) == (4, 3, 1)
    assert rr._bank_sizes(source_bank) == (1, 0, 0)
    config = RoundConfig(out_dir=tmp_path)
    table = rr.summary_markdown([rr.RoundResult(0, str(source_bank), 1, 0, reflection_repeats=0),
                                 rr.RoundResult(1, str(bank_path), 4, 3, rr.round_counts([], []),
                                                reflection_repeats=1),
                                 rr.RoundResult(2, str(bank_path), 4, 3, rr.round_counts([], []))], config)
    assert "| 0 | 1 (0 / 0) |" in table and "| 1 | 4 (3 / 1) |" in table
    assert "| 2 | 4 (3 / -) |" in table  # a round.json written before the count
    # such a round read back by run_rounds gets the count from its bank
    older = {k: v for k, v in asdict(rr.RoundResult(1, str(bank_path), 4, 3, rr.round_counts([], []))).items()
             if k != "reflection_repeats"}
    (tmp_path / "round_1" / rr.ROUND_FILE).write_text(json.dumps(older))
    config = RoundConfig(out_dir=tmp_path, rounds=1, stack=rr.StackSettings(memory_bank=str(source_bank)))
    results = rr.run_rounds([object()], config)
    assert [r.reflection_repeats for r in results] == [0, 1]
    assert json.loads((tmp_path / "round_1" / rr.ROUND_FILE).read_text())["reflection_repeats"] == 1


def test_a_rounds_wall_time_is_counted_once(source_bank, tmp_path, monkeypatch):
    """reflect_round measures its deployment and reflection; run_rounds adds only the evaluation's time
    (none here), on a clock that advances 10 s per reading (it counted the round twice: 7.7 ks for 3.9 ks)."""
    import itertools
    import types

    from luna_bridge import reflection_round as rr

    ticks = itertools.count(0.0, 10.0)
    monkeypatch.setattr(rr, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))

    def fake_round(r, deploy_set, previous_bank, config, llm):  # what reflect_round returns, measured by itself
        copy_bank(previous_bank, tmp_path / "out" / f"round_{r}" / "memory_bank")
        return rr.RoundResult(r, str(tmp_path / "out" / f"round_{r}" / "memory_bank"), 1, 0, wall_time=42.0)

    monkeypatch.setattr(rr, "reflect_round", fake_round)
    monkeypatch.setattr(rr, "write_summary", lambda *args: None)
    config = RoundConfig(out_dir=tmp_path / "out", rounds=1,
                         stack=rr.StackSettings(memory_bank=str(source_bank)))
    results = rr.run_rounds([object()], config)
    assert [r.wall_time for r in results] == [0.0, 42.0]
    assert json.loads((tmp_path / "out" / "round_1" / rr.ROUND_FILE).read_text())["wall_time"] == 42.0


def test_deployment_runs_on_disk_are_resumed_only_under_their_own_settings(tmp_path):
    from luna_bridge import reflection_round as rr

    folder = tmp_path / "round_1" / rr.DEPLOY_DIR
    config = RoundConfig(out_dir=tmp_path)
    assert rr.deploy([], rr.StackSettings(k=3), config, "deploy", folder) == []  # records the settings
    assert json.loads((folder / rr.DEPLOY_SETTINGS).read_text())["stack"]["k"] == 3
    assert rr.deploy([], rr.StackSettings(k=3), config, "deploy", folder) == []  # the same: resumes
    with pytest.raises(ReflectionRoundError, match=r"other settings \(stack\)"):
        rr.deploy([], rr.StackSettings(k=1), config, "deploy", folder)
    with pytest.raises(ReflectionRoundError, match=r"other settings \(reactive\)"):
        rr.deploy([], rr.StackSettings(k=3), RoundConfig(out_dir=tmp_path, reactive=True), "deploy", folder)
