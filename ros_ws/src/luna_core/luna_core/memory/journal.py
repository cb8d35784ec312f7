"""Append-only, crash-safe record journal (JSON lines with length + CRC32 framing).

One record per line::

    <payload length, 8 hex digits> <CRC32 of the payload, 8 hex digits> <JSON payload>\\n

The payload is compact JSON (``json.dumps`` escapes control characters, so it never holds a raw
newline). An append is a single ``write`` of the whole line on an ``O_APPEND`` descriptor followed by
``fsync``: once :meth:`Journal.append` returns, the record survives ``kill -9`` and, on a file system
that honours fsync, power loss.

Reading validates every line (length, checksum, JSON). Damage falls in three classes:

- A *torn append*: the bytes after the last newline, when they are no longer than a record their
  length prefix declares (a write cut short stops before its newline, the last byte of the line, so
  it never holds one). The writer that crashed never acknowledged it. Readers stop before it (it may
  be an append in progress) and the next writer truncates it with a warning. A tail of NUL bytes
  only (a file system that grew the file before a power loss wrote its data) counts as torn too.
- A *corrupt record inside the file*: a bad complete line followed by good ones. It is skipped with a
  warning naming its offset and record number, and the rest is kept (the bytes stay in the file).
- A *corrupt final record*: a bad line after the last good one that is complete (it ends with its
  newline), or a newline-less tail longer than its length prefix declares. Neither can be an
  unfinished append of this writer, so it is an acknowledged record damaged after it was written.
  Readers skip it with a warning; :class:`Journal` (the writer) refuses to open with
  :class:`JournalCorruptionError` instead of truncating it, so that no acknowledged record is
  destroyed by a later open (see :meth:`Journal.__init__` for why it does not append after it).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_HEADER = 18  # "llllllll cccccccc "
MAX_RECORD_BYTES = 64 * 1024 * 1024


class JournalWarning(UserWarning):
    """Damage in a journal: a torn final record dropped, a corrupt record skipped or lost records."""


@dataclass(frozen=True)
class BadRecord:
    """A line of the journal that is not a valid record."""

    offset: int  # byte offset of its first byte in the file
    number: int  # its record number: the line number in the file, from 1
    reason: str  # what is wrong with it

    def describe(self) -> str:
        return f"record #{self.number} at byte {self.offset} ({self.reason})"


class JournalCorruptionError(Exception):
    """The final record of a journal is complete but damaged, and a writer was asked to open it.

    The record was acknowledged (it was written whole), so the writer refuses to truncate it.
    """

    def __init__(self, path: str, bad: BadRecord, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.offset = bad.offset
        self.number = bad.number
        self.reason = bad.reason


@dataclass
class ScanResult:
    records: list[dict[str, Any]]
    end: int  # offset just after the last valid record
    torn_tail: int = 0  # bytes of an unfinished final append after ``end`` (0 if none)
    skipped: list[BadRecord] = field(default_factory=list)  # corrupt records with good ones after them
    corrupt_tail: list[BadRecord] = field(default_factory=list)  # complete bad records after ``end``
    positions: list[tuple[int, int]] = field(default_factory=list)  # (offset, number) of each record
    next_number: int = 1  # record number of the first line after ``end``
    crc: int = 0  # CRC32 of the bytes up to ``end``, continuing the ``crc`` given to :func:`scan`


def encode_record(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_RECORD_BYTES:
        raise ValueError(f"journal record of {len(body)} bytes exceeds {MAX_RECORD_BYTES}")
    return b"%08x %08x " % (len(body), zlib.crc32(body)) + body + b"\n"


def _parse_header(line: bytes) -> int | None:
    """The payload length a line's header declares, or None if it has no well-formed header."""
    if len(line) < _HEADER or line[8:9] != b" " or line[17:18] != b" ":
        return None
    try:
        int(line[9:17], 16)
        return int(line[0:8], 16)
    except ValueError:
        return None


def _decode_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The payload of a complete line (without its newline), or None and why it is not valid."""
    length = _parse_header(line)
    if length is None:
        return None, "no valid '<length> <crc32> ' header"
    body = line[_HEADER:]
    if len(body) != length:
        return None, f"length prefix says {length} bytes, the line holds {len(body)}"
    if zlib.crc32(body) != int(line[9:17], 16):
        return None, "checksum mismatch"
    try:
        payload = json.loads(body)
    except ValueError:
        return None, "checksum matches but the payload is not JSON"
    if not isinstance(payload, dict):
        return None, "the payload is not a JSON object"
    return payload, ""


def _tail_is_torn(tail: bytes) -> bool:
    """Whether the newline-less bytes at the end of the file can be an unfinished append.

    A write cut short leaves a prefix of whole lines, so the bytes after the last newline are a
    prefix of one record: at most header + declared length (its newline is the missing last byte).
    """
    if tail.count(0) == len(tail):
        return True  # zero-filled block of a file grown before its data reached the disk
    if len(tail) < _HEADER:
        return True  # part of a header; the shortest complete record is 21 bytes
    length = _parse_header(tail)
    return length is not None and len(tail) <= _HEADER + length


def scan(path: str | os.PathLike[str], start: int = 0, first_number: int = 1, crc: int = 0) -> ScanResult:
    """Read the valid records from byte offset ``start`` on; never modifies the file.

    ``first_number`` is the record number of the line at ``start`` (records are numbered from 1, one
    per line), so that a reader following the file names records as the whole file counts them.
    ``crc`` is the CRC32 of the bytes before ``start``: the result's ``crc`` then covers the file up
    to its ``end`` (the memory bank checks its embeddings side file against it).
    """
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    records: list[dict[str, Any]] = []
    positions: list[tuple[int, int]] = []
    skipped: list[BadRecord] = []
    pending_bad: list[BadRecord] = []  # bad lines not yet known to be inside the file
    pos = 0
    end = 0
    number = first_number
    next_number = first_number
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # newline-less final bytes, classified below
        payload, reason = _decode_line(data[pos:nl])
        if payload is None:
            pending_bad.append(BadRecord(start + pos, number, reason))
        else:
            skipped += pending_bad
            pending_bad = []
            records.append(payload)
            positions.append((start + pos, number))
            end = nl + 1
            next_number = number + 1
        pos = nl + 1
        number += 1
    torn = _classify_tail(data[pos:], start + pos, number, pending_bad)
    if pending_bad:
        torn = 0  # the torn bytes lie after a damaged record: truncating to ``end`` would remove it
    return ScanResult(records, start + end, torn, skipped, pending_bad, positions, next_number,
                      zlib.crc32(memoryview(data)[:end], crc))


def _classify_tail(tail: bytes, offset: int, number: int, pending_bad: list[BadRecord]) -> int:
    """Bytes after the last newline: their length if they are a torn append, else 0 with the damaged
    record appended to ``pending_bad``."""
    if not tail:
        return 0
    if _tail_is_torn(tail):
        return len(tail)
    length = _parse_header(tail)
    pending_bad.append(BadRecord(
        offset, number,
        "no valid header and no terminating newline" if length is None else
        f"no terminating newline, yet longer than the {length} bytes its length prefix declares"))
    return 0


def scan_tail(path: str | os.PathLike[str]) -> ScanResult:
    """What :func:`scan` says about the end of the file, without parsing the records before it.

    Walks the complete lines backwards from the end to the last valid record: ``end``, ``torn_tail``,
    ``corrupt_tail`` and ``next_number`` are those of ``scan(path)``; ``records``, ``positions`` and
    ``skipped`` are left empty (corrupt records inside the file are reported by whoever loads them).
    The writer's open needs only this, and parsing every record of a 100k-item journal costs seconds.
    """
    with open(path, "rb") as f:
        data = f.read()
    last_nl = data.rfind(b"\n")
    lines = data.count(b"\n")  # complete lines; the last one has record number ``lines``
    pending_bad: list[BadRecord] = []
    end = 0
    next_number = 1
    line_end, number = last_nl, lines
    while line_end >= 0:
        line_start = data.rfind(b"\n", 0, line_end) + 1
        payload, reason = _decode_line(data[line_start:line_end])
        if payload is not None:
            end, next_number = line_end + 1, number + 1
            break
        pending_bad.insert(0, BadRecord(line_start, number, reason))
        line_end, number = line_start - 1, number - 1
    torn = _classify_tail(data[last_nl + 1:], last_nl + 1, lines + 1, pending_bad)
    if pending_bad:
        torn = 0
    return ScanResult([], end, torn, [], pending_bad, [], next_number)


class Journal:
    """The writer's handle: recovers the file on open, then appends durably."""

    def __init__(self, path: str | os.PathLike[str], full_scan: bool = True) -> None:
        """Open ``path`` for appending, after truncating a torn final append (with a warning).

        With ``full_scan`` False only the end of the file is checked (:func:`scan_tail`) and
        ``recovered.records`` stays empty: for owners that load the records themselves (the memory bank).

        A damaged *final* record that was complete when written raises :class:`JournalCorruptionError`
        and leaves the file as it is. Truncating would destroy an acknowledged record. Appending after
        it would keep its bytes but bury it as a skipped record, with every later append built on a
        file nobody has looked at (and, in the memory bank, the damaged record's sequence number,
        which cannot be read, handed to the next item). Stopping is the safer choice: the bytes stay,
        readers still load every record before it, and a person decides (restore the file from a
        backup, or truncate it at the offset the error names).
        """
        self.path = os.fspath(path)
        # corrupt records inside the file are reported by whoever loads them
        result = scan(self.path) if full_scan else scan_tail(self.path)
        if result.corrupt_tail:
            first = result.corrupt_tail[0]
            raise JournalCorruptionError(self.path, first, (
                f"journal {self.path}: the final record is corrupt: {first.describe()}"
                + (f" and {len(result.corrupt_tail) - 1} more bad line(s) after it"
                   if len(result.corrupt_tail) > 1 else "")
                + ". It was complete when written, so it is an acknowledged record damaged since, not an "
                f"unfinished append; refusing to open the journal for writing, which would remove or bury "
                f"it ({len(result.records)} valid records before it; read-only opens still load them). "
                f"To recover: restore {self.path} from a backup; or, to give the damaged record up, keep a "
                f"copy and truncate the file to byte {first.offset} (truncate -s {first.offset} "
                f"{self.path}), then open it again."))
        if result.torn_tail:
            warn(f"memory journal {self.path}: dropped a torn final record of {result.torn_tail} bytes "
                  f"at byte {result.end} (an append that was never acknowledged)")
            with open(self.path, "r+b") as f:
                f.truncate(result.end)
                f.flush()
                os.fsync(f.fileno())
        self.recovered = result
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = result.end
        self.crc: int | None = result.crc if full_scan else None  # CRC32 of the file up to ``size``, if known
        self.last_offsets: list[int] = []  # byte offsets of the records of the last append_many

    def append(self, payload: dict[str, Any]) -> int:
        """Write one record and fsync it; returns the file size after the record."""
        return self.append_many([payload])

    def append_many(self, payloads: list[dict[str, Any]]) -> int:
        """Write records with one ``write`` and one ``fsync``; returns the file size after them."""
        lines = [encode_record(p) for p in payloads]
        data = b"".join(lines)
        offsets, at = [], self.size
        for line in lines:
            offsets.append(at)
            at += len(line)
        written = 0
        while written < len(data):  # os.write may be partial (signals, quotas)
            written += os.write(self._fd, data[written:])
        os.fsync(self._fd)
        self.size += len(data)
        self.last_offsets = offsets
        if self.crc is not None:
            self.crc = zlib.crc32(data, self.crc)
        return self.size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def warn(message: str) -> None:
    """Log and raise a :class:`JournalWarning` (tests and callers can catch it)."""
    logger.warning(message)
    warnings.warn(message, JournalWarning, stacklevel=3)
