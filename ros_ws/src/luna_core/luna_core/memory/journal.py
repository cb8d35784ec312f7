"""Append-only, crash-safe record journal (JSON lines with length + CRC32 framing).

One record per line::

    <payload length, 8 hex digits> <CRC32 of the payload, 8 hex digits> <JSON payload>\\n

The payload is compact JSON (``json.dumps`` escapes control characters, so it never holds a raw
newline). An append is a single ``write`` of the whole line on an ``O_APPEND`` descriptor followed by
``fsync``: once :meth:`Journal.append` returns, the record survives ``kill -9`` and, on a file system
that honours fsync, power loss.

Reading validates every line (length, checksum, JSON). A bad *final* line is a torn append: the writer
that crashed never acknowledged it. Readers stop before it (it may be an append in progress) and the
next writer truncates it with a warning. A bad line *followed by good ones* is corruption inside the
file: it is skipped with a warning naming its offset and the rest is kept (the bytes stay in the file).
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
    """Recovered damage in a journal: a torn final record or a corrupt record skipped."""


@dataclass
class ScanResult:
    records: list[dict[str, Any]]
    end: int  # offset just after the last valid record
    torn_tail: int = 0  # bytes after ``end`` that do not (yet) form a valid record
    skipped: list[int] = field(default_factory=list)  # offsets of corrupt records skipped


def encode_record(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_RECORD_BYTES:
        raise ValueError(f"journal record of {len(body)} bytes exceeds {MAX_RECORD_BYTES}")
    return b"%08x %08x " % (len(body), zlib.crc32(body)) + body + b"\n"


def _decode_line(line: bytes) -> dict[str, Any] | None:
    """The payload of a complete line (without its newline), or None if the line is not valid."""
    if len(line) < _HEADER or line[8:9] != b" " or line[17:18] != b" ":
        return None
    try:
        length = int(line[0:8], 16)
        crc = int(line[9:17], 16)
    except ValueError:
        return None
    body = line[_HEADER:]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def scan(path: str | os.PathLike[str], start: int = 0) -> ScanResult:
    """Read the valid records from byte offset ``start`` on; never modifies the file."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    pos = 0
    end = 0
    pending_bad: int | None = None  # offset of a bad line not yet known to be inside the file
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # incomplete final line
        payload = _decode_line(data[pos:nl])
        if payload is None:
            if pending_bad is None:
                pending_bad = pos
        else:
            if pending_bad is not None:
                skipped.append(start + pending_bad)
                pending_bad = None
            records.append(payload)
            end = nl + 1
        pos = nl + 1
    # Whatever follows the last good record (bad lines with nothing good after them, an incomplete
    # line) is the torn tail.
    return ScanResult(records, start + end, len(data) - end, skipped)


class Journal:
    """The writer's handle: recovers the file on open, then appends durably."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        result = scan(self.path)  # corrupt records inside the file are reported by whoever loads them
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

    def append(self, payload: dict[str, Any]) -> int:
        """Write one record and fsync it; returns the file size after the record."""
        return self.append_many([payload])

    def append_many(self, payloads: list[dict[str, Any]]) -> int:
        """Write records with one ``write`` and one ``fsync``; returns the file size after them."""
        data = b"".join(encode_record(p) for p in payloads)
        written = 0
        while written < len(data):  # os.write may be partial (signals, quotas)
            written += os.write(self._fd, data[written:])
        os.fsync(self._fd)
        self.size += len(data)
        return self.size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def warn(message: str) -> None:
    """Log and raise a :class:`JournalWarning` (tests and callers can catch it)."""
    logger.warning(message)
    warnings.warn(message, JournalWarning, stacklevel=3)
