"""The memory bank Upsilon = {v^(n)} of LUNA-AD Eq. 12: durable, versioned, cosine retrieval.

On disk a bank is a directory::

    manifest.json   format, embedder spec (name, dim); written once, atomically
    items.jsonl     the append-only journal of items (see ``journal``): the single source of truth
    VERSION         the current version as text, replaced atomically after every append (a cheap hint
                    for readers). It never goes back: a writer never writes a lower one, and a journal
                    behind it (records lost, e.g. an older copy restored) is reported on every open
    writer.lock     flock'ed by the one process that may append

An item record holds Q_md, the answer (A_sum, or A_refl for reflection items), the distribution pi
(teacher items; reflection items have none), the source, the creation time, and e and the optional
scene vector as base64 little-endian float32 arrays. No pickle anywhere.

Versions: every append bumps the version by one (the record's sequence number). Processes that only
read call :meth:`MemoryBank.refresh` (cheap when nothing changed: one ``stat``) or compare
:func:`stored_version` with their ``version`` to notice the writer's appends.

Retrieval: faiss inner product on unit vectors, i.e. cosine similarity, with an exact ``flat`` index
(IndexFlatIP) or an approximate ``hnsw`` one (IndexHNSWFlat), chosen when opening. The index lives in
memory and is rebuilt from the journal on open; a saved HNSW graph (:meth:`MemoryBank.save_index`,
files ``index-hnsw-m<M>.faiss/.json``, faiss' own format) spares the rebuild. Single-query searches
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
from typing import Any, Iterator, Literal, Sequence

import faiss
import numpy as np

from luna_core.memory.embedders import Embedder, EmbeddingError, embedder_from_spec, normalise
from luna_core.memory.journal import Journal, JournalCorruptionError, scan, warn
from luna_core.types import MemoryItem, validate_distribution

FORMAT = "luna-memory-bank"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "items.jsonl"
VERSION_FILE = "VERSION"
LOCK_FILE = "writer.lock"
SOURCES = ("teacher", "reflection")

IndexKind = Literal["flat", "hnsw"]


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
                 index: IndexKind = "flat", hnsw_m: int = 32, hnsw_ef_search: int = 64) -> None:
        """Prefer :meth:`open` / :meth:`create`."""
        self.path = os.fspath(path)
        self.writable = writable
        self._lock = threading.RLock()
        self.manifest = _read_manifest(self.path)
        spec = self.manifest["embedder"]
        self.embedder = embedder if embedder is not None else embedder_from_spec(spec)
        _check_embedder(self.path, spec, self.embedder)
        self.dim = int(spec["dim"])
        if index not in ("flat", "hnsw"):
            raise ValueError(f"index must be 'flat' or 'hnsw', got {index!r}")
        self.index_kind: IndexKind = index
        self._hnsw_m = hnsw_m
        self._index = (faiss.IndexFlatIP(self.dim) if index == "flat"
                       else faiss.IndexHNSWFlat(self.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT))
        self._items: list[MemoryItem] = []
        self._by_id: dict[str, int] = {}
        self._version = 0
        self._offset = 0
        self._next_number = 1  # record number (line number, from 1) of the line at ``_offset``
        self._reported: set[int] = set()  # offsets of damaged final records already warned about
        self._lock_fd = -1
        self._journal: Journal | None = None
        journal_path = os.path.join(self.path, JOURNAL)
        if writable:
            self._lock_fd = _acquire_writer_lock(self.path)
            try:
                self._journal = Journal(journal_path)  # recovers a torn tail, with a warning
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
        self._load_from(journal_path, index=False)
        if acknowledged is not None and acknowledged > self._version:
            self._report_lost(journal_path, acknowledged)
        if index == "hnsw":
            cached = self._cached_hnsw(hnsw_m)
            if cached is not None:
                self._index = cached
            self._index.hnsw.efSearch = hnsw_ef_search
        self._sync_index()
        if writable:
            _write_version(self.path, self._version)

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, path: str | os.PathLike[str], embedder: Embedder, *, index: IndexKind = "flat",
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
             writable: bool = False, index: IndexKind = "flat", **index_options: int) -> "MemoryBank":
        """Open an existing bank. ``embedder`` defaults to the one the manifest names; a different one
        is refused with :class:`EmbedderMismatchError`."""
        return cls(path, embedder, writable=writable, index=index, **index_options)

    # ------------------------------------------------------------------ state

    @property
    def version(self) -> int:
        """Sequence number of the last item loaded (0 for an empty bank); +1 per append."""
        return self._version

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[MemoryItem]:
        return iter(list(self._items))

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._by_id

    def get(self, item_id: str) -> MemoryItem:
        with self._lock:
            if item_id not in self._by_id:
                raise KeyError(f"no memory item {item_id!r} in {self.path}")
            return self._items[self._by_id[item_id]]

    @property
    def items(self) -> list[MemoryItem]:
        """A snapshot list of the items, in append order."""
        with self._lock:
            return list(self._items)

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
            self._add_loaded(prepared, self._version + len(prepared))
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
                item = self._items[int(row)]
                if item.id in excluded:
                    continue
                out.append((item, float(score)))
                if len(out) == k:
                    break
            return out

    def close(self) -> None:
        """Release the writer lock and the journal (idempotent)."""
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
        result = scan(journal_path, self._offset, self._next_number)
        for bad in result.skipped:
            warn(f"memory journal {journal_path}: corrupt record at byte {bad.offset} skipped (record "
                 f"#{bad.number}: {bad.reason}; its bytes are left in place, every other record is kept)")
        for bad in result.corrupt_tail:
            if bad.offset not in self._reported:  # refresh() rescans it: say it once per handle
                self._reported.add(bad.offset)
                warn(f"memory journal {journal_path}: corrupt final {bad.describe()}: it was complete "
                     "when written, so it is an acknowledged record damaged since; it is not loaded, its "
                     "bytes are left in place, and the bank cannot be opened for writing until it is "
                     "repaired (restore the file, or truncate it at that byte)")
        loaded = []
        loaded_ids: set[str] = set()
        last_seq = self._version
        for record, (offset, number) in zip(result.records, result.positions):
            try:
                item, seq = _from_record(record, self.dim)
            except (KeyError, TypeError, ValueError) as e:
                warn(f"memory journal {journal_path}: unusable record #{number} at byte {offset} "
                     f"skipped: {e}")
                if isinstance(record.get("seq"), int):  # its version stays taken: versions never repeat
                    last_seq = max(last_seq, record["seq"])
                continue
            if item.id in self._by_id or item.id in loaded_ids:
                warn(f"memory journal {journal_path}: record with duplicate id {item.id!r} skipped")
                continue
            loaded_ids.add(item.id)
            loaded.append(item)
            last_seq = max(last_seq, seq)
        self._offset = result.end
        self._next_number = result.next_number
        self._add_loaded(loaded, last_seq, index)

    def _add_loaded(self, items: list[MemoryItem], version: int, index: bool = True) -> None:
        for item in items:
            self._by_id[item.id] = len(self._items)
            self._items.append(item)
        self._version = max(self._version, version)
        if index:
            self._sync_index()

    def _sync_index(self) -> None:
        """Add the items the index does not cover yet (it always covers a prefix of the items)."""
        done = self._index.ntotal
        if done < len(self._items):
            self._index.add(np.stack([item.embedding for item in self._items[done:]]).astype(np.float32))

    def _hnsw_cache_paths(self, m: int) -> tuple[str, str]:
        stem = os.path.join(self.path, f"index-hnsw-m{m}")
        return stem + ".faiss", stem + ".json"

    def save_index(self) -> None:
        """Save the HNSW graph beside the journal, so that opening with ``index="hnsw"`` loads it and
        only adds the items appended since, instead of rebuilding the graph (minutes at 100k items).

        Any process may call it (e.g. ``luna-offline collect`` after building a bank). The cache is
        checked on open (embedder, count, ids) and ignored if it does not match the journal.
        """
        if self.index_kind != "hnsw":
            raise MemoryBankError("save_index applies to banks opened with index='hnsw' (a flat index "
                                  "is rebuilt on open at memory speed)")
        with self._lock:
            index_path, meta_path = self._hnsw_cache_paths(self._hnsw_m)
            count = self._index.ntotal
            meta = {"embedder": self.manifest["embedder"], "count": count,
                    "first_id": self._items[0].id if count else "",
                    "last_id": self._items[count - 1].id if count else ""}
            tmp = f"{index_path}.tmp.{os.getpid()}"
            faiss.write_index(self._index, tmp)
            os.replace(tmp, index_path)
            _atomic_write(meta_path, json.dumps(meta).encode(), sync=False)

    def _cached_hnsw(self, m: int) -> Any | None:
        """The saved HNSW index if it matches the items just loaded from the journal, else None."""
        index_path, meta_path = self._hnsw_cache_paths(m)
        try:
            with open(meta_path, "rb") as f:
                meta = json.loads(f.read())
            count = int(meta["count"])
            if (meta["embedder"] != self.manifest["embedder"] or count > len(self._items)
                    or (count and (self._items[0].id != meta["first_id"]
                                   or self._items[count - 1].id != meta["last_id"]))):
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
