"""Writing self-describing rosbag2 bags (MCAP or sqlite3) with rosbags, flushed periodically.

Every topic is added with its full message definition and RIHS01 hash (from ``MessageTypes``), so
Foxglove and ``ros2 bag`` on a full ROS install open the bag without the interface packages.
rosbags keeps an MCAP chunk (up to 1 MiB) in memory and commits sqlite3 only on close; ``flush()``
closes the pending chunk / commits, so a recorder killed hard loses at most one flush period.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from rosbags.interfaces import Connection, Qos
from rosbags.rosbag2 import StoragePlugin, Writer

from .msgtypes import MessageTypes, UnknownMessageType

STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
_SUFFIX_STORAGE = {".mcap": "mcap", ".db3": "sqlite3"}


class BagExistsError(FileExistsError):
    """The output bag exists already; bags are never overwritten."""


def resolve_output(output: str | None, storage: str | None) -> tuple[Path, str]:
    """The bag directory and storage for ``-o``: ``out.mcap`` means directory ``out`` with MCAP storage.

    Without ``-o`` the name follows ``ros2 bag``: ``rosbag2_YYYY_MM_DD-HH_MM_SS``; storage defaults to MCAP.
    """
    if not output:
        path = Path(datetime.now().strftime("rosbag2_%Y_%m_%d-%H_%M_%S"))
    else:
        path = Path(output)
        suffix_storage = _SUFFIX_STORAGE.get(path.suffix)
        if suffix_storage is not None:
            if storage is not None and storage != suffix_storage:
                raise ValueError(f"-o {output} names {suffix_storage} storage but --storage is {storage}")
            storage = suffix_storage
            path = path.with_suffix("")
    storage = storage or "mcap"
    if storage not in STORAGES:
        raise ValueError(f"unknown storage {storage!r}; choose one of {', '.join(STORAGES)}")
    if path.exists():
        raise BagExistsError(f"{path} exists already; choose another output (bags are never overwritten)")
    return path, storage


class BagWriter:
    """A rosbag2 bag being written: ``add_topic`` then ``write``; ``close`` finalises it."""

    def __init__(self, path: Path, storage: str = "mcap", types: MessageTypes | None = None) -> None:
        if path.exists():
            raise BagExistsError(f"{path} exists already; bags are never overwritten")
        self.path = path
        self.types = types or MessageTypes()
        self._writer = Writer(path, version=Writer.VERSION_LATEST, storage_plugin=STORAGES[storage])
        self._writer.open()
        self._connections: dict[str, Connection] = {}
        self.counts: dict[str, int] = {}

    def add_topic(self, topic: str, msgtype: str, offered_qos: Sequence[Qos] = (), type_hash: str = "",
                  definition: str | None = None) -> bool:
        """Register a topic; False (with the definition left empty) if no definition of its type is known.

        ``definition`` (the concatenated .msg text) with ``type_hash`` overrides the lookup, for types
        known only from elsewhere (another bag). Without any definition the bag still records the bytes
        and the type hash from the graph, so a full ROS install with the interface package can play it.
        """
        complete = True
        if definition is not None:
            msgdef, rihs01 = definition, type_hash
        else:
            try:
                msgdef, rihs01 = self.types.definition(msgtype)
            except UnknownMessageType:
                msgdef, rihs01, complete = "", type_hash, False
        self._connections[topic] = self._writer.add_connection(
            topic, msgtype, msgdef=msgdef, rihs01=rihs01 or "RIHS01_" + "0" * 64,
            offered_qos_profiles=list(offered_qos))
        self.counts[topic] = 0
        return complete

    def has_topic(self, topic: str) -> bool:
        return topic in self._connections

    def write(self, topic: str, timestamp_ns: int, data: bytes | memoryview) -> None:
        self._writer.write(self._connections[topic], timestamp_ns, data)
        self.counts[topic] += 1

    def flush(self) -> None:
        """Push buffered messages to disk (rosbags internals, pinned version: see requirements/lock.txt)."""
        storage = self._writer.storage
        if storage is None:
            return
        if hasattr(storage, "close_chunk"):
            if not storage.chunk.msgs:  # no empty chunks: definitions wait for the next message
                return
            storage.close_chunk()
            storage.bio.flush()
            os.fsync(storage.bio.fileno())
        elif hasattr(storage, "conn"):
            storage.conn.commit()

    def close(self) -> None:
        if self._writer.storage is not None:
            self._writer.close()

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
