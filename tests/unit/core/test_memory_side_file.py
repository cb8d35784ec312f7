"""Memory bank embeddings side file (issue 14.4): ``embeddings-<dim>.f32`` + header, read on open
instead of parsing every journal record, checked against the journal (length, CRC of its bytes), and
ignored with a warning (the journal read instead, the writer rebuilding it) when it does not match.
Items read from it are parsed lazily; every open must give what a journal-only open gives."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import faiss
import numpy as np
import pytest

from luna_core.memory import BankIntegrityError, JournalWarning, MemoryBank, MemoryBankError, SceneVectorEmbedder
from luna_core.memory import bank as bank_module
from luna_core.memory.bank import JOURNAL
from luna_core.memory.journal import encode_record, scan, scan_tail
from luna_core.types import MemoryItem

DIM = 8
N = 300
faiss.omp_set_num_threads(1)
DATA = f"embeddings-{DIM}.f32"
HEADER = f"embeddings-{DIM}.json"


def _item(i: int, v: np.ndarray) -> MemoryItem:
    p = np.full(10, 0.05)
    p[i % 10] = 0.55
    return MemoryItem(id=f"item-{i}", query=f"[Traffic state] scene {i}", answer=f"rationale {i}",
                      distribution=p if i % 7 else None, source="teacher" if i % 7 else "reflection",
                      scene_vector=np.asarray(v, np.float32))


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)


def _bank(path: Path, n: int = N) -> np.ndarray:
    """A bank of n items with a side file covering them all; returns the item vectors."""
    vectors = _vectors(n)
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, v) for i, v in enumerate(vectors)])
        bank.save_index()
    assert (path / DATA).stat().st_size == n * DIM * 4
    return vectors


def _journal_only(path: Path, tmp: Path) -> MemoryBank:
    """The same bank opened from its journal alone (a copy without the side file)."""
    copy = tmp / f"journal-only-{len(list(tmp.iterdir()))}"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("embeddings-*", "index-*"))
    return MemoryBank.open(copy)


def _same(a: MemoryBank, b: MemoryBank, queries: np.ndarray) -> None:
    assert (a.version, len(a)) == (b.version, len(b))
    for q in queries:
        got = [(it.id, round(s, 6)) for it, s in a.retrieve(q, k=3, exclude_ids={"item-3"})]
        assert got == [(it.id, round(s, 6)) for it, s in b.retrieve(q, k=3, exclude_ids={"item-3"})]
    for x, y in zip(a.items, b.items, strict=True):
        assert (x.id, x.query, x.answer, x.source, x.created) == (y.id, y.query, y.answer, y.source, y.created)
        assert np.array_equal(x.embedding, y.embedding)
        assert (x.distribution is None) == (y.distribution is None)
        assert x.distribution is None or np.array_equal(x.distribution, y.distribution)
        assert np.array_equal(x.scene_vector, y.scene_vector)


def _messages(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, JournalWarning)]


def test_valid_side_file_is_used_items_parsed_lazily_and_results_identical(tmp_path) -> None:
    path = tmp_path / "bank"
    vectors = _bank(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid side file is used silently
        bank = MemoryBank.open(path)
    assert bank._side_rows == N and bank._items.count(None) == N  # nothing parsed by the open
    hits = bank.retrieve(vectors[42], k=3)
    assert hits[0][0].id == "item-42" and bank._items.count(None) == N - 3  # only the hits were parsed
    assert bank.get("item-7").answer == "rationale 7" and "item-299" in bank and "item-300" not in bank
    _same(bank, _journal_only(path, tmp_path), _vectors(20, seed=5))
    assert bank._items.count(None) == 0  # .items parsed the rest


def test_records_appended_after_the_side_file_are_read_from_the_journal(tmp_path, monkeypatch) -> None:
    path = tmp_path / "bank"
    _bank(path)
    more = _vectors(50, seed=9)
    monkeypatch.setattr(bank_module, "SIDE_FILE_MIN_ITEMS", 40)
    writer = MemoryBank.open(path, writable=True)
    writer.append_many([_item(N + i, v) for i, v in enumerate(more)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader = MemoryBank.open(path)  # side file (300) + the journal's tail (50)
    assert reader._side_rows == N and len(reader) == N + 50 and reader.version == N + 50
    assert reader.retrieve(more[10], k=1)[0][0].id == f"item-{N + 10}"
    _same(reader, _journal_only(path, tmp_path), _vectors(20, seed=6))
    # The writer rewrites the side file on close once SIDE_FILE_MIN_ITEMS (here 40) were appended.
    writer.close()
    assert (path / DATA).stat().st_size == (N + 50) * DIM * 4
    assert MemoryBank.open(path)._side_rows == N + 50


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, expected", [
    ("flipped byte in the vectors", "fails its CRC check"),
    ("flipped byte in the header", "is damaged (checksum mismatch)"),
    ("truncated vectors", f"holds {N * DIM * 4 - 100} bytes, its header says {N} rows"),
    ("truncated header", "is damaged"),
    ("journal replaced by another bank's", "are not those it was built from"),
    ("journal behind the side file", f"which holds"),
])
def test_stale_or_damaged_side_file_is_ignored_with_a_warning_and_rebuilt(tmp_path, monkeypatch, damage,
                                                                        expected) -> None:
    monkeypatch.setattr(bank_module, "SIDE_FILE_MIN_ITEMS", 100)  # the writer rebuilds from 100 items on
    path = tmp_path / "bank"
    _bank(path)
    if damage == "flipped byte in the vectors":
        _flip(path / DATA, 1234)
    elif damage == "flipped byte in the header":
        _flip(path / HEADER, 200)
    elif damage == "truncated vectors":
        os.truncate(path / DATA, N * DIM * 4 - 100)
    elif damage == "truncated header":
        os.truncate(path / HEADER, (path / HEADER).stat().st_size // 2)
    elif damage == "journal replaced by another bank's":  # valid records, same ids and length
        size = (path / JOURNAL).stat().st_size
        records = scan(path / JOURNAL).records
        records[5]["answer"] = "rationale Z"  # as long as "rationale 5"
        records[6]["embedding"] = records[7]["embedding"]
        (path / JOURNAL).write_bytes(b"".join(encode_record(r) for r in records))
        assert (path / JOURNAL).stat().st_size == size
    elif damage == "journal behind the side file":  # an older copy of the journal put back
        lines = (path / JOURNAL).read_bytes().splitlines(keepends=True)
        (path / JOURNAL).write_bytes(b"".join(lines[:200]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        reader = MemoryBank.open(path)
    messages = _messages(record)
    assert any("embeddings side file ignored" in m and expected in m for m in messages), messages
    assert reader._side_rows == 0 and None not in reader._items  # everything came from the journal
    _same(reader, _journal_only(path, tmp_path), _vectors(20, seed=7))
    if damage == "journal behind the side file":
        assert any("acknowledged records are missing" in m for m in messages)  # VERSION still says 300
        os.remove(path / "VERSION")  # accept the loss, as the writer's refusal tells one to
    # The writer rebuilds it on open; the next open uses it silently and agrees with the journal.
    MemoryBank.open(path, writable=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = MemoryBank.open(path)
    assert rebuilt._side_rows == len(rebuilt) and rebuilt._items.count(None) == len(rebuilt)
    _same(rebuilt, _journal_only(path, tmp_path), _vectors(20, seed=8))


def test_damage_inside_the_covered_journal_is_still_reported(tmp_path) -> None:
    path = tmp_path / "bank"
    vectors = _vectors(N)
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, v) for i, v in enumerate(vectors)])
    lines = (path / JOURNAL).read_bytes().splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:10])
    lines[10] = lines[10].replace(b"rationale 10", b"rationale X")
    (path / JOURNAL).write_bytes(b"".join(lines))
    with pytest.warns(JournalWarning, match=f"corrupt record at byte {offset} skipped"):
        MemoryBank.open(path).save_index()  # the side file is built from the damaged journal
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        bank = MemoryBank.open(path)
    assert bank._side_rows == N - 1 and "item-10" not in bank
    assert [m for m in _messages(record)] == [m for m in _messages(record) if "side file" not in m]
    assert any(f"corrupt record at byte {offset} skipped (record #11" in m for m in _messages(record))


def test_writer_still_refuses_a_damaged_final_record_and_leaves_the_side_file(tmp_path) -> None:
    path = tmp_path / "bank"
    _bank(path)
    data = path.joinpath(JOURNAL).read_bytes()
    damaged = data[:-40] + data[-40:].replace(b'"', b"'", 1)
    (path / JOURNAL).write_bytes(damaged)
    side = ((path / DATA).read_bytes(), (path / HEADER).read_bytes())
    with pytest.raises(BankIntegrityError, match=f"record #{N} at byte"):
        MemoryBank.open(path, writable=True)
    assert (path / JOURNAL).read_bytes() == damaged
    assert ((path / DATA).read_bytes(), (path / HEADER).read_bytes()) == side


@pytest.mark.parametrize("tail", [b"", b"0000002a 00000000 {\"par", b"\x00" * 30, b"garbage line\n",
                                  b"00000005 00000000 {}{}{}{}\n", b"no header and long enough"])
def test_scan_tail_agrees_with_scan_on_the_end_of_the_journal(tmp_path, tail) -> None:
    path = tmp_path / "bank"
    _bank(path, 5)
    lines = (path / JOURNAL).read_bytes().splitlines(keepends=True)
    lines[2] = b"bad inside\n"  # a corrupt record inside the file does not change the end
    (path / JOURNAL).write_bytes(b"".join(lines) + tail)
    full, end = scan(path / JOURNAL), scan_tail(path / JOURNAL)
    assert (end.end, end.torn_tail, end.next_number) == (full.end, full.torn_tail, full.next_number)
    assert end.corrupt_tail == full.corrupt_tail
    assert full.crc == __import__("zlib").crc32((path / JOURNAL).read_bytes()[:full.end])


# --- The default index: IVF-Flat above IVF_MIN_ITEMS, exact below ----------------------------------


def _clustered(n: int, seed: int) -> np.ndarray:
    """Vectors around 12 centres, as real scene vectors cluster (IVF's recall depends on it)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(100).normal(size=(12, DIM))
    return (centres[rng.integers(0, 12, n)] + rng.normal(0, 0.15, (n, DIM))).astype(np.float32)


@pytest.fixture
def ivf_from_1000(monkeypatch) -> None:
    """IVF from 1000 items (the side file from 100), so that small banks use it."""
    monkeypatch.setattr(bank_module, "IVF_MIN_ITEMS", 1000)
    monkeypatch.setattr(bank_module, "SIDE_FILE_MIN_ITEMS", 100)


def _clustered_bank(path: Path, n: int) -> tuple[np.ndarray, str]:
    """A bank of the first ``n`` of 1200 clustered vectors; the vectors and the index it was created with."""
    vectors = _clustered(1200, seed=0)
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as writer:
        writer.append_many([_item(i, v) for i, v in enumerate(vectors[:n])])
        return vectors, writer.index_description


def test_ivf_index_trains_above_the_threshold_and_agrees_with_exact_search(tmp_path, ivf_from_1000) -> None:
    path = tmp_path / "bank"
    vectors, created = _clustered_bank(path, 900)
    assert created == "flat (exact) (an ivf bank below 1000 items at open)"
    small = MemoryBank.open(path)
    assert isinstance(small._index, faiss.IndexFlatIP)  # 900 < 1000: exact
    with MemoryBank.open(path, writable=True) as writer:
        writer.append_many([_item(i, v) for i, v in enumerate(vectors[900:1100], start=900)])
    ivf = MemoryBank.open(path)  # 1100 items, from the side file the writer wrote on close
    flat = MemoryBank.open(path, index="flat")
    assert ivf._side_rows == 1100 and isinstance(ivf._index, faiss.IndexIVFFlat)
    assert ivf.index_description == "IVF-Flat, 64 lists, nprobe 32"  # 2^round(log2(1.6 sqrt(1100)))
    queries = _clustered(200, seed=1)
    hits = 0
    for q in queries:
        exact = flat.retrieve(q, k=3)
        got = ivf.retrieve(q, k=3)
        assert len(got) == 3 and all(s <= exact[0][1] + 1e-6 for _, s in got)  # scores are exact
        hits += sum(s >= exact[-1][1] - 1e-6 for _, s in got)
    assert hits / (3 * len(queries)) >= 0.99
    # Items appended later go into the trained lists; the side file round-trips through the IVF index.
    with MemoryBank.open(path, writable=True) as writer:
        writer.append_many([_item(i, v) for i, v in enumerate(vectors[1100:], start=1100)])
    assert ivf.refresh() and len(ivf) == 1200 and ivf.retrieve(vectors[1150], k=1)[0][0].id == "item-1150"
    ivf.save_index()
    reread = MemoryBank.open(path)
    assert reread._side_rows == 1200
    assert np.array_equal(np.fromfile(path / DATA, "<f4").reshape(1200, DIM)[1150], reread.get("item-1150").embedding)


def test_ivf_lists_are_kept_while_the_bank_grows_so_new_items_move_only_the_results_they_enter(
        tmp_path, ivf_from_1000) -> None:
    path = tmp_path / "bank"
    vectors, _ = _clustered_bank(path, 1100)
    MemoryBank.open(path)  # a reader trains its own lists and writes nothing
    assert not (path / "index-ivf-64.faiss").exists()
    with MemoryBank.open(path, writable=True) as writer:  # a writer keeps the lists it trained
        before = MemoryBank.open(path, ivf_nprobe=1)  # one list per query: results hang on the lists
        writer.append_many([_item(i, v) for i, v in enumerate(vectors[1100:], start=1100)])
    meta = json.loads((path / "index-ivf-64.json").read_text())
    assert meta["count"] == 1100 and meta["nlist"] == 64 and meta["last_id"] == "item-1099"
    grown = MemoryBank.open(path, ivf_nprobe=1)
    assert len(grown) == 1200 and grown.ivf_lists_kept
    assert grown.index_description == "IVF-Flat, 64 lists, nprobe 1"
    saved = faiss.read_index(str(path / "index-ivf-64.faiss"))
    assert saved.ntotal == 0 and np.array_equal(grown._index.quantizer.reconstruct_n(0, 64),
                                                saved.quantizer.reconstruct_n(0, 64))  # the lists reused
    copy = tmp_path / "retrained"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("index-ivf-*"))
    retrained = MemoryBank.open(copy, ivf_nprobe=1)  # lists trained on all 1200 items
    assert not retrained.ivf_lists_kept and before.ivf_lists_kept  # before: the writer's lists, saved at its open
    new_ids = {f"item-{i}" for i in range(1100, 1200)}
    entered = moved_by_retraining = 0
    for q in _clustered(300, seed=2):
        got = [item.id for item, _ in grown.retrieve(q, k=3)]
        old = [item.id for item, _ in before.retrieve(q, k=3)]
        if new_ids & set(got):
            entered += 1
        else:
            assert got == old  # untouched by the growth
        moved_by_retraining += not new_ids & set(r.id for r, _ in retrained.retrieve(q, k=3)) and [
            r.id for r, _ in retrained.retrieve(q, k=3)] != old
    assert 0 < entered < 300
    assert moved_by_retraining > 0  # what keeping the lists prevents
    # Lists that do not belong to these items are trained again: another journal prefix, another count
    (path / "index-ivf-64.json").write_text(json.dumps(dict(meta, journal_crc=meta["journal_crc"] ^ 1)))
    assert MemoryBank.open(path)._cached_ivf(64) is None
    (path / "index-ivf-64.json").write_text(json.dumps(meta))
    assert MemoryBank.open(path)._cached_ivf(64) is not None and MemoryBank.open(path)._cached_ivf(128) is None
    (path / "index-ivf-64.faiss").write_bytes(b"garbage")
    damaged = MemoryBank.open(path)
    assert isinstance(damaged._index, faiss.IndexIVFFlat) and damaged.retrieve(vectors[1150], k=1)[0][0].id == "item-1150"


def test_a_lazy_item_whose_record_changed_under_the_open_bank_is_an_error_naming_it(tmp_path) -> None:
    path = tmp_path / "bank"
    _bank(path, 20)
    bank = MemoryBank.open(path)
    assert bank._items.count(None) == 20
    lines = (path / JOURNAL).read_bytes().splitlines(keepends=True)
    with open(path / JOURNAL, "r+b") as f:  # rewritten in place (same file): records 0 and 1 swapped
        f.write(lines[1] + lines[0] + b"".join(lines[2:]))
    offset = 0
    with pytest.raises(MemoryBankError, match=f"the record of item 'item-0' at byte {offset} no longer reads "
                                              r"back \(it holds item 'item-1'.*open it again"):
        bank.get("item-0")


def test_bank_growth_retrieval_counts_the_probes_a_grown_bank_moves(tmp_path, ivf_from_1000, capsys) -> None:
    """benchmarks/bank_growth_retrieval.py: a copy grown with lists kept moves no probe it does not enter."""
    from tests.benchmark_scripts import load_benchmark

    vectors, _ = _clustered_bank(tmp_path / "base", 1100)
    shutil.copytree(tmp_path / "base", tmp_path / "kept")
    with MemoryBank.open(tmp_path / "kept", writable=True) as writer:
        writer.append_many([_item(i, v) for i, v in enumerate(vectors[1100:], start=1100)])
    assert load_benchmark("bank_growth_retrieval").main(
        ["--base", str(tmp_path / "base"), "--grown", f"kept={tmp_path / 'kept'}", "--probes", "200"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| kept |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1200" and cells[3] == "yes" and int(cells[4]) > 0 and cells[5] == "0"
