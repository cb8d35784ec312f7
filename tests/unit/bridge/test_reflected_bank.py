"""benchmarks/reflected_bank.py: the ablation bank = the default bank + the kept reflection records."""

from __future__ import annotations

from pathlib import Path

import pytest

from luna_core.memory.bank import MemoryBank

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


def test_the_near_miss_ablation_leaves_out_exactly_the_items_written_for_near_misses(tmp_path: Path) -> None:
    """Session 30's round: 19 items, 9 written for near misses (no collision); the ablation bank keeps the
    other 10, re-sequenced after the bundled bank's 21,700 items."""
    data = REPO / "benchmarks" / "data" / "reflection_round_s30"
    script = _script()
    near = script.near_miss_items(data / "reflections.jsonl.xz")
    assert len(near) == 9
    bank = script.build(REPO / "models" / "memory_bank", data / "reflection_items.jsonl", tmp_path / "bank", near)
    reflections = [item for item in bank.items if item.source == "reflection"]
    assert len(reflections) == 10 and bank.version == 21710 and len(bank) == 21710
    assert not near & {item.id for item in reflections}
    assert bank.ivf_lists_kept  # the lists trained on the bundled items (docs/memory_bank.md)
    assert script.main(["--base", str(REPO / "models" / "memory_bank"), "--items", str(data / "reflection_items.jsonl"),
                        "--without", sorted(near)[0], "--out", str(tmp_path / "b1")]) == 0
    assert MemoryBank.open(tmp_path / "b1").version == 21718
    with pytest.raises(SystemExit, match="no record with id"):
        script.build(REPO / "models" / "memory_bank", data / "reflection_items.jsonl", tmp_path / "b2", {"refl-nope"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request": {}}\n')
    with pytest.raises(SystemExit, match="line 1 is not a reflection row"):
        script.near_miss_items(bad)
