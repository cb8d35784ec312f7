"""Issues 6 and 16: ``luna-bridge reflect`` end to end on a tiny set, resumable, on worker processes.

Real parts throughout: the (untrained) SmolLM2 student deciding every T_d with retrieval from a real
MiniLM memory bank, the decision-guided Diffusion-ES planner with the bundled prior, the simulator, the
progress monitor, the student's explanation, the hindsight check on the run's log, the durable outbox,
the bank copy and ``luna-bridge eval``'s evaluation. The scripted scenario has a car running into the
ego from behind, so every deployment run has a collision whatever the stack decides (one nuPlan does not
count at fault: ACTIVE_REAR).
"""

import json

import pytest
import torch

from luna_bridge import cli
from luna_bridge.scenarios.format import save_scenario
from luna_core.memory.bank import MemoryBank, stored_version
from luna_core.reflection import audit_reflections
from tests.heuristic_fixtures import make_bank, make_student_dir
from tests.scenario_samples import rear_end_scenario


@pytest.mark.slow
def test_reflect_command_rounds_reflect_in_hindsight_into_copies_and_evaluate_each_bank(tmp_path, capsys):
    torch.set_num_threads(1)
    bank_path, seed_ids = make_bank(tmp_path)
    source_journal = (bank_path / "items.jsonl").read_bytes()
    student = make_student_dir(tmp_path)
    suite = tmp_path / "suite"
    suite.mkdir()
    save_scenario(rear_end_scenario(), suite / "rear_end.json")
    out = tmp_path / "rounds"
    argv = ["reflect", "--suite", str(suite), "--rounds", "1", "--out", str(out), "--student", str(student),
            "--memory-bank", str(bank_path), "--k", "1", "--explanation-tokens", "8", "--population", "8",
            "--iterations", "0", "--decision-every", "5", "--eval-suite", str(suite), "--mode", "non-reactive"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    rounds = json.loads((out / "rounds.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[0]["bank"] == str(bank_path) and rounds[0]["reflection_items"] == 0
    c = rounds[1]["counts"]
    assert c["scenarios"] == 1 and c["failures"] >= c["collisions"] >= 1
    assert c["explanations"] == c["failures"] - c["unexplained"] >= 1 and c["explanation_latency_max_s"] > 0
    assert c["requests"] == c["explanations"] and c["no_hindsight_observation"] == 0
    assert c["pending"] == 0 and c["rejected"] == 0 and c["normal"] == 0  # no 'normal' after a collision
    assert c["written"] + c["no_grounded_revision"] == c["requests"]
    failures = json.loads((out / "round_1" / "failures.json").read_text())["rear_end"]
    assert any(f["collision_kinds"].get("rear") == "ACTIVE_REAR" for f in failures)
    records = [json.loads(line) for line in (out / "round_1" / "reflections.jsonl").read_text().splitlines()]
    assert all(r["result"]["hindsight"] for r in records)  # each verdict is reported

    # The source bank is untouched; the round's copy holds exactly the written items, none unsafe.
    assert (bank_path / "items.jsonl").read_bytes() == source_journal and stored_version(bank_path) == len(seed_ids)
    with MemoryBank.open(out / "round_1" / "memory_bank") as bank:
        assert len(bank) == len(seed_ids) + c["written"] == rounds[1]["bank_items"]
        assert audit_reflections(bank, out / "round_1" / "outbox") == (c["written"], [])
    # Both banks were evaluated with luna-bridge eval's runs.
    for r in (0, 1):
        assert (out / f"round_{r}" / "eval" / "suite" / "per_scenario.csv").exists()
        assert rounds[r]["evaluation"]["suite"]["scenarios"] == 1 and rounds[r]["evaluation"]["suite"]["NR-CLS"] >= 0
    assert "| round | bank items (reflection / repeats) |" in printed and "| 1 | " in printed
    assert rounds[0]["reflection_repeats"] == 0 and rounds[1]["reflection_repeats"] == 0  # one failure, one item

    # A rerun resumes (the round is read back, the evaluation runs are on disk). An interrupted round keeps
    # its deployment runs (not driven again) and redoes the reflection into a fresh copy: the same items.
    assert cli.main(argv) == 0
    assert json.loads((out / "rounds.json").read_text())["rounds"][1]["counts"] == c
    run_file = out / "round_1" / "deploy" / "rear_end.json"
    stamp = run_file.stat().st_mtime_ns
    (out / "round_1" / "round.json").unlink()
    assert cli.main(argv) == 0
    assert run_file.stat().st_mtime_ns == stamp
    assert json.loads((out / "rounds.json").read_text())["rounds"][1]["counts"] == c
    with MemoryBank.open(out / "round_1" / "memory_bank") as bank:
        assert len(bank) == len(seed_ids) + c["written"]

    # Deployment on worker processes gives the same run (deployment and reflection only, no evaluation).
    pooled = tmp_path / "pooled"
    argv_pool = [a for a in argv[:argv.index("--eval-suite")]] + ["--mode", "non-reactive", "--workers", "2"]
    argv_pool[argv_pool.index("--out") + 1] = str(pooled)
    assert cli.main(argv_pool) == 0
    serial, parallel = (json.loads(f.read_text()) for f in (run_file, pooled / "round_1" / "deploy" / "rear_end.json"))
    for key in ("score", "failures", "decisions", "reflection_retrievals", "hindsight_errors", "unexplained"):
        assert parallel[key] == serial[key], key
    assert [e["text"] for e in parallel["explanations"]] == [e["text"] for e in serial["explanations"]]
    assert [q["observation"] for q in parallel["requests"]] == [q["observation"] for q in serial["requests"]]
