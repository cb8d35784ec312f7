"""The full stack in process (``luna_bridge.stack_planner``): the decision variants of the Table V
ablations with a real (untrained) student and a real memory bank, and ``luna-bridge eval`` running
them next to a baseline. Small populations keep the planner calls short; the code path is the one
the evaluation runs."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from luna_core import types as T
from luna_core.memory.bank import MemoryBank
from luna_core.prompts import PromptManager
from luna_core.types import PlannerInput, TrackedObjects, TrafficLights

from luna_bridge import eval_command, reflection_round
from luna_bridge.evaluate import EvalConfig, run_evaluation
from luna_bridge.scenarios.format import save_scenario
from luna_bridge.stack_planner import (STUDENT_PLANNERS, StackConfigError, StackSettings, WithoutReflections,
                                       make_stack_planner, stack_settings_from_args)
from tests import samples
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.unit.bridge.test_eval import scenario

REFLECTION_ID = "reflection-1"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An untrained student on disk and a bank of 2 teacher items + 1 reflection item (K = 3 retrieves
    all three, so the full stack always sees the reflection item). The item is a grounded revision about
    a lead in the ego lane at 7.8 m/s: the scenarios' lead (6 m/s) is like it, so its lesson acts."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stack")
    student = make_student_dir(root)
    bank_path, _ = make_bank(root, n=2)
    scene = samples.scene()
    with MemoryBank.open(bank_path, writable=True) as bank:
        bank.append(T.MemoryItem(id=REFLECTION_ID, query=PromptManager().decision_query(scene),
                                 answer="Recommended decisions: DK\nExplanations:\n- DK: Vehicle veh-1 19 m ahead "
                                        "(same lane) at 8 m/s; clear, 15 m progress. CK instead: hits veh-1 in 2.1 s.",
                                 source="reflection"))
    return student, bank_path


def settings(artifacts: tuple[Path, Path], **kw) -> StackSettings:
    student, bank = artifacts
    base = dict(student=str(student), memory_bank=str(bank), population=8, iterations=1, decision_every=20)
    return StackSettings(**{**base, **kw})


def planner_input() -> PlannerInput:
    s = scenario("x", 20.0)
    return PlannerInput(0.0, [s.ego_initial], TrackedObjects(0.0, s.objects_at(0.0).objects), TrafficLights(0.0),
                        s.lane_graph, s.route, None)


@pytest.mark.slow  # four student forward passes: ~12 s of CPU, 25 s wall on the shared machine
def test_decision_variants(artifacts) -> None:
    cfg = settings(artifacts)
    pin = planner_input()
    decided = {v: make_stack_planner(v, settings=cfg).decision_source.decide(pin)
               for v in ("luna", "luna-k0", "luna-onehot", "luna-no-reflection")}
    full = decided["luna"]
    assert full is not None and len(full.retrieved_ids) == 3 and REFLECTION_ID in full.retrieved_ids
    assert REFLECTION_ID not in decided["luna-no-reflection"].retrieved_ids
    assert len(decided["luna-no-reflection"].retrieved_ids) == 2  # only the teacher items are left
    assert decided["luna-k0"].retrieved_ids == []
    onehot = decided["luna-onehot"]
    assert onehot.retrieved_ids == full.retrieved_ids  # same retrieval, same forward pass
    assert np.count_nonzero(onehot.probabilities) == 1 and onehot.probabilities.sum() == 1.0
    assert onehot.top_action == full.top_action and onehot.candidate_set == [full.top_action]
    for d in decided.values():
        T.validate_distribution(d.probabilities)
    # Masked actions stay impossible: the scenario's ego lane has no right neighbour.
    assert all(d.probabilities[T.ACTION_INDEX[c]] == 0.0 for d in decided.values() for c in ("AR", "CR", "DR"))
    assert make_stack_planner("diffusion-es", settings=cfg).decision_source is None


def test_the_settings_reach_every_variants_heuristic_system(artifacts) -> None:
    """What ``luna-bridge eval`` was asked for is what decides: the retrieval settings of every variant."""
    cfg = settings(artifacts, k=2, min_similarity=0.7, lesson_weight=0.25, gamma_p=0.2)
    for variant in STUDENT_PLANNERS:
        source = make_stack_planner(variant, settings=cfg).decision_source.heuristic
        config = getattr(source, "heuristic", source).config  # the one-hot variant wraps the system
        assert (config.min_similarity, config.lesson_weight, config.gamma_p) == (0.7, 0.25, 0.2), variant
        assert config.k == (0 if variant == "luna-k0" else 2), variant


def test_without_reflections_view_follows_the_bank(artifacts) -> None:
    _, bank_path = artifacts
    with MemoryBank.open(bank_path) as bank:
        view = WithoutReflections(bank)
        assert view.reflection_ids() == {REFLECTION_ID}
        assert len(bank) == 3 and REFLECTION_ID in view and view.get(REFLECTION_ID).source == "reflection"
        hits = view.retrieve(PromptManager().decision_query(samples.scene()), k=5)
        assert [item.source for item, _ in hits] == ["teacher", "teacher"]


def test_diffusion_es_settings_ignore_the_decision_maker() -> None:
    s = StackSettings(student="a", memory_bank="b", k=1, min_similarity=0.9, decision_every=7, population=16)
    assert s.for_planner("luna") == s
    assert "K = 1 at cosine >= 0.9" in s.describe() and "cosine" not in StackSettings().describe()
    assert s.for_planner("diffusion-es") == StackSettings(population=16)  # same runs whatever the student


def test_the_search_seed_reaches_the_search_of_every_search_planner() -> None:
    """--search-seed: the planners' Diffusion-ES draws from that seed (the oracle's and diffusion-es's too)."""
    from luna_bridge.stack_planner import search_planner

    settings = StackSettings(search_seed=3, population=8)
    assert search_planner(True, settings).config.search.seed == 3
    assert search_planner(False, settings.for_planner("diffusion-es")).config.search.seed == 3
    assert settings.for_planner("luna-oracle").search_seed == 3
    assert search_planner(True, StackSettings(population=8)).config.search.seed == 0
    assert "search seed 3" in settings.describe() and "seed" not in StackSettings().describe()
    with pytest.raises(StackConfigError, match="search_seed >= 0"):
        StackSettings(search_seed=-1)


def test_drop_blocked_lateral_reaches_the_planner_and_the_result_line() -> None:
    import argparse

    from luna_bridge.stack_planner import add_stack_arguments, search_planner, stack_settings_from_args

    parser = argparse.ArgumentParser()
    add_stack_arguments(parser.add_argument_group())
    dropped = stack_settings_from_args(parser.parse_args(["--drop-blocked-lateral", "--population", "8"]))
    assert not dropped.blocked_lateral_to_keep and stack_settings_from_args(parser.parse_args([])).blocked_lateral_to_keep
    assert search_planner(True, dropped).config.blocked_lateral_to_keep is False
    assert search_planner(True, StackSettings(population=8)).config.blocked_lateral_to_keep is True
    assert "lane changes the map does not allow dropped" in dropped.describe()
    assert "dropped" not in StackSettings().describe()
    assert dropped.for_planner("pdm").blocked_lateral_to_keep, "a planner without decisions keeps the default"


def test_settings_are_validated() -> None:
    with pytest.raises(StackConfigError, match="population >= 4"):
        StackSettings(population=2)
    with pytest.raises(StackConfigError, match="decision_every >= 1"):
        StackSettings(decision_every=0)


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    eval_command.register(sub)
    reflection_round.register(sub)
    return parser.parse_args(argv)


def test_eval_and_reflect_read_the_stack_options_alike() -> None:
    """One set of stack options for both commands: StackSettings' defaults, and the same settings from the
    same flags (reflect adds its device)."""
    defaults = stack_settings_from_args(_parsed(["eval", "--suite", "x"]))
    assert defaults == StackSettings()
    assert stack_settings_from_args(_parsed(["reflect", "--suite", "x", "--out", "o"]), device="cpu") == defaults
    flags = ["--student", "s", "--memory-bank", "b", "--k", "1", "--decision-every", "10", "--population", "64",
             "--iterations", "1", "--search-seed", "2", "--time-budget", "0.4", "--autocast", "bfloat16",
             "--lesson-weight", "0.5", "--min-similarity", "0.9"]
    from_eval = stack_settings_from_args(_parsed(["eval", "--suite", "x", *flags]))
    reflect_args = _parsed(["reflect", "--suite", "x", "--out", "o", *flags, "--device", "cuda"])
    assert from_eval == StackSettings(student="s", memory_bank="b", k=1, decision_every=10, population=64,
                                      iterations=1, search_seed=2, time_budget=0.4, autocast="bfloat16",
                                      lesson_weight=0.5, min_similarity=0.9)
    assert stack_settings_from_args(reflect_args, device=reflect_args.device) == replace(from_eval, device="cuda")
    with pytest.raises(StackConfigError, match="population >= 4"):
        stack_settings_from_args(_parsed(["eval", "--suite", "x", "--population", "2"]))
    with pytest.raises(StackConfigError, match="lesson_weight"):
        stack_settings_from_args(_parsed(["eval", "--suite", "x", "--lesson-weight", "1.5"]))
    with pytest.raises(StackConfigError, match="min_similarity"):
        stack_settings_from_args(_parsed(["eval", "--suite", "x", "--min-similarity", "-2"]))


@pytest.mark.slow  # three student forward passes and 13 closed-loop runs: ~25 s wall on the shared machine
def test_eval_runs_the_stack_variants_deterministically(artifacts, tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    save_scenario(scenario("a_lead_near", 20.0), suite / "a_lead_near.json")
    # k0 and onehot differ from luna only in the decision source (test_decision_variants); every
    # student forward pass costs seconds on this CPU, so the end-to-end run keeps two stack variants.
    planners = ["luna", "luna-no-reflection", "diffusion-es", "idm"]
    cfg = EvalConfig(str(suite), planners, modes=(False,), out_dir=tmp_path / "out", replan_every=5,
                     stack=settings(artifacts))
    summary = run_evaluation(cfg, progress=False)
    assert summary.failures == []
    assert [row["planner"] for row in summary.table] == ["log-replay", *planners]
    results = {p: json.loads((tmp_path / "out/scenarios" / p / "non_reactive/a_lead_near.json").read_text())
               for p in planners}
    for p in planners[:2]:
        d = results[p]["decisions"]
        assert d["count"] == 1 and d["scene_errors"] == 0, p  # t = 0 of the 2 s scenario (T_d = 2 s)
        # K = 3 items shown to the student; without reflection items the 3-item bank has two left
        assert d["examples_shown"] == {"luna": {"3": 1}, "luna-no-reflection": {"2": 1}}[p], p
        (entry,) = d["timeline"]  # each decision's three most probable actions, most probable first
        probs = [q for _, q in entry["top3"]]
        assert entry["stamp"] == 0.0 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.001
        assert entry["top3"][0][0] in d["top_actions"], p
        assert results[p]["stack"]["population"] == 8 and results[p]["planner_failures"] == 0
        cycles = results[p]["planner_cycles"]
        assert 0 <= cycles["picks_beside_argmax"] <= cycles["modes"].get("decision", 0), p
    assert results["luna"]["decisions"]["using_reflection_items"] == 1
    # the item is named, per decision and per item, and is a reflection item of the bank the run read
    (item_id,) = results["luna"]["decisions"]["reflection_items"]
    assert results["luna"]["decisions"]["reflection_items"][item_id] == 1
    first = results["luna"]["decisions"]["timeline"][0]
    assert first["reflection_items"] == [item_id] and 0.0 < first["reflection_similarity"][0] <= 1.0001
    assert "student_top3" in first and first["top3"][0][0] == "DK"  # the default lesson weight: w = 0.5 on DK
    with MemoryBank.open(settings(artifacts).memory_bank) as bank:
        assert bank.get(item_id).source == "reflection"
    assert results["luna-no-reflection"]["decisions"]["using_reflection_items"] == 0
    assert results["luna-no-reflection"]["decisions"]["reflection_items"] == {}
    assert "reflection_items" not in results["luna-no-reflection"]["decisions"]["timeline"][0]
    assert "decisions" not in results["diffusion-es"] and "stack" not in results["idm"]
    assert results["diffusion-es"]["planner_cycles"]["picks_beside_argmax"] == 0
    md = (tmp_path / "out/summary.md").read_text()
    assert "deterministic search (population 8 per action, 1 renoise-denoise round(s)" in md
    # Deterministic mode: a rerun in a fresh folder gives byte-identical result files.
    cfg2 = EvalConfig(str(suite), ["luna", "diffusion-es"], modes=(False,), out_dir=tmp_path / "again",
                      replan_every=5, stack=settings(artifacts))
    run_evaluation(cfg2, progress=False)
    for p in ("luna", "diffusion-es"):
        rel = Path("scenarios") / p / "non_reactive/a_lead_near.json"
        assert (tmp_path / "again" / rel).read_bytes() == (tmp_path / "out" / rel).read_bytes(), p
    # A file that predates a setting (no "autocast" key) was made with its default: resumed, not redone.
    path = tmp_path / "again/scenarios/diffusion-es/non_reactive/a_lead_near.json"
    older = json.loads(path.read_text())
    del older["stack"]["autocast"]
    path.write_text(json.dumps(older))
    assert run_evaluation(cfg2, progress=False).skipped == 3  # the expert row, luna, diffusion-es
    # Other stack settings are another experiment: the run is redone, not resumed.
    cfg3 = EvalConfig(str(suite), ["diffusion-es"], modes=(False,), out_dir=tmp_path / "out", replan_every=5,
                      stack=settings(artifacts, population=12))
    assert run_evaluation(cfg3, progress=False).skipped == 1  # the expert row only
    cfg4 = EvalConfig(str(suite), ["diffusion-es"], modes=(False,), out_dir=tmp_path / "out", replan_every=5,
                      stack=settings(artifacts, population=12, autocast="bfloat16"))
    assert run_evaluation(cfg4, progress=False).skipped == 1, "autocast is another experiment"
