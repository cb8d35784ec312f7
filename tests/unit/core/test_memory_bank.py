"""Memory bank (luna_core.memory): append / reopen / retrieve, versions, readers following the writer,
embedder refusal, item validation, and journal recovery. Uses the scene-vector embedder (no model);
MiniLM is covered in test_memory_minilm.py and crash safety in test_memory_crash.py."""

from __future__ import annotations

import json
import os
import re
import warnings

import faiss
import numpy as np
import pytest

from luna_core.memory import (BankIntegrityError, BankLockedError, EmbedderMismatchError, InvalidItemError,
                              JournalCorruptionError, JournalWarning, MemoryBank, MemoryBankError,
                              MiniLMEmbedder, ReadOnlyBankError, SceneVectorEmbedder, stored_version)
from luna_core.memory.bank import JOURNAL
from luna_core.memory.journal import Journal, scan
from luna_core.types import MemoryItem

DIM = 8
faiss.omp_set_num_threads(1)  # polite on the shared cores; OpenMP only slows these small indexes


def _pi(top: int) -> np.ndarray:
    p = np.full(10, 0.05)
    p[top] = 0.55
    return p


def _item(i: int, vector, source: str = "teacher", item_id: str | None = None) -> MemoryItem:
    return MemoryItem(id=f"item-{i}" if item_id is None else item_id, query=f"[Traffic state] scene {i}",
                      answer=f"rationale {i}", distribution=_pi(i % 10) if source == "teacher" else None,
                      source=source, scene_vector=np.asarray(vector, dtype=np.float32))


def _basis(j: int, noise: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[j] = 1.0
    if noise:
        v += rng.normal(0, noise, DIM).astype(np.float32)
    return v


def test_append_reopen_retrieve(tmp_path) -> None:
    path = tmp_path / "bank"
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        assert bank.version == 0 and len(bank) == 0 and bank.retrieve(_basis(0)) == []
        stored = bank.append(_item(0, _basis(0)))
        assert stored.id == "item-0" and stored.created > 0
        assert np.linalg.norm(stored.embedding) == pytest.approx(1.0)
        bank.append_many([_item(i, _basis(i)) for i in range(1, 6)])
        bank.append(MemoryItem(id="", query="[Traffic state] blocked lane", answer="Change lanes left.",
                               source="reflection", scene_vector=_basis(2) + 0.5 * _basis(3)))
        assert bank.version == 7 and len(bank) == 7
    with MemoryBank.open(path) as bank:  # embedder taken from the manifest
        assert isinstance(bank.embedder, SceneVectorEmbedder)
        assert bank.version == 7 and len(bank) == 7
        reflection = [it for it in bank if it.source == "reflection"][0]
        assert reflection.distribution is None and len(reflection.id) == 32  # generated uuid
        np.testing.assert_allclose(bank.get("item-3").distribution, _pi(3))
        np.testing.assert_array_equal(bank.get("item-3").scene_vector, _basis(3))
        hits = bank.retrieve(_basis(2) + 0.1 * _basis(3), k=3)
        assert [it.id for it, _ in hits[:2]] == ["item-2", reflection.id]
        assert hits[0][1] == pytest.approx(1 / np.sqrt(1.01), abs=1e-5)  # cosine similarity
        assert all(a[1] >= b[1] for a, b in zip(hits, hits[1:]))
        excluded = bank.retrieve(_basis(2), k=2, exclude_ids={"item-2", "unknown-id"})
        assert len(excluded) == 2 and excluded[0][0].id == reflection.id
        assert excluded[1][0].id != "item-2" and excluded[1][1] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ReadOnlyBankError):
        MemoryBank.open(path).append(_item(9, _basis(1)))


def test_hnsw_and_flat_agree_on_a_few_hundred_items(tmp_path) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(400, DIM)).astype(np.float32)
    with MemoryBank.create(tmp_path / "b", SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, v) for i, v in enumerate(vectors)])
    flat = MemoryBank.open(tmp_path / "b", index="flat")
    hnsw = MemoryBank.open(tmp_path / "b", index="hnsw")
    agree = 0
    for q in rng.normal(size=(50, DIM)):
        exact = [it.id for it, _ in flat.retrieve(q, k=3)]
        approx = [it.id for it, _ in hnsw.retrieve(q, k=3)]
        agree += len(set(exact) & set(approx))
        best = q / np.linalg.norm(q) @ (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).T
        assert exact[0] == f"item-{int(np.argmax(best))}"
    assert agree >= 0.95 * 150


def test_versions_and_a_reader_following_the_writer(tmp_path) -> None:
    path = tmp_path / "bank"
    writer = MemoryBank.create(path, SceneVectorEmbedder(DIM))
    reader = MemoryBank.open(path, SceneVectorEmbedder(DIM), index="hnsw")
    assert stored_version(path) == 0 and not reader.refresh()
    writer.append(_item(0, _basis(0)))
    writer.append_many([_item(1, _basis(1)), _item(2, _basis(2))])
    assert stored_version(path) == writer.version == 3
    assert reader.version == 0 and reader.retrieve(_basis(1)) == []
    assert reader.refresh() and reader.version == 3
    assert reader.retrieve(_basis(1), k=1)[0][0].id == "item-1"
    assert not reader.refresh()
    stale = MemoryBank.open(path)
    with pytest.raises(BankLockedError, match="already open for writing"):
        MemoryBank.open(path, writable=True)
    writer.close()
    os.remove(path / "VERSION")
    assert stored_version(path) == 3  # falls back to the journal
    with MemoryBank.open(path, writable=True) as again:  # the lock was released
        assert again.version == 3
    assert stored_version(path) == 3
    (path / JOURNAL).write_bytes(b"")  # the bank replaced under a reader
    with pytest.raises(MemoryBankError, match="shrank"):
        stale.refresh()


def test_embedder_mismatch_is_refused_with_both_names(tmp_path) -> None:
    path = tmp_path / "bank"
    MemoryBank.create(path, SceneVectorEmbedder(DIM)).close()
    with pytest.raises(EmbedderMismatchError, match=r"scene-vector.*\(8-d\).*all-MiniLM-L6-v2.*\(384-d\)"):
        MemoryBank.open(path, MiniLMEmbedder())  # refused before any model is loaded
    with pytest.raises(EmbedderMismatchError, match=r"\(9-d\)"):
        MemoryBank.open(path, SceneVectorEmbedder(DIM + 1))
    with pytest.raises(EmbedderMismatchError):
        MemoryBank.create(path, SceneVectorEmbedder(DIM, layout="other-layout"), exist_ok=True)
    with pytest.raises(MemoryBankError, match="already exists"):
        MemoryBank.create(path, SceneVectorEmbedder(DIM))
    with pytest.raises(MemoryBankError, match="missing manifest.json"):
        MemoryBank.open(tmp_path / "nothing")


def test_invalid_items_are_refused_and_leave_the_bank_unchanged(tmp_path) -> None:
    with MemoryBank.create(tmp_path / "bank", SceneVectorEmbedder(DIM)) as bank:
        bank.append(_item(0, _basis(0)))
        bad = [
            (MemoryItem("a", "[Traffic state] x", "why", distribution=None, source="teacher",
                        scene_vector=_basis(1)), "need the distribution"),
            (MemoryItem("b", "[Traffic state] x", "why", distribution=_pi(0), source="reflection",
                        scene_vector=_basis(1)), "carry no distribution"),
            (MemoryItem("c", "[Traffic state] x", "why", distribution=np.full(10, 0.2),
                        scene_vector=_basis(1)), "sums to 2"),
            (MemoryItem("d", "  ", "why", distribution=_pi(0), scene_vector=_basis(1)), "empty query"),
            (MemoryItem("e", "q", "why", distribution=_pi(0), source="oracle", scene_vector=_basis(1)),
             "source 'oracle'"),
            (MemoryItem("f", "q", "why", distribution=_pi(0)), "no scene_vector"),
            (MemoryItem("g", "q", "why", distribution=_pi(0), scene_vector=np.ones(3)), "expected 8"),
            (MemoryItem("h", "q", "why", distribution=_pi(0), scene_vector=np.zeros(DIM)), "zero vector"),
            (MemoryItem("i", "q", "why", distribution=_pi(0), scene_vector=_basis(0),
                        embedding=np.ones(5)), "embedding has 5 values"),
            (_item(0, _basis(3)), "already in the bank"),
        ]
        for item, message in bad:
            with pytest.raises(InvalidItemError, match=message):
                bank.append(item)
        with pytest.raises(InvalidItemError, match="#1 of the batch"):  # the whole batch is refused
            bank.append_many([_item(5, _basis(5)), _item(5, _basis(6))])
        assert bank.version == 1 and len(bank) == 1
    with MemoryBank.open(tmp_path / "bank") as bank:
        assert [it.id for it in bank] == ["item-0"]


def _journal_lines(path) -> list[bytes]:
    return (path / JOURNAL).read_bytes().splitlines(keepends=True)


def test_torn_final_record_is_dropped_with_a_warning(tmp_path) -> None:
    path = tmp_path / "bank"
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, _basis(i)) for i in range(3)])
    intact = (path / JOURNAL).read_bytes()
    last = _journal_lines(path)[-1]
    with open(path / JOURNAL, "ab") as f:  # a crash halfway through the write of a fourth record
        f.write(last[: len(last) // 2].replace(b"item-2", b"item-3"))
    reader = MemoryBank.open(path)  # a reader never repairs: it may be an append in progress
    assert len(reader) == 3
    assert len((path / JOURNAL).read_bytes()) > len(intact)
    with pytest.warns(JournalWarning, match=r"dropped a torn final record of \d+ bytes"):
        bank = MemoryBank.open(path, writable=True)
    assert (path / JOURNAL).read_bytes() == intact
    bank.append(_item(3, _basis(3)))
    bank.close()
    with MemoryBank.open(path) as again:
        assert [it.id for it in again] == ["item-0", "item-1", "item-2", "item-3"]
        assert again.version == 4


def test_corrupt_record_inside_the_journal_is_skipped_and_the_rest_kept(tmp_path) -> None:
    path = tmp_path / "bank"
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, _basis(i)) for i in range(4)])
    lines = _journal_lines(path)
    offset = len(lines[0])
    damaged = lines[1].replace(b"rationale 1", b"rationale X")  # checksum no longer matches
    (path / JOURNAL).write_bytes(b"".join([lines[0], damaged, *lines[2:]]))
    with pytest.warns(JournalWarning, match=f"corrupt record at byte {offset} skipped"):
        bank = MemoryBank.open(path, writable=True)
    assert [it.id for it in bank] == ["item-0", "item-2", "item-3"]
    assert bank.version == 4  # versions never go back
    bank.append(_item(4, _basis(4)))
    assert bank.version == 5
    bank.close()
    # A record with a valid frame but unusable content (wrong embedding size) is skipped too.
    record = json.loads(_journal_lines(path)[0][18:])
    record.update(id="odd", seq=6, embedding="AAAAAA==")
    from luna_core.memory.journal import encode_record

    with open(path / JOURNAL, "ab") as f:
        f.write(encode_record(record))
    with pytest.warns(JournalWarning) as caught:
        reopened = MemoryBank.open(path)
    messages = [str(w.message) for w in caught]
    assert any("unusable record" in m and "embedding has 1 values" in m for m in messages)
    assert any(f"corrupt record at byte {offset}" in m for m in messages)  # still reported to readers
    assert "odd" not in reopened and len(reopened) == 4
    assert reopened.version == 6  # the unusable record's version stays taken: it is never reused


def test_journal_holds_json_lines_with_float32_arrays(tmp_path) -> None:
    path = tmp_path / "bank"
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append(_item(0, _basis(0) * 3.0))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["embedder"] == {"name": "scene-vector:luna_core.scene.scene_vector", "dim": DIM}
    line = _journal_lines(path)[0]
    record = json.loads(line[18:])
    import base64

    assert np.frombuffer(base64.b64decode(record["embedding"]), "<f4").tolist() == _basis(0).tolist()
    assert record["seq"] == 1 and record["source"] == "teacher" and len(record["distribution"]) == 10


def test_saved_hnsw_graph_is_reused_and_extended_or_ignored_when_stale(tmp_path, monkeypatch) -> None:
    loaded = []
    real_read = faiss.read_index
    monkeypatch.setattr(faiss, "read_index", lambda p: loaded.append(p) or real_read(p))
    rng = np.random.default_rng(1)
    path = tmp_path / "bank"
    vectors = rng.normal(size=(300, DIM)).astype(np.float32)
    writer = MemoryBank.create(path, SceneVectorEmbedder(DIM))
    writer.append_many([_item(i, v) for i, v in enumerate(vectors[:200])])
    built = MemoryBank.open(path, index="hnsw")
    built.save_index()
    assert (path / "index-hnsw-m32.faiss").exists()
    writer.append_many([_item(i, v) for i, v in enumerate(vectors[200:], start=200)])
    reopened = MemoryBank.open(path, index="hnsw")  # cached graph (200) + the 100 appended since
    assert len(loaded) == 1 and reopened._index.ntotal == 300
    for i in (5, 150, 250):
        assert reopened.retrieve(vectors[i], k=1)[0][0].id == f"item-{i}"
    # A cache that does not match the journal (here: ids differ) is ignored, not trusted.
    meta = json.loads((path / "index-hnsw-m32.json").read_text())
    (path / "index-hnsw-m32.json").write_text(json.dumps(dict(meta, last_id="someone-else")))
    rebuilt = MemoryBank.open(path, index="hnsw")
    assert len(loaded) == 1  # the meta check refused it before reading the graph
    assert rebuilt._index.ntotal == 300 and rebuilt.retrieve(vectors[7], k=1)[0][0].id == "item-7"
    (path / "index-hnsw-m32.faiss").write_bytes(b"garbage")
    (path / "index-hnsw-m32.json").write_text(json.dumps(meta))
    assert MemoryBank.open(path, index="hnsw").retrieve(vectors[9], k=1)[0][0].id == "item-9"
    flat = MemoryBank.open(path)
    flat.save_index()  # a flat bank saves only the embeddings side file
    assert (path / f"embeddings-{DIM}.f32").stat().st_size == 300 * DIM * 4
    writer.close()


# --- Acknowledged records are never removed by a later open (issue 17) -----------------------------


def _bank_of(path, n: int) -> bytes:
    """A bank at ``path`` with items 0..n-1; returns the journal's bytes."""
    with MemoryBank.create(path, SceneVectorEmbedder(DIM)) as bank:
        bank.append_many([_item(i, _basis(i)) for i in range(n)])
    return (path / JOURNAL).read_bytes()


def test_damaged_final_record_is_corruption_reported_and_never_truncated(tmp_path) -> None:
    path = tmp_path / "bank"
    _bank_of(path, 3)
    lines = _journal_lines(path)
    offset = len(lines[0]) + len(lines[1])
    # The last record is complete (newline, full declared length) but its payload changed since.
    damaged = b"".join([lines[0], lines[1], lines[2].replace(b"rationale 2", b"rationale X")])
    (path / JOURNAL).write_bytes(damaged)
    where = f"record #3 at byte {offset} (checksum mismatch)"
    # A reader serves the two good records and says what is wrong, once per handle.
    with pytest.warns(JournalWarning) as caught:
        reader = MemoryBank.open(path)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert re.search(rf"{re.escape(str(path / JOURNAL))}: corrupt final {re.escape(where)}: .*acknowledged "
                     r"record damaged since; it is not loaded, its bytes are left in place", messages[0])
    assert "VERSION says 3 records were acknowledged (version 3) but" in messages[1]  # and counted lost
    assert [it.id for it in reader] == ["item-0", "item-1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refresh() rescans the tail but must not repeat the warning
        assert not reader.refresh()
    # The writer refuses: the file, VERSION and the lock are as they were.
    for _ in range(2):
        with pytest.raises(BankIntegrityError) as raised:
            MemoryBank.open(path, writable=True)
        message = str(raised.value)
        assert str(path / JOURNAL) in message and where in message
        assert f"truncate -s {offset} {path / JOURNAL}" in message and "restore" in message
        assert str(path / "VERSION") in message
        assert (raised.value.journal_error.offset, raised.value.journal_error.number) == (offset, 3)
        assert (path / JOURNAL).read_bytes() == damaged
        assert (path / "VERSION").read_text() == "3\n"
    # The bare journal (also the reflection outbox's) refuses the same way.
    with pytest.raises(JournalCorruptionError, match=re.escape(where)):
        Journal(path / JOURNAL)
    assert (path / JOURNAL).read_bytes() == damaged
    # Following the error's instructions gives the record up explicitly, and the bank works on.
    os.truncate(path / JOURNAL, offset)
    os.remove(path / "VERSION")
    with MemoryBank.open(path, writable=True) as bank:
        assert bank.version == 2
        bank.append(_item(3, _basis(3)))
    assert stored_version(path) == 3 and (path / JOURNAL).read_bytes()[:offset] == damaged[:offset]


@pytest.mark.parametrize("case", ["short body", "newline lost", "garbage without newline", "bad header"])
def test_only_an_unfinished_append_counts_as_torn(tmp_path, case) -> None:
    path = tmp_path / "bank"
    intact = _bank_of(path, 2)
    last = _journal_lines(path)[-1]
    offset = len(intact) - len(last)
    body = intact[:offset]
    tail = {
        # newline-terminated, fewer bytes than the length prefix declares: the newline is the last
        # byte of an append, so the line was written whole and lost bytes since
        "short body": last[:-10] + b"\n",
        # the record's newline overwritten: more bytes than a record of that length holds
        "newline lost": last[:-1] + b"x",
        "garbage without newline": b"x" * 40,
        "bad header": b"zz" + last[2:],
    }[case]
    (path / JOURNAL).write_bytes(body + tail)
    result = scan(path / JOURNAL)
    assert result.torn_tail == 0 and [(b.offset, b.number) for b in result.corrupt_tail] == [(offset, 2)]
    with pytest.raises(BankIntegrityError, match=f"record #2 at byte {offset}"):
        MemoryBank.open(path, writable=True)
    assert (path / JOURNAL).read_bytes() == body + tail


@pytest.mark.parametrize("case", ["half a record", "all but the newline", "part of a header", "zero-filled"])
def test_an_unfinished_append_is_still_truncated(tmp_path, case) -> None:
    path = tmp_path / "bank"
    intact = _bank_of(path, 2)
    last = _journal_lines(path)[-1]
    tail = {"half a record": last[: len(last) // 2], "all but the newline": last[:-1],
            "part of a header": last[:12], "zero-filled": bytes(4096)}[case]
    (path / JOURNAL).write_bytes(intact + tail)
    assert scan(path / JOURNAL).torn_tail == len(tail) and not scan(path / JOURNAL).corrupt_tail
    with pytest.warns(JournalWarning, match=f"dropped a torn final record of {len(tail)} bytes"):
        MemoryBank.open(path, writable=True).close()
    assert (path / JOURNAL).read_bytes() == intact


def test_journal_behind_version_is_reported_on_every_open_and_version_never_goes_back(tmp_path) -> None:
    path = tmp_path / "bank"
    older = _bank_of(path, 2)
    with MemoryBank.open(path, writable=True) as bank:
        bank.append_many([_item(i, _basis(i)) for i in range(2, 5)])
    newer = (path / JOURNAL).read_bytes()
    (path / JOURNAL).write_bytes(older)  # an older copy put back: items 2..4 were acknowledged
    lost = (rf"{re.escape(str(path / 'VERSION'))} says 5 records were acknowledged \(version 5\) but "
            rf"{re.escape(str(path / JOURNAL))} holds 2 loadable records, the last at version 2")
    for _ in range(2):  # on every open, not once
        with pytest.warns(JournalWarning, match=lost):
            reader = MemoryBank.open(path)
        assert len(reader) == 2 and reader.version == 2
    with pytest.raises(BankIntegrityError, match=lost + r".*reuse versions 3\.\.5.*put the newer items"):
        MemoryBank.open(path, writable=True)
    assert (path / "VERSION").read_text() == "5\n" and (path / JOURNAL).read_bytes() == older
    assert stored_version(path) == 5
    # The newer journal back: the writer opens; a stale (lower) VERSION is corrected upward.
    (path / JOURNAL).write_bytes(newer)
    (path / "VERSION").write_text("1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        writer = MemoryBank.open(path, writable=True)
    assert writer.version == 5 and (path / "VERSION").read_text() == "5\n"
    # A VERSION raised under the writer (a process ignoring the lock) stops the next append before
    # anything is written: the writer never sets VERSION back.
    (path / "VERSION").write_text("9\n")
    with pytest.raises(BankIntegrityError, match=r"says version 9, ahead of this writer's version 5"):
        writer.append(_item(5, _basis(5)))
    assert (path / JOURNAL).read_bytes() == newer and (path / "VERSION").read_text() == "9\n"
    assert len(writer) == 5
    writer.close()
    # Accepting a loss is explicit: delete VERSION, as the error says.
    (path / JOURNAL).write_bytes(older)
    os.remove(path / "VERSION")
    with MemoryBank.open(path, writable=True) as bank:
        assert bank.version == 2 and (path / "VERSION").read_text() == "2\n"
