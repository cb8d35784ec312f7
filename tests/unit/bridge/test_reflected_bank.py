"""benchmarks/reflected_bank.py: the ablation bank = the default bank + the kept reflection records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import REPO, load_benchmark


def _script():
    return load_benchmark("reflected_bank")


def test_the_kept_reflection_records_extend_the_default_bank(tmp_path: Path) -> None:
    bank = _script().build(_script().BASE_BANK, REPO / "benchmarks" / "data" /
                           "reflection_items_round_hard.jsonl", tmp_path / "bank")
    sources = [item.source for item in bank.items]
    assert sources.count("reflection") == 4 and len(sources) == 676 and bank.version == 676
    assert all(item.distribution is None for item in bank.items if item.source == "reflection")
    (best, similarity), = bank.retrieve(bank.items[-1].embedding, k=1)  # indexed: found by its own vector
    assert best.id == bank.items[-1].id and similarity == pytest.approx(1.0, abs=1e-5)


def test_records_that_do_not_continue_the_bank_are_refused(tmp_path: Path) -> None:
    items = REPO / "benchmarks" / "data" / "reflection_items_round_hard.jsonl"
    shuffled = tmp_path / "shuffled.jsonl"
    lines = items.read_bytes().splitlines(keepends=True)
    shuffled.write_bytes(lines[1] + lines[0])
    with pytest.raises(SystemExit, match="record #0 is not reflection item seq 673"):
        _script().build(_script().BASE_BANK, shuffled, tmp_path / "bank")
