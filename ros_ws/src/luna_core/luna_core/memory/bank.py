"""The memory bank Upsilon = {v^(n)} of LUNA-AD Eq. 12: durable, versioned, cosine retrieval.

On disk a bank is a directory::

    manifest.json   format, embedder spec (name, dim); written once, atomically
    items.jsonl     the append-only journal of items (see ``journal``): the single source of truth
    VERSION         the current version as text, replaced atomically after every append (a cheap hint
                    for readers). It never goes back: a writer never writes a lower one, and a journal
                    behind it (records lost, e.g. an older copy restored) is reported on every open
    writer.lock     flock'ed by the one process that may append
    embeddings-<dim>.f32 / .json   optional side file: the embeddings as raw float32 rows, and a header
                    with the journal length and CRC32 they were built from (see docs/memory_bank.md)

An item record holds Q_md, the answer (A_sum, or A_refl for reflection items), the distribution pi
(teacher items; reflection items have none), the source, the creation time, and e and the optional
scene vector as base64 little-endian float32 arrays. No pickle anywhere.

Versions: every append bumps the version by one (the record's sequence number). Processes that only
read call :meth:`MemoryBank.refresh` (cheap when nothing changed: one ``stat``) or compare
:func:`stored_version` with their ``version`` to notice the writer's appends.

Retrieval: faiss inner product on unit vectors, i.e. cosine similarity, with ``ivf`` (the default:
exact below 10k items, IVF-Flat above), an exact ``flat`` index (IndexFlatIP) or an approximate
``hnsw`` one (IndexHNSWFlat), chosen when opening. The index lives in memory and is built on open from
the embeddings side file where it is valid (else from the journal, whose records are then all parsed);
a saved HNSW graph (:meth:`MemoryBank.save_index`, files ``index-hnsw-m<M>.faiss/.json``, faiss' own
format) spares the graph build. IVF lists, once trained, are kept beside the journal
(``index-ivf-<lists>.faiss/.json``) and reused while the bank grows, so that appended items never move
the results of queries they do not enter. The side file is never trusted over the journal: it is used only when
the journal's first bytes still have the CRC it records. Single-query searches
are fastest with ``faiss.omp_set_num_threads(1)`` in the calling process (OpenMP start-up dominates
otherwise, badly so on a loaded machine; see docs/benchmarks.md).
"""

from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import faiss
import numpy as np

from luna_core.assets import unpacked
from luna_core.memory.embedders import Embedder, EmbeddingError, embedder_from_spec, normalise
from luna_core.memory.journal import (Journal, JournalCorruptionError, _decode_line, encode_record, scan,
                                      warn)
from luna_core.types import MemoryItem, validate_distribution

FORMAT = "luna-memory-bank"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "items.jsonl"
VERSION_FILE = "VERSION"
LOCK_FILE = "writer.lock"
SOURCES = ("teacher", "reflection")
SIDE_FORMAT = "luna-memory-bank-embeddings"
# The writer keeps the side file current from this many items on (a full open of fewer items takes
# well under 0.1 s) and rewrites it on close once this many items were appended since it was written.
SIDE_FILE_MIN_ITEMS = 1000

IndexKind = Literal["ivf", "flat", "hnsw"]
# ``ivf`` searches exactly (flat) below this many items at open: a flat scan of 10k 384-d vectors
# takes under 1 ms, and fewer items cluster too coarsely to be worth it.
IVF_MIN_ITEMS = 10_000
IVF_POINTS_PER_LIST = 32  # k-means training sample per list (faiss subsamples to this)
IVF_TRAIN_ITERATIONS = 10


class MemoryBankError(Exception):
    """Base class of memory-bank errors."""


class EmbedderMismatchError(MemoryBankError):
    """The bank was built with another embedder (name or dimension)."""


class BankLockedError(MemoryBankError):
    """Another process (or handle) holds the bank open for writing."""


class ReadOnlyBankError(MemoryBankError):
    """Append on a bank opened for reading."""


class InvalidItemError(MemoryBankError, ValueError):
    """A memory item that cannot be stored (missing text, bad distribution, duplicate id, ...)."""


class BankIntegrityError(MemoryBankError):
    """The bank's files lost or damaged acknowledged items, and a writer was asked to open it.

    Raised instead of writing (nothing on disk is changed): the final journal record is damaged
    (``journal_error`` holds the :class:`JournalCorruptionError`), or the journal is behind the VERSION
    file, or a write would set VERSION lower than the one on disk. The message says how to recover.
    """

    def __init__(self, message: str, journal_error: JournalCorruptionError | None = None) -> None:
        super().__init__(message)
        self.journal_error = journal_error


class MemoryBank:
    """A memory bank directory opened for reading, or for appending by the one writer.

    Use :meth:`create` for a new bank and :meth:`open` for an existing one; close it (or use ``with``)
    to release the writer lock. Methods are thread-safe within a process.
    """

    def __init__(self, path: str | os.PathLike[str], embedder: Embedder | None, *, writable: bool,
                 index: IndexKind = "ivf", hnsw_m: int = 32, hnsw_ef_search: int = 64,
                 ivf_nprobe: int = 32) -> None:
        """Prefer :meth:`open` / :meth:`create`."""
        self.path = os.fspath(path)
        self.writable = writable
        self._lock = threading.RLock()
        self.manifest = _read_manifest(self.path)
        spec = self.manifest["embedder"]
        self.embedder = embedder if embedder is not None else embedder_from_spec(spec)
        _check_embedder(self.path, spec, self.embedder)
        self.dim = int(spec["dim"])
        if index not in ("ivf", "flat", "hnsw"):
            raise ValueError(f"index must be 'ivf', 'flat' or 'hnsw', got {index!r}")
        self.index_kind: IndexKind = index
        self._hnsw_m = hnsw_m
        self._ivf_trained_on: dict[str, Any] | None = None  # what this process trained IVF lists on, unsaved
        self._ivf_kept = False  # the IVF lists were read from the saved file
        # ``ivf`` starts flat: it trains its lists once the items are loaded, if there are enough
        self._index = (faiss.IndexHNSWFlat(self.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT) if index == "hnsw"
                       else faiss.IndexFlatIP(self.dim))
        # Items by row (append order). A row loaded from the embeddings side file stays None until it
        # is needed (retrieved, listed): its JSON is parsed then, from its byte offset in the journal.
        self._items: list[MemoryItem | None] = []
        self._ids: list[str] = []
        self._offsets: list[int] = []  # byte offset of each row's record in the journal
        self._by_id: dict[str, int] = {}
        self._side_vectors: np.ndarray | None = None  # rows [0, len) from the side file, until indexed
        self._side_rows = 0  # rows the side file this bank last read or wrote covers
        self._notes: list[str] = []  # damage warnings of the journal prefix loaded (repeated from a side file)
        self._read_fd = -1  # journal descriptor for parsing lazy rows
        self._crc = 0  # CRC32 of the journal bytes up to ``_offset``
        self._version = 0
        self._offset = 0
        self._next_number = 1  # record number (line number, from 1) of the line at ``_offset``
        self._reported: set[int] = set()  # offsets of damaged final records already warned about
        self._lock_fd = -1
        self._opened = False  # set once the open succeeded: a refused open writes nothing on close
        self._journal: Journal | None = None
        journal_path = os.path.join(self.path, JOURNAL)
        if writable:
            self._lock_fd = _acquire_writer_lock(self.path)
            try:
                # recovers a torn tail, with a warning; checks only the end (this bank loads the rest)
                self._journal = Journal(journal_path, full_scan=False)
            except JournalCorruptionError as e:
                self.close()
                raise BankIntegrityError(
                    f"memory bank {self.path}: {e} If you truncate, also delete "
                    f"{os.path.join(self.path, VERSION_FILE)}: it still counts the record given up, and a "
                    "journal behind it is refused too.", e) from e
            except BaseException:
                self.close()
                raise
        # VERSION is read before the journal: the writer replaces it only after its records are
        # fsync'ed, so a reader racing an append never sees a VERSION ahead of what it then loads.
        acknowledged = _read_version(self.path)
        side_status = self._load_side_file(journal_path)
        self._load_from(journal_path, index=False)  # everything after the side file, or everything
        if acknowledged is not None and acknowledged > self._version:
            self._report_lost(journal_path, acknowledged)
        if index == "hnsw":
            cached = self._cached_hnsw(hnsw_m)
            if cached is not None:
                self._index = cached
            self._index.hnsw.efSearch = hnsw_ef_search
        elif index == "ivf" and len(self._items) >= IVF_MIN_ITEMS:
            self._index = self._ivf(ivf_nprobe)
        self._sync_index()
        if writable:
            assert self._journal is not None
            if self._journal.size == self._offset:
                self._journal.crc = self._crc  # appends continue the CRC the side file records
            _write_version(self.path, self._version)
            if side_status != "valid" and len(self._items) >= SIDE_FILE_MIN_ITEMS:
                self._write_side_file()  # rebuild a missing, stale or damaged one now
        self._opened = True

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | os.PathLike[str], embedder: Embedder, *, index: IndexKind = "ivf",
               exist_ok: bool = False, **index_options: int) -> "MemoryBank":
        """Create an empty bank for ``embedder`` and open it for writing.

        With ``exist_ok`` an existing bank is opened instead (its embedder must match).
        """
        path = os.fspath(path)
        if os.path.exists(os.path.join(path, MANIFEST)):
            if not exist_ok:
                raise MemoryBankError(f"a memory bank already exists at {path}")
            return cls.open(path, embedder, writable=True, index=index, **index_options)
        os.makedirs(path, exist_ok=True)
        spec = dict(embedder.spec())
        if int(spec.get("dim", 0)) != embedder.dim or not spec.get("name"):
            raise ValueError(f"embedder spec {spec} must name the embedder and its dim {embedder.dim}")
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "embedder": spec,
                    "created": time.time(),
                    "record": "JSON lines, '<len hex8> <crc32 hex8> <json>'; arrays base64 float32 LE"}
        journal_path = os.path.join(path, JOURNAL)
        with open(journal_path, "ab") as f:
            os.fsync(f.fileno())
        _atomic_write(os.path.join(path, MANIFEST), json.dumps(manifest, indent=2).encode(), sync=True)
        return cls(path, embedder, writable=True, index=index, **index_options)

    @classmethod
    def open(cls, path: str | os.PathLike[str], embedder: Embedder | None = None, *,
             writable: bool = False, index: IndexKind = "ivf", **index_options: int) -> "MemoryBank":
        """Open an existing bank. ``embedder`` defaults to the one the manifest names; a different one
        is refused with :class:`EmbedderMismatchError`. A bank shipped with its journal xz-compressed
        (``models/memory_bank``) is read from its unpacked copy (``luna_core.assets.unpacked``); it cannot
        be opened for writing (the stack appends to a live copy, ``assets.live_memory_bank``)."""
        packed = Path(path) / (JOURNAL + ".xz")
        if packed.exists() and not (Path(path) / JOURNAL).exists():
            if writable:
                raise MemoryBankError(f"{path}: a packed bank ({packed.name}) cannot be opened for writing; "
                                      "append to a copy (luna_core.assets.live_memory_bank)")
            path = unpacked(Path(path))
        return cls(path, embedder, writable=writable, index=index, **index_options)

    # ------------------------------------------------------------------ state

    @property
    def version(self) -> int:
        """Sequence number of the last item loaded (0 for an empty bank); +1 per append."""
        return self._version

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[MemoryItem]:
        return iter(self.items)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._by_id

    def get(self, item_id: str) -> MemoryItem:
        with self._lock:
            if item_id not in self._by_id:
                raise KeyError(f"no memory item {item_id!r} in {self.path}")
            return self._item(self._by_id[item_id])

    @property
    def items(self) -> list[MemoryItem]:
        """A snapshot list of the items, in append order (parses the records not parsed yet)."""
        with self._lock:
            return [self._item(row) for row in range(len(self._items))]

    # ------------------------------------------------------------------ writing

    def append(self, item: MemoryItem) -> MemoryItem:
        """Store one item durably; returns it as stored (id, created and embedding filled in).

        When this returns the item is on disk (fsync'ed) and survives a crash of the process.
        """
        return self.append_many([item])[0]

    def append_many(self, items: Sequence[MemoryItem]) -> list[MemoryItem]:
        """Store several items with one write and one fsync; all are durable when this returns."""
        if not self.writable or self._journal is None:
            raise ReadOnlyBankError(f"memory bank {self.path} was opened read-only")
        with self._lock:
            prepared = self._prepare(items)
            _check_version_not_ahead(self.path, self._version)  # before anything is written
            payloads = [_to_record(item, self._version + 1 + i) for i, item in enumerate(prepared)]
            self._journal.append_many(payloads)
            self._offset = self._journal.size
            if self._journal.crc is not None:
                self._crc = self._journal.crc
            self._add_loaded(prepared, list(self._journal.last_offsets), self._version + len(prepared))
            _write_version(self.path, self._version)
            return prepared

    def _prepare(self, items: Sequence[MemoryItem]) -> list[MemoryItem]:
        seen = set(self._by_id)
        out = []
        for n, item in enumerate(items):
            item_id = item.id or uuid.uuid4().hex
            where = f"memory item {item_id!r} (#{n} of the batch)"
            if item_id in seen:
                raise InvalidItemError(f"{where}: the id is already in the bank")
            seen.add(item_id)
            if not isinstance(item.query, str) or not item.query.strip():
                raise InvalidItemError(f"{where}: empty query Q_md")
            if not isinstance(item.answer, str) or not item.answer.strip():
                raise InvalidItemError(f"{where}: empty answer")
            if item.source not in SOURCES:
                raise InvalidItemError(f"{where}: source {item.source!r} is not one of {SOURCES}")
            distribution = None
            if item.distribution is not None:
                if item.source == "reflection":
                    raise InvalidItemError(f"{where}: reflection items carry no distribution (Eq. 12)")
                try:
                    distribution = validate_distribution(item.distribution)
                except ValueError as e:
                    raise InvalidItemError(f"{where}: {e}") from None
            elif item.source == "teacher":
                raise InvalidItemError(f"{where}: teacher items need the distribution pi")
            scene_vector = None
            if item.scene_vector is not None:
                scene_vector = np.asarray(item.scene_vector, dtype=np.float32).reshape(-1)
                if not np.all(np.isfinite(scene_vector)):
                    raise InvalidItemError(f"{where}: scene_vector contains NaN or inf")
            created = item.created if item.created and math.isfinite(item.created) else time.time()
            out.append(MemoryItem(id=item_id, query=item.query, answer=item.answer,
                                  embedding=item.embedding, distribution=distribution, source=item.source,
                                  created=float(created), scene_vector=scene_vector))
        missing = [i for i, item in enumerate(out) if item.embedding is None]
        try:
            if missing:
                computed = self.embedder.embed_items([out[i] for i in missing])
                for i, row in zip(missing, computed):
                    out[i].embedding = row
            for item in out:
                item.embedding = _checked_vector(item.embedding, self.dim, f"memory item {item.id!r}")
        except EmbeddingError as e:
            raise InvalidItemError(str(e)) from None
        return out

    # ------------------------------------------------------------------ reading

    def refresh(self) -> bool:
        """Load items appended by the writer since the last load; True if there were any.

        Cheap when nothing changed (one ``stat``). An append in progress is picked up next time.
        """
        with self._lock:
            journal_path = os.path.join(self.path, JOURNAL)
            size = os.path.getsize(journal_path)
            if size == self._offset:
                return False
            if size < self._offset:  # only a rebuilt bank shrinks below what was loaded
                raise MemoryBankError(f"memory journal {journal_path} shrank from {self._offset} to {size} "
                                      "bytes: the bank was replaced; open it again")
            before = self._version
            self._load_from(journal_path)
            return self._version != before

    def retrieve(self, query: str | np.ndarray, k: int = 3,
                 exclude_ids: Sequence[str] | set[str] = ()) -> list[tuple[MemoryItem, float]]:
        """The ``k`` items most similar to ``query``, best first, with their cosine similarity.

        ``query`` is a Q_md text (its traffic-state part is embedded) or a vector in the embedder's
        space (a MiniLM embedding, or a raw scene vector for a scene-vector bank; it is normalised).
        Items whose id is in ``exclude_ids`` are skipped (e.g. the item a training sample came from).
        """
        if k <= 0:
            return []
        try:
            q = self.embedder.embed_query(query)
        except EmbeddingError as e:
            raise EmbeddingError(f"retrieval query for {self.path}: {e}") from None
        with self._lock:
            excluded = {i for i in exclude_ids if i in self._by_id}
            wanted = min(len(self._items), k + len(excluded))
            if wanted == 0:
                return []
            scores, rows = self._index.search(q[None].astype(np.float32), wanted)
            out = []
            for score, row in zip(scores[0], rows[0]):
                if row < 0:
                    continue  # HNSW may return fewer than asked
                if self._ids[int(row)] in excluded:
                    continue
                out.append((self._item(int(row)), float(score)))
                if len(out) == k:
                    break
            return out

    def close(self) -> None:
        """Release the writer lock and the journal (idempotent).

        The writer first refreshes the embeddings side file when at least ``SIDE_FILE_MIN_ITEMS`` items
        were appended since it was last written, so that the next open reads them in one piece.
        """
        if (self._opened and self._journal is not None and self._lock_fd >= 0
                and len(self._items) - self._side_rows >= SIDE_FILE_MIN_ITEMS):
            try:
                self._write_side_file()
            except OSError as e:  # the journal is complete without it; the next open parses the tail
                warn(f"memory bank {self.path}: could not write the embeddings side file: {e}")
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "MemoryBank":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _report_lost(self, journal_path: str, acknowledged: int) -> None:
        """The journal holds fewer records than VERSION says were acknowledged: an error for a
        writer (appending would reuse the lost versions and fork this copy from the newer one), a
        warning for a reader (it serves what is there, but says so on every open)."""
        version_path = os.path.join(self.path, VERSION_FILE)
        found = (f"{version_path} says {acknowledged} records were acknowledged (version {acknowledged}) "
                 f"but {journal_path} holds {len(self._items)} loadable records, the last at version "
                 f"{self._version}: acknowledged records are missing (the journal was replaced by an older "
                 "copy, or lost data)")
        if self.writable:
            self.close()
            raise BankIntegrityError(
                f"memory bank {self.path}: {found}. Refusing to open it for writing: new items would reuse "
                f"versions {self._version + 1}..{acknowledged}. To recover: put the newer {JOURNAL} back; "
                f"or, to accept the loss, delete {version_path} and open again (the bank then continues "
                f"from version {self._version}).")
        warn(f"memory bank {self.path}: {found}")

    def _load_from(self, journal_path: str, index: bool = True) -> None:
        result = scan(journal_path, self._offset, self._next_number, self._crc)
        for bad in result.skipped:
            self._note(f"memory journal {journal_path}: corrupt record at byte {bad.offset} skipped (record "
                       f"#{bad.number}: {bad.reason}; its bytes are left in place, every other record is kept)")
        for bad in result.corrupt_tail:
            if bad.offset not in self._reported:  # refresh() rescans it: say it once per handle
                self._reported.add(bad.offset)
                warn(f"memory journal {journal_path}: corrupt final {bad.describe()}: it was complete "
                     "when written, so it is an acknowledged record damaged since; it is not loaded, its "
                     "bytes are left in place, and the bank cannot be opened for writing until it is "
                     "repaired (restore the file, or truncate it at that byte)")
        loaded = []
        offsets = []
        loaded_ids: set[str] = set()
        last_seq = self._version
        for record, (offset, number) in zip(result.records, result.positions):
            try:
                item, seq = _from_record(record, self.dim)
            except (KeyError, TypeError, ValueError) as e:
                self._note(f"memory journal {journal_path}: unusable record #{number} at byte {offset} "
                           f"skipped: {e}")
                if isinstance(record.get("seq"), int):  # its version stays taken: versions never repeat
                    last_seq = max(last_seq, record["seq"])
                continue
            if item.id in self._by_id or item.id in loaded_ids:
                self._note(f"memory journal {journal_path}: record with duplicate id {item.id!r} skipped")
                continue
            loaded_ids.add(item.id)
            loaded.append(item)
            offsets.append(offset)
            last_seq = max(last_seq, seq)
        self._offset = result.end
        self._next_number = result.next_number
        self._crc = result.crc
        self._add_loaded(loaded, offsets, last_seq, index)

    def _note(self, message: str) -> None:
        """Warn about damage in the journal, and remember it for the side file: an open that reads the
        side file instead of these records repeats the warning, so the damage is never hidden."""
        self._notes.append(message)
        warn(message)

    def _add_loaded(self, items: list[MemoryItem], offsets: list[int], version: int, index: bool = True) -> None:
        for item, offset in zip(items, offsets):
            self._by_id[item.id] = len(self._items)
            self._items.append(item)
            self._ids.append(item.id)
            self._offsets.append(offset)
        self._version = max(self._version, version)
        if index:
            self._sync_index()

    @property
    def index_description(self) -> str:
        """The search the bank runs now, e.g. "IVF-Flat, 512 lists, nprobe 16" or "flat (exact)"."""
        index = self._index
        if isinstance(index, faiss.IndexIVFFlat):
            return f"IVF-Flat, {index.nlist} lists, nprobe {index.nprobe}"
        if hasattr(index, "hnsw"):
            return f"HNSW, M {self._hnsw_m}, efSearch {index.hnsw.efSearch}"
        note = f" (an ivf bank below {IVF_MIN_ITEMS} items at open)" if self.index_kind == "ivf" else ""
        return "flat (exact)" + note

    def _ivf(self, nprobe: int) -> Any:
        """The IVF-Flat index over the items loaded: its lists (k-means centroids) as saved beside the
        journal (``index-ivf-<lists>.faiss/.json``) where they were trained on a prefix of these items and
        these items call for as many lists, else trained now (and saved if this bank is writable).

        Its scores are exact inner products; only the choice of the nprobe lists scanned is approximate.
        Keeping the lists while a bank grows (reflection items, a vehicle's live bank) keeps retrieval
        stable: an appended item changes a query's result only where it enters the top K, across restarts
        as within the process that appended it; retrained lists would move other queries' results too.
        """
        nlist = ivf_list_count(len(self._items))
        ivf = self._cached_ivf(nlist)
        self._ivf_kept = ivf is not None
        if ivf is None:
            ivf = self._trained_ivf(nlist)
            if self.writable:
                self._save_ivf(ivf)
        ivf.nprobe = min(nprobe, nlist)
        ivf.set_direct_map_type(faiss.DirectMap.Array)  # rows reconstructible (side file), 8 bytes each
        return ivf

    def _trained_ivf(self, nlist: int) -> Any:
        """An empty IVF-Flat index with ``nlist`` lists trained by k-means on the items loaded.

        Measured on 100k real scene embeddings (docs/benchmarks.md): 512 lists, recall@3 1.0 from nprobe
        16 on, p99 0.45 ms (16) / 0.69 ms (32) wall; the default 32 (6 % of the lists) leaves a margin
        for MiniLM embeddings, where scanning 3 % of the lists gave 0.998 and 6 % 1.000 (3.7k items).
        Random vectors do not cluster and get far lower recall (0.14-0.37): IVF relies on real data.
        """
        n = len(self._items)
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.max_points_per_centroid = IVF_POINTS_PER_LIST  # train on a sample: 0.2-1 s, not 5 s
        ivf.cp.niter = IVF_TRAIN_ITERATIONS
        ivf.train(self._vectors(0, n))
        self._ivf_trained_on = self._prefix_header(n)
        return ivf

    def _ivf_paths(self, nlist: int) -> tuple[str, str]:
        stem = os.path.join(self.path, f"index-ivf-{nlist}")
        return stem + ".faiss", stem + ".json"

    def _save_ivf(self, ivf: Any) -> None:
        """Save the trained lists without their items (the centroids: ~100 KB at 256 lists of 97-d) and
        the items they were trained on (count, first and last id, journal length and CRC)."""
        if self._ivf_trained_on is None:
            return  # lists read from a saved file, or saved already
        empty = faiss.clone_index(ivf)
        empty.reset()
        index_path, meta_path = self._ivf_paths(ivf.nlist)
        tmp = f"{index_path}.tmp.{os.getpid()}"
        faiss.write_index(empty, tmp)
        os.replace(tmp, index_path)
        _atomic_write(meta_path, json.dumps({"nlist": ivf.nlist, **self._ivf_trained_on}).encode(), sync=False)
        self._ivf_trained_on = None

    @property
    def ivf_lists_kept(self) -> bool:
        """True where this open's IVF lists were read from the saved file, i.e. trained on an earlier,
        shorter (or equal) state of the bank, not on the items loaded now."""
        return isinstance(self._index, faiss.IndexIVFFlat) and self._ivf_kept

    def _prefix_header(self, count: int) -> dict[str, Any]:
        """What a saved index covers: the first ``count`` items (ids of the first and last) and the
        journal bytes they were loaded from (length, CRC); checked on open by :meth:`_covers_prefix`."""
        return {"embedder": self.manifest["embedder"], "count": count,
                "first_id": self._ids[0] if count else "", "last_id": self._ids[count - 1] if count else "",
                "journal_bytes": self._offset, "journal_crc": self._crc}

    def _covers_prefix(self, meta: dict[str, Any]) -> bool:
        """Whether a saved index's header (:meth:`_prefix_header`) names a prefix of the items just loaded."""
        count = int(meta["count"])
        return (meta["embedder"] == self.manifest["embedder"] and count <= len(self._items)
                and (not count or (self._ids[0] == meta["first_id"] and self._ids[count - 1] == meta["last_id"]))
                and self._journal_prefix_matches(int(meta["journal_bytes"]), int(meta["journal_crc"])))

    def _cached_ivf(self, nlist: int) -> Any | None:
        """The saved lists if they have ``nlist`` lists and were trained on a prefix of the items just
        loaded (checked by ids and the journal prefix's CRC), else None."""
        index_path, meta_path = self._ivf_paths(nlist)
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            if int(meta["nlist"]) != nlist or not int(meta["count"]) or not self._covers_prefix(meta):
                return None
            index = faiss.read_index(index_path)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            return None  # no usable lists: trained again
        if (not isinstance(index, faiss.IndexIVFFlat) or index.nlist != nlist or index.d != self.dim
                or index.ntotal != 0 or not index.is_trained or index.metric_type != faiss.METRIC_INNER_PRODUCT):
            return None
        return index

    def _vectors(self, start: int, stop: int) -> np.ndarray:
        """The unit embeddings of rows [start, stop), from the side file where it has them."""
        parts = []
        side = self._side_vectors
        if side is not None and start < len(side):
            parts.append(np.asarray(side[start:min(stop, len(side))], dtype=np.float32))
            start = min(stop, len(side))
        if start < stop:
            parts.append(np.stack([self._item(row).embedding for row in range(start, stop)]))
        return np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts), dtype=np.float32)

    def _sync_index(self) -> None:
        """Add the items the index does not cover yet (it always covers a prefix of the items)."""
        done = self._index.ntotal
        if done < len(self._items):
            self._index.add(self._vectors(done, len(self._items)))
        self._side_vectors = None  # the index holds its own copy now

    def _item(self, row: int) -> MemoryItem:
        """The item of ``row``, parsing its journal record on first use (rows read from the side file)."""
        item = self._items[row]
        if item is None:
            item = self._parse_row(row)
            self._items[row] = item
        return item

    def _parse_row(self, row: int) -> MemoryItem:
        journal_path = os.path.join(self.path, JOURNAL)
        offset, item_id = self._offsets[row], self._ids[row]
        if self._read_fd < 0:
            # The descriptor stays open: the record at ``offset`` is the one the CRC check covered,
            # even if the file is later replaced (refresh() then reports the replacement).
            self._read_fd = os.open(journal_path, os.O_RDONLY)
        head = os.pread(self._read_fd, 18, offset)
        try:
            length = int(head[0:8], 16)
        except ValueError:
            length = -1
        line = head + os.pread(self._read_fd, max(length, 0) + 1, offset + 18)
        payload, reason = _decode_line(line[:-1]) if line.endswith(b"\n") else (None, "no newline")
        try:
            if payload is None:
                raise ValueError(reason)
            item, _ = _from_record(payload, self.dim)
            if item.id != item_id:
                raise ValueError(f"it holds item {item.id!r}, the side file says {item_id!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise MemoryBankError(
                f"memory journal {journal_path}: the record of item {item_id!r} at byte {offset} no longer "
                f"reads back ({e}): the journal changed after this bank was opened; open it again") from None
        return item

    def _hnsw_cache_paths(self, m: int) -> tuple[str, str]:
        stem = os.path.join(self.path, f"index-hnsw-m{m}")
        return stem + ".faiss", stem + ".json"

    def _side_paths(self) -> tuple[str, str]:
        stem = os.path.join(self.path, f"embeddings-{self.dim}")
        return stem + ".f32", stem + ".json"

    def save_index(self) -> None:
        """Save the embeddings side file (any index), the IVF lists if this process trained them, and,
        for ``index="hnsw"``, the HNSW graph beside the journal, so that an open reads them instead of
        parsing every record, training lists and rebuilding the graph (minutes at 100k items); it then
        parses only the records appended since.

        Any process may call it (e.g. ``luna-offline collect`` after building a bank). All are checked
        on open against the journal (its length and a CRC of its bytes) and ignored if they do not match.
        """
        with self._lock:
            self._write_side_file()
            if isinstance(self._index, faiss.IndexIVFFlat):
                self._save_ivf(self._index)
            if self.index_kind != "hnsw":
                return
            index_path, meta_path = self._hnsw_cache_paths(self._hnsw_m)
            meta = self._prefix_header(self._index.ntotal)
            tmp = f"{index_path}.tmp.{os.getpid()}"
            faiss.write_index(self._index, tmp)
            os.replace(tmp, index_path)
            _atomic_write(meta_path, json.dumps(meta).encode(), sync=False)

    def _write_side_file(self) -> None:
        """Write ``embeddings-<dim>.f32`` (the index's unit vectors, row = item, little-endian float32)
        and its header ``embeddings-<dim>.json``: the journal length and CRC32 it was built from, the
        version, the items' ids and record offsets, the damage warnings of that journal prefix, and the
        CRC32 of the vectors. The header is one journal-framed line, so it carries its own CRC."""
        with self._lock:
            self._sync_index()
            n = len(self._items)
            vectors = self._index.reconstruct_n(0, n) if n else np.zeros((0, self.dim), np.float32)
            data = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
            header = {"format": SIDE_FORMAT, "embedder": self.manifest["embedder"], "dim": self.dim,
                      "count": n, "version": self._version, "journal_bytes": self._offset,
                      "journal_crc": self._crc, "next_number": self._next_number,
                      "data_crc": zlib.crc32(data), "ids": self._ids, "offsets": self._offsets,
                      "notes": self._notes, "written": time.time()}
            data_path, header_path = self._side_paths()
            # Vectors first, header last: a reader between the two sees a CRC mismatch and ignores both.
            _atomic_write(data_path, data, sync=False)
            _atomic_write(header_path, encode_record(header), sync=False)
            self._side_rows = n

    def _load_side_file(self, journal_path: str) -> str:
        """Load the rows the side file covers, if it matches the journal: "valid"; else "missing"
        (no side file, nothing said) or "invalid" (a warning says why; the journal is read instead)."""
        data_path, header_path = self._side_paths()
        try:
            with open(header_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return "missing"
        except OSError as e:
            return self._side_invalid(f"cannot read {header_path}: {e}")
        header, reason = _decode_line(raw[:-1]) if raw.endswith(b"\n") else (None, "no terminating newline")
        if header is None:
            return self._side_invalid(f"{header_path} is damaged ({reason})")
        try:
            count, end = int(header["count"]), int(header["journal_bytes"])
            ids, offsets = [str(i) for i in header["ids"]], [int(o) for o in header["offsets"]]
            if header["format"] != SIDE_FORMAT or int(header["dim"]) != self.dim:
                return self._side_invalid(f"{header_path} is not a {SIDE_FORMAT} header for {self.dim}-d")
            if header["embedder"] != self.manifest["embedder"]:
                return self._side_invalid(f"{header_path} was written for embedder {header['embedder']}")
            if len(ids) != count or len(offsets) != count or len(set(ids)) != count:
                return self._side_invalid(f"{header_path} lists {len(ids)} ids and {len(offsets)} offsets "
                                          f"for {count} rows")
            journal_size = os.path.getsize(journal_path)
            if end > journal_size:
                return self._side_invalid(f"it covers {end} bytes of {journal_path}, which holds "
                                          f"{journal_size} (the journal was replaced or truncated)")
            expected = count * self.dim * 4
            size = os.path.getsize(data_path)
            if size != expected:
                return self._side_invalid(f"{data_path} holds {size} bytes, its header says {count} rows "
                                          f"of {self.dim} float32 ({expected} bytes)")
            vectors = (np.memmap(data_path, dtype="<f4", mode="r", shape=(count, self.dim)) if count
                       else np.zeros((0, self.dim), np.float32))
            if zlib.crc32(vectors) != int(header["data_crc"]):
                return self._side_invalid(f"{data_path} fails its CRC check")
            if _prefix_crc(journal_path, end) != int(header["journal_crc"]):
                return self._side_invalid(f"the first {end} bytes of {journal_path} are not those it was "
                                          "built from (the journal was replaced or modified)")
            version, next_number = int(header["version"]), int(header["next_number"])
            notes = [str(n) for n in header["notes"]]
        except (OSError, KeyError, TypeError, ValueError) as e:
            return self._side_invalid(f"{header_path}: {type(e).__name__}: {e}")
        self._items = [None] * count
        self._ids, self._offsets = ids, offsets
        self._by_id = {item_id: row for row, item_id in enumerate(ids)}
        self._side_vectors = vectors
        self._side_rows = count
        self._version, self._offset, self._next_number, self._crc = version, end, next_number, int(
            header["journal_crc"])
        self._notes = notes
        for note in notes:  # damage in the covered records is reported as if they had been read
            warn(note)
        return "valid"

    def _side_invalid(self, why: str) -> str:
        warn(f"memory bank {self.path}: embeddings side file ignored: {why}. Reading the whole journal "
             "instead (the source of truth); the writer rebuilds the side file (or call save_index()).")
        return "invalid"

    def _journal_prefix_matches(self, end: int, crc: int) -> bool:
        if end > self._offset:
            return False
        if end == self._offset:
            return crc == self._crc
        return _prefix_crc(os.path.join(self.path, JOURNAL), end) == crc

    def _cached_hnsw(self, m: int) -> Any | None:
        """The saved HNSW index if it matches the items just loaded from the journal, else None."""
        index_path, meta_path = self._hnsw_cache_paths(m)
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            count = int(meta["count"])
            if not self._covers_prefix(meta):
                return None
            index = faiss.read_index(index_path)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            return None  # no usable cache: the graph is rebuilt
        if index.ntotal != count or index.d != self.dim or not hasattr(index, "hnsw"):
            return None
        return index


# ---------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------


def ivf_list_count(n: int) -> int:
    """IVF lists for ``n`` items: about 1.6 sqrt(n), a power of two (256 at 21.7k, 512 at 100k)."""
    return int(2 ** round(math.log2(1.6 * math.sqrt(n))))


def stored_version(path: str | os.PathLike[str]) -> int:
    """The version of the bank at ``path`` as last written (cheap: reads the VERSION file).

    Falls back to scanning the journal if the VERSION file is missing or unreadable.
    """
    version = _read_version(path)
    if version is None:
        records = scan(os.path.join(path, JOURNAL)).records
        return max((int(r.get("seq", 0)) for r in records), default=0)
    return version


def _read_version(path: str | os.PathLike[str]) -> int | None:
    """The VERSION file's value, or None if it is missing or unreadable."""
    try:
        with open(os.path.join(path, VERSION_FILE), "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _check_version_not_ahead(path: str, version: int) -> None:
    """Refuse to go on if VERSION on disk is above ``version`` (the writer's own): writing would
    set it back. Only a process ignoring the writer lock, or a file swapped under the writer, gets
    here; the writer stops before it writes anything."""
    on_disk = _read_version(path)
    if on_disk is not None and on_disk > version:
        raise BankIntegrityError(
            f"memory bank {path}: {os.path.join(path, VERSION_FILE)} says version {on_disk}, ahead of "
            f"this writer's version {version}; refusing to write (versions never go back). Another "
            "process changed the bank under this writer: close it and open the bank again.")


def _read_manifest(path: str) -> dict[str, Any]:
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise MemoryBankError(f"no memory bank at {path} (missing {MANIFEST})") from None
    except ValueError as e:
        raise MemoryBankError(f"memory bank manifest {manifest_path} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise MemoryBankError(f"{manifest_path} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise MemoryBankError(f"{manifest_path}: format version {manifest.get('format_version')} is not "
                              f"supported (this code reads version {FORMAT_VERSION})")
    spec = manifest.get("embedder")
    if not isinstance(spec, dict) or "name" not in spec or "dim" not in spec:
        raise MemoryBankError(f"{manifest_path} does not name its embedder and dimension")
    return manifest


def _check_embedder(path: str, stored: dict[str, Any], embedder: Embedder) -> None:
    given = embedder.spec()
    if stored["name"] != given.get("name") or int(stored["dim"]) != int(given.get("dim", -1)) \
            or embedder.dim != int(stored["dim"]):
        raise EmbedderMismatchError(
            f"memory bank {path} was built with embedder {stored['name']!r} ({stored['dim']}-d); "
            f"refusing to use it with {given.get('name')!r} ({given.get('dim')}-d): embeddings of "
            "different embedders cannot be compared. Open it with its own embedder or build a new bank.")


def _acquire_writer_lock(path: str) -> int:
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BankLockedError(f"memory bank {path} is already open for writing (one writer at a time); "
                              "open it read-only and call refresh() to follow the writer") from None
    return fd


def _atomic_write(path: str, data: bytes, sync: bool) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _prefix_crc(path: str, end: int) -> int:
    """CRC32 of the first ``end`` bytes of the file at ``path``."""
    crc = 0
    with open(path, "rb") as f:
        left = end
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break  # shorter than ``end``: the CRC cannot match
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


def _write_version(path: str, version: int) -> None:
    # No fsync: the journal is fsync'ed first, so after a power loss VERSION can only be behind it,
    # and the writer corrects it upward on its next open. It is never written lower than on disk.
    _check_version_not_ahead(path, version)
    _atomic_write(os.path.join(path, VERSION_FILE), b"%d\n" % version, sync=False)


# ---------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------


def _encode_array(v: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")


def _decode_array(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s.encode("ascii"), validate=True), dtype="<f4").astype(np.float32)


def _to_record(item: MemoryItem, seq: int) -> dict[str, Any]:
    return {"seq": seq, "id": item.id, "source": item.source, "created": item.created,
            "query": item.query, "answer": item.answer,
            "distribution": None if item.distribution is None else [float(p) for p in item.distribution],
            "embedding": _encode_array(item.embedding),
            "scene_vector": None if item.scene_vector is None else _encode_array(item.scene_vector)}


def _from_record(record: dict[str, Any], dim: int) -> tuple[MemoryItem, int]:
    embedding = _decode_array(record["embedding"])
    if embedding.shape != (dim,):
        raise ValueError(f"embedding has {embedding.size} values, the bank's embedder has {dim}")
    distribution = record.get("distribution")
    scene_vector = record.get("scene_vector")
    item = MemoryItem(id=str(record["id"]), query=str(record["query"]), answer=str(record["answer"]),
                      embedding=embedding,
                      distribution=None if distribution is None else validate_distribution(distribution),
                      source=str(record["source"]), created=float(record["created"]),
                      scene_vector=None if scene_vector is None else _decode_array(scene_vector))
    return item, int(record["seq"])


def _checked_vector(v: np.ndarray | None, dim: int, what: str) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float32).reshape(-1)
    if arr.shape != (dim,):
        raise EmbeddingError(f"{what}: embedding has {arr.size} values, the bank's embedder has {dim}")
    return normalise(arr[None], what)[0]
