"""luna_core.assets: the bundled default artifacts, compressed ones unpacked once into the cache."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from luna_core.assets import default_path, unpacked
from luna_core.memory.bank import MemoryBank, MemoryBankError


def test_a_folder_without_compressed_files_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    assert unpacked(tmp_path) == tmp_path


def test_compressed_files_are_unpacked_once_and_a_changed_bundle_gets_a_new_copy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LUNA_CACHE", str(tmp_path / "cache"))
    bundle = tmp_path / "bank"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"x": 1}')
    (bundle / "items.jsonl.xz").write_bytes(lzma.compress(b"line 1\nline 2\n"))
    first = unpacked(bundle)
    assert first != bundle and first.parent == tmp_path / "cache" / "bundled"
    assert (first / "items.jsonl").read_bytes() == b"line 1\nline 2\n"
    assert (first / "manifest.json").read_text() == '{"x": 1}' and not (first / "items.jsonl.xz").exists()
    (first / "items.jsonl").write_bytes(b"kept\n")  # a second call does not unpack again
    assert unpacked(bundle) == first and (first / "items.jsonl").read_bytes() == b"kept\n"
    (bundle / "items.jsonl.xz").write_bytes(lzma.compress(b"line 3\n"))
    second = unpacked(bundle)
    assert second != first and (second / "items.jsonl").read_bytes() == b"line 3\n"


def test_the_bundled_bank_is_the_students_training_bank(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LUNA_CACHE", str(tmp_path / "cache"))
    with MemoryBank.open(default_path("memory_bank")) as bank:
        assert len(bank) == 21_700 and bank.version == 21_700
        assert bank.manifest["embedder"]["name"].startswith("scene-vector") and bank.dim == 97, bank.manifest
        assert all(item.source == "teacher" for item in bank.items[:100])
    with pytest.raises(KeyError, match="unknown bundled artifact"):
        default_path("nothing")


def test_a_packed_bank_opens_for_reading_from_its_unpacked_copy_and_refuses_writing(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    monkeypatch.setenv("LUNA_CACHE", str(tmp_path / "cache"))
    shipped = Path(__file__).resolve().parents[3] / "models" / "memory_bank"  # as `--bank models/memory_bank`
    with MemoryBank.open(shipped) as bank:
        assert len(bank) == 21_700 and Path(bank.path).parent == tmp_path / "cache" / "bundled"
    with pytest.raises(MemoryBankError, match="packed bank"):
        MemoryBank.open(shipped, writable=True)
