"""Issue 6, Deliver 5: ``luna-bridge reflect`` end to end on a tiny set.

Real parts throughout: the (untrained) SmolLM2 student deciding every T_d with retrieval from a real
MiniLM memory bank, the decision-guided Diffusion-ES planner with the bundled prior, the simulator, the
progress monitor, the student's explanation, the in-process SmolLM2 reflection model, the durable
outbox and bank. The scripted scenario has a car running into the ego from behind, so the deployment
run has a collision whatever the stack decides.
"""

import json

import pytest
import torch

from luna_bridge import cli
from luna_bridge.scenarios.format import save_scenario
from luna_core.memory.bank import MemoryBank, stored_version
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.scenario_samples import rear_end_scenario


@pytest.mark.slow
def test_reflect_command_reflects_on_a_collision_into_a_copy_of_the_bank(tmp_path, capsys):
    torch.set_num_threads(1)
    bank_path, seed_ids = make_bank(tmp_path)
    source_journal = (bank_path / "items.jsonl").read_bytes()
    student = make_student_dir(tmp_path)
    suite = tmp_path / "suite"
    suite.mkdir()
    save_scenario(rear_end_scenario(), suite / "rear_end.json")
    out = tmp_path / "round"
    code = cli.main(["reflect", "--suite", str(suite), "--out", str(out), "--student", str(student),
                     "--memory-bank", str(bank_path), "--device", "cpu", "--k", "1", "--explanation-tokens", "16",
                     "--reflection-tokens", "48", "--planner-option", "population=16",
                     "--planner-option", "deterministic=true"])
    printed = capsys.readouterr().out
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    c = summary["counts"]
    assert c["scenarios_deployed"] == 1 and c["scenarios_evaluated"] == 1
    assert c["failures"] == len(summary["failures"]["rear_end"]) >= c["collisions"] >= 1
    assert any("rear" in f["colliding_ids"] for f in summary["failures"]["rear_end"])
    assert c["explanations"] == c["failures"] - c["unexplained_failures"] >= 1
    assert c["reflection_requests"] == c["explanations"]
    assert c["reflections"] + c["pending_in_outbox"] == c["reflection_requests"]
    assert c["pending_in_outbox"] == 0, "the in-process model is always reachable"
    assert c["normal_answers"] == 0, "'normal' is not accepted after a collision"
    assert c["new_memory_items"] + c["rejected_answers"] == c["reflections"]
    assert c["new_memory_items"] >= 1
    assert summary["bank_version_after"] == summary["bank_version_before"] + c["new_memory_items"]

    # The source bank is untouched; the round's copy holds the reflection items, valid and retrievable.
    assert (bank_path / "items.jsonl").read_bytes() == source_journal and stored_version(bank_path) == len(seed_ids)
    records = [json.loads(line) for line in (out / "reflections.jsonl").read_text().splitlines()]
    new_ids = [r["result"]["memory_item_id"] for r in records if r["result"] and r["result"]["memory_item_id"]]
    assert len(new_ids) == c["new_memory_items"]
    assert all(r["request"]["issued_decision"] and "rear" in r["request"]["colliding_ids"] or r["request"]["stall"]
               for r in records)
    with MemoryBank.open(out / "memory_bank") as bank:
        assert len(bank) == len(seed_ids) + len(new_ids)
        for item_id in new_ids:
            item = bank.get(item_id)
            assert item.source == "reflection" and item.distribution is None
            assert item.answer.startswith("Recommended decisions:")
            assert item_id in [i.id for i, _ in bank.retrieve(item.query, k=1)]
    # The evaluation ran with the updated bank: its decisions retrieved the reflection item (K = 1, and
    # the same scene at the same instant as the failure it came from).
    assert c["decisions_after_using_reflections"] >= 1
    for name in ("summary.md", "per_scenario.csv", "before_after.png"):
        assert (out / name).stat().st_size > 0
    assert "| before reflection | 1 |" in printed and "| new memory items |" in printed
    assert "deterministic mode" in printed
