"""Read rosbag2 bags (MCAP or sqlite3, as a directory or a single storage file) and salvage damaged ones.

Field bags get damaged: a recorder killed before it finalised the file (no summary, no footer, no
``metadata.yaml``, a half-written chunk), a flipped block on disk, a clock that stepped back. Instead of
failing on the first inconsistency, the MCAP reader here walks the data section record by record:

- a truncated file yields every complete record before the cut (including the complete records of a
  partially written uncompressed chunk);
- a chunk that does not decompress, fails its CRC or holds malformed records is reported and skipped
  after its last good record, and reading continues with the next chunk;
- messages are yielded in receive-time order whatever their order in the file; how many were out of
  order is reported.

Every such finding is a ``BagIssue`` (kind, where, what), so callers can tell the user precisely what was
lost. sqlite3 storage is read row by row up to the first unreadable page.
"""

from __future__ import annotations

import heapq
import itertools
import shutil
import sqlite3
import struct
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rosbags.interfaces import MessageDefinition, MessageDefinitionFormat, Qos
from rosbags.rosbag2.errors import ReaderError
from rosbags.rosbag2.metadata import parse_qos

try:  # Python < 3.14 (rosbags depends on the backport)
    from backports import zstd
except ImportError:  # pragma: no cover
    from compression import zstd  # type: ignore[no-redef]
import lz4.frame

MCAP_MAGIC = b"\x89MCAP0\r\n"
_OP_FOOTER, _OP_SCHEMA, _OP_CHANNEL, _OP_MESSAGE, _OP_CHUNK, _OP_DATA_END = 0x02, 0x03, 0x04, 0x05, 0x06, 0x0F
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_MESSAGE_HEAD = struct.Struct("<HIQQ")  # channel id, sequence, log time, publish time
_CHUNK_HEAD = struct.Struct("<QQQI")  # start, end, uncompressed size, uncompressed CRC
_SCHEMA_FORMATS = {"ros2msg": MessageDefinitionFormat.MSG, "ros2idl": MessageDefinitionFormat.IDL,
                   "omgidl": MessageDefinitionFormat.IDL}


class BagError(Exception):
    """The bag cannot be read at all (missing, not a rosbag2, no readable storage file)."""


@dataclass(frozen=True)
class BagIssue:
    """Something wrong with a bag that reading worked around. ``kind`` is one of:
    truncated, corrupt_chunk, metadata, non_monotonic, unknown_type, undecodable, storage."""

    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.detail}"


@dataclass
class BagTopic:
    name: str
    msgtype: str
    msgdef: MessageDefinition
    offered_qos: list[Qos] = field(default_factory=list)
    digest: str = ""
    count: int = 0  # readable messages


@dataclass(frozen=True)
class BagMessage:
    topic: str
    timestamp: int  # receive time, ns
    data: bytes


# --------------------------------------------------------------------------------------------------
# MCAP
# --------------------------------------------------------------------------------------------------


def _parse_qos(profiles: object, where: str, issues: list[BagIssue]) -> list[Qos]:
    """Recorded QoS profiles; unreadable ones become an issue (playback then offers the default)."""
    if not profiles:
        return []
    try:
        return parse_qos(profiles)
    except (ReaderError, KeyError, TypeError, ValueError, AttributeError) as err:
        issues.append(BagIssue("metadata", where, f"offered QoS profiles unreadable ({type(err).__name__}: "
                               f"{err}); playback offers reliable volatile"))
        return []


class _Damage(Exception):
    """A malformed record at ``offset`` (relative to the buffer being parsed); ``cut``: the buffer ends
    inside it (expected at the end of a partially written chunk)."""

    def __init__(self, offset: int, reason: str, cut: bool = False) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.cut = cut


def _string(buf: memoryview, pos: int) -> tuple[str, int]:
    (n,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + n
    if end > len(buf):
        raise struct.error("string runs past its record")
    return bytes(buf[pos + 4:end]).decode("utf-8"), end


def _records(buf: memoryview) -> Iterator[tuple[int, int, memoryview]]:
    """(record offset, opcode, content) for each complete record; raise _Damage where one is malformed."""
    pos, size = 0, len(buf)
    while pos < size:
        if pos + 9 > size:
            raise _Damage(pos, f"record header cut short ({size - pos} of 9 bytes)", cut=True)
        op = buf[pos]
        (length,) = _U64.unpack_from(buf, pos + 1)
        if pos + 9 + length > size:
            raise _Damage(pos, f"record (opcode 0x{op:02x}) claims {length} bytes, only {size - pos - 9} "
                          "left", cut=True)
        yield pos, op, buf[pos + 9:pos + 9 + length]
        pos += 9 + length


_KNOWN_OPS = frozenset(range(0x01, 0x11))  # MCAP v0 opcodes
_COMPRESSIONS = (b"", b"lz4", b"zstd")


def _is_chunk_at(buf: bytes, i: int, pos: int, size: int) -> bool:
    """Whether ``buf[i:]`` (file offset ``pos``) starts a plausible chunk record: every length field
    consistent with the others and with the file, a known compression."""
    if len(buf) - i < 9 + 28 + 4 or buf[i] != _OP_CHUNK:
        return False
    (length,) = _U64.unpack_from(buf, i + 1)
    start, end, usize, _ = _CHUNK_HEAD.unpack_from(buf, i + 9)
    (clen,) = _U32.unpack_from(buf, i + 9 + 28)
    if clen > 4 or pos + 9 + length > size or start > end or usize > 1 << 34:
        return False
    k = i + 9 + 28 + 4
    if len(buf) - k < clen + 8 or bytes(buf[k:k + clen]) not in _COMPRESSIONS:
        return False
    (csize,) = _U64.unpack_from(buf, k + clen)
    return csize == length - (28 + 4 + clen + 8)


def _next_chunk(f, start: int, size: int, block: int = 1 << 20) -> int | None:
    """File offset of the next plausible chunk record at or after ``start``, or None."""
    pos = start
    while pos < size:
        f.seek(pos)
        buf = f.read(block + 64)  # the overlap lets a header straddle two blocks
        i = buf.find(bytes([_OP_CHUNK]))
        while 0 <= i < block:
            if _is_chunk_at(buf, i, pos + i, size):
                return pos + i
            i = buf.find(bytes([_OP_CHUNK]), i + 1)
        pos += block
    return None


@dataclass
class _Channel:
    topic: str
    schema_id: int
    encoding: str
    metadata: dict[str, str]


@dataclass
class _ChunkRef:
    offset: int  # file offset of the chunk record's content
    length: int  # bytes of content available (less than declared if the file is cut inside it)
    partial: bool  # the file ends inside this chunk
    good_records: int = 0  # records before the first damage (all of them if undamaged)
    start: int = 2**63 - 1  # receive-time range of its good messages (ns)
    end: int = 0


class McapStorage:
    """One MCAP file, scanned once for schemas, channels and chunk ranges; messages read lazily.

    Memory stays bounded by one chunk: the scan reads record headers and seeks past what it need not parse.
    """

    def __init__(self, path: Path, issues: list[BagIssue]) -> None:
        self.path = path
        self.issues = issues
        self.schemas: dict[int, tuple[str, str, str]] = {}  # id -> (name, encoding, data)
        self.channels: dict[int, _Channel] = {}
        self.counts: dict[int, int] = {}
        self.chunks: list[_ChunkRef] = []
        self.loose: list[tuple[int, int, int]] = []  # (log time, file offset of content, length)
        self.out_of_order = 0
        self.largest_step_back = 0
        self._latest = 0
        self._scan()

    # -- scanning ----------------------------------------------------------------------------------

    def _scan(self) -> None:
        size = self.path.stat().st_size
        with self.path.open("rb") as f:
            if f.read(8) != MCAP_MAGIC:
                raise BagError(f"{self.path}: not an MCAP file (bad magic bytes at offset 0)")
            pos = 8
            while pos < size:
                f.seek(pos)
                head = f.read(9)
                if len(head) < 9:
                    self._issue("truncated", pos, "the file ends inside a record header; the recording "
                                "was probably not finalised")
                    break
                op = head[0]
                (length,) = _U64.unpack_from(head, 1)
                if op in (_OP_FOOTER, _OP_DATA_END):
                    break
                available = min(length, size - pos - 9)
                if op not in _KNOWN_OPS or available < length:
                    # Either the file ends inside this record, or its header is damaged: a later chunk
                    # that parses tells the two apart.
                    resume = _next_chunk(f, pos + 1, size)
                    if resume is not None:
                        self._issue("corrupt_chunk", pos, f"damaged record header (opcode 0x{op:02x}, length "
                                    f"{length}); bytes {pos}..{resume} skipped, reading resumed at the next chunk")
                        pos = resume
                        continue
                    what = "a chunk" if op == _OP_CHUNK else f"a record (opcode 0x{op:02x})"
                    self._issue("truncated", pos, f"the file ends inside {what} ({available} of {length} "
                                f"bytes, file size {size}); the recording was probably not finalised")
                    if op == _OP_CHUNK:
                        f.seek(pos + 9)
                        self._scan_chunk(pos + 9, memoryview(f.read(available)), partial=True)
                    break
                if op in (_OP_CHUNK, _OP_SCHEMA, _OP_CHANNEL, _OP_MESSAGE):
                    content = memoryview(f.read(length))
                    if op == _OP_CHUNK:
                        self._scan_chunk(pos + 9, content, partial=False)
                    else:
                        try:
                            self._top_level(op, content, pos + 9)
                        except (_Damage, struct.error, UnicodeDecodeError) as err:
                            self._issue("corrupt_chunk", pos, f"malformed record (opcode 0x{op:02x}) "
                                        f"skipped: {err}")
                # Other records (indexes, attachments, metadata) are not needed for playback.
                pos += 9 + length

    def _top_level(self, op: int, content: memoryview, file_offset: int) -> None:
        if op == _OP_MESSAGE:
            channel_id, _, log_time, _ = self._message_head(content)
            self.loose.append((log_time, file_offset, len(content)))
            self._count(channel_id, log_time)
        else:
            self._definition(op, content)

    def _definition(self, op: int, content: memoryview) -> None:
        if op == _OP_SCHEMA:
            (sid,) = _U16.unpack_from(content, 0)
            name, pos = _string(content, 2)
            encoding, pos = _string(content, pos)
            (n,) = _U32.unpack_from(content, pos)
            self.schemas[sid] = (name, encoding, bytes(content[pos + 4:pos + 4 + n]).decode("utf-8"))
        elif op == _OP_CHANNEL:
            cid, schema_id = struct.unpack_from("<HH", content, 0)
            topic, pos = _string(content, 4)
            encoding, pos = _string(content, pos)
            (map_len,) = _U32.unpack_from(content, pos)
            pos += 4
            meta: dict[str, str] = {}
            end = pos + map_len
            while pos < end:
                key, pos = _string(content, pos)
                meta[key], pos = _string(content, pos)
            self.channels[cid] = _Channel(topic, schema_id, encoding, meta)
            self.counts.setdefault(cid, 0)

    def _message_head(self, content: memoryview) -> tuple[int, int, int, int]:
        if len(content) < _MESSAGE_HEAD.size:
            raise _Damage(0, f"message record of {len(content)} bytes is shorter than its header")
        channel_id, seq, log_time, publish_time = _MESSAGE_HEAD.unpack_from(content, 0)
        if channel_id not in self.channels:
            raise _Damage(0, f"message on channel {channel_id}, which was never defined")
        return channel_id, seq, log_time, publish_time

    def _count(self, channel_id: int, log_time: int) -> None:
        self.counts[channel_id] = self.counts.get(channel_id, 0) + 1
        if log_time < self._latest:
            self.out_of_order += 1
            self.largest_step_back = max(self.largest_step_back, self._latest - log_time)
        self._latest = max(self._latest, log_time)

    def _decompress(self, content: memoryview, partial: bool) -> memoryview:
        start, end, usize, crc = _CHUNK_HEAD.unpack_from(content, 0)
        compression, pos = _string(content, _CHUNK_HEAD.size)
        (csize,) = _U64.unpack_from(content, pos)
        payload = content[pos + 8:pos + 8 + csize]
        if partial:
            if compression:
                raise _Damage(0, f"{compression}-compressed chunk cut short; nothing in it can be read")
            return payload  # complete records of the partial chunk remain readable
        if len(payload) != csize:
            raise _Damage(0, "compressed data runs past the chunk record")
        if compression == "":
            raw = bytes(payload)
        elif compression == "zstd":
            raw = zstd.decompress(bytes(payload))
        elif compression == "lz4":
            raw = lz4.frame.decompress(bytes(payload))
        else:
            raise _Damage(0, f"unsupported chunk compression {compression!r}")
        if len(raw) != usize:
            raise _Damage(0, f"chunk decompresses to {len(raw)} bytes, header says {usize}")
        if crc and zlib.crc32(raw) != crc:
            raise _Damage(0, "chunk CRC mismatch")
        return memoryview(raw)

    def _scan_chunk(self, file_offset: int, content: memoryview, partial: bool) -> None:
        ref = _ChunkRef(file_offset, len(content), partial)
        try:
            buf = self._decompress(content, partial)
        except (_Damage, struct.error, UnicodeDecodeError, zstd.ZstdError, RuntimeError) as err:
            self._issue("corrupt_chunk", file_offset, f"chunk skipped: {err}")
            return
        try:
            for _, op, rec in _records(buf):
                if op == _OP_MESSAGE:
                    channel_id, _, log_time, _ = self._message_head(rec)
                    self._count(channel_id, log_time)
                    ref.start, ref.end = min(ref.start, log_time), max(ref.end, log_time)
                else:
                    self._definition(op, rec)
                ref.good_records += 1
        except (_Damage, struct.error, UnicodeDecodeError) as err:
            if not (partial and isinstance(err, _Damage) and err.cut):
                self._issue("corrupt_chunk", file_offset, f"damaged after {ref.good_records} good records "
                            f"({err}); the rest of the chunk is skipped")
        self.chunks.append(ref)

    def _issue(self, kind: str, offset: int, detail: str) -> None:
        self.issues.append(BagIssue(kind, f"{self.path.name} @ byte {offset}", detail))

    # -- reading -----------------------------------------------------------------------------------

    def messages(self, channel_ids: set[int], start: int, stop: int) -> Iterator[tuple[int, int, bytes]]:
        """(channel id, log time, data) in log-time order over every readable message."""
        sources: list[Iterator[tuple[int, int, int, bytes]]] = []
        wanted = [c for c in self.chunks if c.good_records and c.end >= start and c.start < stop]
        with self.path.open("rb") as f:
            for ref in wanted:
                sources.append(self._chunk_messages(f, ref, channel_ids, start, stop))
            if self.loose:
                sources.append(self._loose_messages(f, channel_ids, start, stop))
            for log_time, _, channel_id, data in heapq.merge(*sources):
                if channel_id >= 0:
                    yield channel_id, log_time, data

    def _chunk_messages(self, f, ref: _ChunkRef, channel_ids: set[int], start: int,
                        stop: int) -> Iterator[tuple[int, int, int, bytes]]:
        # A sentinel at the chunk's start time: heapq.merge only decompresses a chunk when its turn comes.
        yield ref.start, 0, -1, b""
        f.seek(ref.offset)
        content = memoryview(f.read(ref.length))
        buf = self._decompress(content, ref.partial)
        found: list[tuple[int, int, int, bytes]] = []
        for pos, op, rec in itertools.islice(_records(buf), ref.good_records):
            if op != _OP_MESSAGE:
                continue
            channel_id, _, log_time, _ = _MESSAGE_HEAD.unpack_from(rec, 0)
            if channel_id in channel_ids and start <= log_time < stop:
                found.append((log_time, pos + 1, channel_id, bytes(rec[_MESSAGE_HEAD.size:])))
        found.sort()
        yield from found

    def _loose_messages(self, f, channel_ids: set[int], start: int,
                        stop: int) -> Iterator[tuple[int, int, int, bytes]]:
        for log_time, offset, length in sorted(self.loose):
            if not start <= log_time < stop:
                continue
            f.seek(offset)
            rec = f.read(length)
            (channel_id,) = _U16.unpack_from(rec, 0)
            if channel_id in channel_ids:
                yield log_time, offset, channel_id, rec[_MESSAGE_HEAD.size:]

    def time_range(self) -> tuple[int, int]:
        times = [t for ref in self.chunks if ref.good_records and ref.start <= ref.end for t in (ref.start, ref.end)]
        times += [log_time for log_time, _, _ in self.loose]
        return (min(times), max(times)) if times else (2**63 - 1, 0)

    def close(self) -> None:
        """Nothing stays open between reads."""

    def topics(self) -> dict[int, BagTopic]:
        out: dict[int, BagTopic] = {}
        for cid, ch in self.channels.items():
            name, encoding, text = self.schemas.get(ch.schema_id, ("", "", ""))
            qos = _parse_qos(ch.metadata.get("offered_qos_profiles", ""), ch.topic, self.issues)
            msgdef = MessageDefinition(_SCHEMA_FORMATS.get(encoding, MessageDefinitionFormat.NONE), text)
            out[cid] = BagTopic(ch.topic, name, msgdef, qos, "", self.counts.get(cid, 0))
        return out


# --------------------------------------------------------------------------------------------------
# sqlite3
# --------------------------------------------------------------------------------------------------


class SqliteStorage:
    """One rosbag2 sqlite3 file, read with the sqlite3 module so a damaged file yields what it can.

    The scan reads rows in insertion order until the first unreadable page; an intact file is then
    read in timestamp order, a damaged one in insertion order (receive order for a recorder) up to the
    damage.
    """

    def __init__(self, path: Path, issues: list[BagIssue]) -> None:
        self.path = path
        self.issues = issues
        try:
            self.db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
            self._topics = self._read_topics()
        except sqlite3.Error as err:
            raise BagError(f"{path}: not a readable rosbag2 sqlite3 file ({err})") from err
        self.counts: dict[int, int] = {cid: 0 for cid in self._topics}
        self.first, self.last = 2**63 - 1, 0
        self.out_of_order = self.largest_step_back = 0
        self.readable_rows: int | None = None  # None: every row is readable
        self._scan()

    def _read_topics(self) -> dict[int, BagTopic]:
        cur = self.db.execute("SELECT * FROM topics")
        columns = [d[0] for d in cur.description]
        definitions: dict[str, MessageDefinition] = {}
        if self.db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='message_definitions'"
                           ).fetchone():
            for name, encoding, text in self.db.execute(
                    "SELECT topic_type, encoding, encoded_message_definition FROM message_definitions"):
                definitions[name] = MessageDefinition(
                    _SCHEMA_FORMATS.get(encoding, MessageDefinitionFormat.NONE), text or "")
        topics = {}
        for row in cur.fetchall():
            t = dict(zip(columns, row))
            qos = _parse_qos(t.get("offered_qos_profiles"), t["name"], self.issues)
            none = MessageDefinition(MessageDefinitionFormat.NONE, "")
            topics[t["id"]] = BagTopic(t["name"], t["type"], definitions.get(t["type"], none), qos,
                                       t.get("type_description_hash") or "")
        return topics

    def _scan(self) -> None:
        rows, latest = 0, 0
        try:
            for topic_id, timestamp in self.db.execute("SELECT topic_id, timestamp FROM messages ORDER BY id"):
                rows += 1
                if topic_id in self.counts:
                    self.counts[topic_id] += 1
                self.first, self.last = min(self.first, timestamp), max(self.last, timestamp)
                if timestamp < latest:
                    self.out_of_order += 1
                    self.largest_step_back = max(self.largest_step_back, latest - timestamp)
                latest = max(latest, timestamp)
        except sqlite3.DatabaseError as err:
            self.readable_rows = rows
            self.issues.append(BagIssue("truncated", str(self.path), f"database damaged after {rows} readable "
                                        f"messages ({err}); the recording was probably not finalised"))

    def topics(self) -> dict[int, BagTopic]:
        for cid, topic in self._topics.items():
            topic.count = self.counts.get(cid, 0)
        return self._topics

    def time_range(self) -> tuple[int, int]:
        return self.first, self.last

    def messages(self, channel_ids: set[int], start: int, stop: int) -> Iterator[tuple[int, int, bytes]]:
        if self.readable_rows is None:
            query = "SELECT topic_id, timestamp, data FROM messages ORDER BY timestamp, id"
        else:
            query = f"SELECT topic_id, timestamp, data FROM messages ORDER BY id LIMIT {self.readable_rows}"
        for topic_id, timestamp, data in self.db.execute(query):
            if topic_id in channel_ids and start <= timestamp < stop:
                yield topic_id, timestamp, bytes(data)

    def close(self) -> None:
        self.db.close()


# --------------------------------------------------------------------------------------------------
# The bag
# --------------------------------------------------------------------------------------------------


class BagReader:
    """A rosbag2 bag (directory with ``metadata.yaml``, a directory without it, or one storage file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.issues: list[BagIssue] = []
        self.topics: dict[str, BagTopic] = {}
        self._sources: list[tuple[McapStorage | SqliteStorage, dict[int, str]]] = []
        self._message_compression = False
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if not self.path.exists():
            raise BagError(f"{self.path}: no such bag (neither a directory nor a file)")
        files, metadata = self._storage_files()
        for file in files:
            self._open_storage(file)
        if not self._sources:
            raise BagError(f"{self.path}: no readable storage file; "
                           + "; ".join(str(i) for i in self.issues))
        self._merge_metadata_qos(metadata)

    # -- opening -----------------------------------------------------------------------------------

    def _storage_files(self) -> tuple[list[Path], dict]:
        if self.path.is_file():
            return [self.path], {}
        meta_path = self.path / "metadata.yaml"
        metadata: dict = {}
        if meta_path.is_file():
            try:
                metadata = (yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}).get(
                    "rosbag2_bagfile_information", {}) or {}
            except (yaml.YAMLError, OSError, AttributeError) as err:
                self.issues.append(BagIssue("metadata", str(meta_path), f"unreadable ({err}); "
                                            "reading the storage files directly"))
        else:
            self.issues.append(BagIssue("metadata", str(self.path), "metadata.yaml is missing (the "
                                        "recording was probably not finalised); reading the storage files "
                                        "directly"))
        listed = [self.path / Path(p).name for p in metadata.get("relative_file_paths", []) or []]
        files = [p for p in listed if p.is_file()]
        for missing in (p for p in listed if not p.is_file()):
            self.issues.append(BagIssue("storage", str(missing), "listed in metadata.yaml but missing"))
        if not files:
            files = sorted(p for p in self.path.iterdir()
                           if p.suffix in (".mcap", ".db3") or p.name.endswith((".mcap.zstd", ".db3.zstd")))
        if not files:
            raise BagError(f"{self.path}: no .mcap or .db3 storage file in this directory")
        mode = str(metadata.get("compression_mode", "") or "").lower()
        if mode == "message":
            self._message_compression = True
        return files, metadata

    def _open_storage(self, file: Path) -> None:
        if file.suffix == ".zstd":
            file = self._decompress_file(file)
            if file is None:
                return
        try:
            if file.suffix == ".mcap":
                storage: McapStorage | SqliteStorage = McapStorage(file, self.issues)
            elif file.suffix == ".db3":
                storage = SqliteStorage(file, self.issues)
            else:
                raise BagError(f"{file}: unknown storage format (expected .mcap or .db3)")
            topics = storage.topics()
        except OSError as err:
            self.issues.append(BagIssue("storage", str(file), f"cannot be read: {err}"))
            return
        except BagError as err:
            self.issues.append(BagIssue("storage", str(file), str(err)))
            return
        by_id: dict[int, str] = {}
        for cid, topic in topics.items():
            have = self.topics.get(topic.name)
            if have is None:
                self.topics[topic.name] = topic
            elif have.msgtype != topic.msgtype:
                self.issues.append(BagIssue("unknown_type", topic.name,
                                            f"recorded as both {have.msgtype} and {topic.msgtype}; "
                                            f"only {have.msgtype} is read"))
                continue
            else:
                have.count += topic.count
                if have.msgdef.format is MessageDefinitionFormat.NONE:
                    have.msgdef = topic.msgdef
            by_id[cid] = topic.name
        if storage.out_of_order:
            self.issues.append(BagIssue(
                "non_monotonic", str(file),
                f"{storage.out_of_order} messages are stored out of receive-time order (largest step back "
                f"{storage.largest_step_back / 1e9:.3f} s); they are played in time order"))
        self._sources.append((storage, by_id))

    def _decompress_file(self, file: Path) -> Path | None:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="luna-bag-")
        out = Path(self._tmp.name) / file.stem  # x.mcap.zstd -> x.mcap
        try:
            with file.open("rb") as src, zstd.open(src, "rb") as infile, out.open("wb") as dst:
                shutil.copyfileobj(infile, dst)
        except (OSError, zstd.ZstdError) as err:
            self.issues.append(BagIssue("storage", str(file), f"zstd file compression is damaged: {err}; "
                                        "the part before the damage is read"))
            if not out.exists() or out.stat().st_size == 0:
                return None
        return out

    def _merge_metadata_qos(self, metadata: dict) -> None:
        for entry in metadata.get("topics_with_message_count", []) or []:
            meta = entry.get("topic_metadata", {}) or {}
            topic = self.topics.get(meta.get("name", ""))
            if topic is None:
                continue
            if not topic.offered_qos:
                topic.offered_qos = _parse_qos(meta.get("offered_qos_profiles"), topic.name, self.issues)
            topic.digest = topic.digest or meta.get("type_description_hash", "") or ""

    # -- reading -----------------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        return sum(t.count for t in self.topics.values())

    def time_range(self) -> tuple[int, int]:
        """(first, last) receive time in ns over readable messages; (0, 0) for an empty bag."""
        ranges = [storage.time_range() for storage, _ in self._sources]
        first, last = min(r[0] for r in ranges), max(r[1] for r in ranges)
        return (first, last) if last >= first else (0, 0)

    def messages(self, topics: Iterable[str] | None = None, start_ns: int | None = None,
                 stop_ns: int | None = None) -> Iterator[BagMessage]:
        """Readable messages of ``topics`` (all by default) in receive-time order, within [start, stop)."""
        wanted = set(self.topics) if topics is None else set(topics) & set(self.topics)
        start = 0 if start_ns is None else start_ns
        stop = 2**63 - 1 if stop_ns is None else stop_ns
        streams = [self._stream(storage, by_id, wanted, start, stop) for storage, by_id in self._sources]
        for timestamp, topic, data in heapq.merge(*streams, key=lambda m: m[0]):
            if self._message_compression:
                try:
                    data = zstd.decompress(data)
                except zstd.ZstdError as err:
                    self.issues.append(BagIssue("undecodable", topic, f"message at {timestamp} ns does not "
                                                f"decompress ({err}); skipped"))
                    continue
            yield BagMessage(topic, timestamp, data)

    def _stream(self, storage: McapStorage | SqliteStorage, by_id: dict[int, str], wanted: set[str],
                start: int, stop: int) -> Iterator[tuple[int, str, bytes]]:
        ids = {cid for cid, name in by_id.items() if name in wanted}
        if ids:
            for cid, timestamp, data in storage.messages(ids, start, stop):
                yield timestamp, by_id[cid], data

    def close(self) -> None:
        for storage, _ in self._sources:
            storage.close()
        self._sources.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> BagReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
