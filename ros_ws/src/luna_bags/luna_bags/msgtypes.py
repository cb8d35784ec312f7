"""Message types for bags: full definitions (so bags are self-describing) and Python classes (raw pub/sub).

Definitions come from rosbags' built-in ROS 2 kilted store (standard types; kilted and jazzy share them),
then from ``.msg`` files of installed interface packages (``share/<pkg>/msg`` under ``AMENT_PREFIX_PATH``
and this interpreter's prefix, where the bootstrap installs ``luna_msgs``), then from the source tree
(``ros_ws/src/<pkg>/msg``), and last from the definitions a bag itself embeds. Type hashes (RIHS01)
computed by rosbags match rosidl's, so bags written with them open in ``ros2 bag`` and Foxglove.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

from rosbags.interfaces import MessageDefinition, MessageDefinitionFormat
from rosbags.typesys import Stores, TypesysError, get_typestore, get_types_from_idl, get_types_from_msg
from rosbags.typesys.store import Typestore

#: rosbags' store used as the base: the distribution the pip wheels provide.
BASE_STORE = Stores.ROS2_KILTED

#: ``ros_ws/src`` of this checkout (used when an interface package is not installed).
SOURCE_TREE = Path(__file__).resolve().parents[3]

_TYPENAME = re.compile(r"^([A-Za-z][\w]*)/(msg|srv|action)/([A-Za-z][\w]*)$")


class UnknownMessageType(LookupError):
    """A message type has no definition anywhere this process can see."""


def interface_search_dirs() -> list[Path]:
    """Directories that may hold ``<pkg>/msg/<Name>.msg``, most specific first."""
    dirs: list[Path] = []
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            dirs.append(Path(prefix) / "share")
    dirs.append(Path(sys.prefix) / "share")
    dirs.append(SOURCE_TREE)
    seen: set[Path] = set()
    return [d for d in dirs if d.is_dir() and not (d in seen or seen.add(d))]


def split_typename(typename: str) -> tuple[str, str, str]:
    """``pkg/msg/Name`` -> (pkg, "msg", Name); raise UnknownMessageType for a malformed name."""
    match = _TYPENAME.match(typename)
    if match is None:
        raise UnknownMessageType(f"malformed message type name {typename!r} (expected pkg/msg/Name)")
    return match.group(1), match.group(2), match.group(3)


def import_message_class(typename: str) -> type | None:
    """The generated Python class of ``pkg/msg/Name`` (needed by rclpy for raw pub/sub), or None."""
    try:
        pkg, kind, name = split_typename(typename)
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (UnknownMessageType, ImportError, AttributeError):
        return None


class MessageTypes:
    """A rosbags typestore that learns types on demand from the places listed in the module docstring."""

    def __init__(self, search_dirs: list[Path] | None = None) -> None:
        self.typestore: Typestore = get_typestore(BASE_STORE)
        self.search_dirs = interface_search_dirs() if search_dirs is None else search_dirs

    def known(self, typename: str) -> bool:
        return typename in self.typestore.fielddefs

    def ensure(self, typename: str) -> None:
        """Make ``typename`` and every type it nests known, or raise UnknownMessageType."""
        pending = [typename]
        while pending:
            name = pending.pop()
            if self.known(name):
                continue
            self._register(self._definition_file(name), name)
            pending.extend(self._nested_types(name))

    def try_ensure(self, typename: str) -> bool:
        try:
            self.ensure(typename)
            return True
        except UnknownMessageType:
            return False

    def learn_from_bag(self, typename: str, msgdef: MessageDefinition) -> bool:
        """Register a type from the definition a bag embeds (used when nothing local defines it)."""
        if self.known(typename):
            return True
        try:
            if msgdef.format is MessageDefinitionFormat.MSG and msgdef.data:
                self.typestore.register(get_types_from_msg(msgdef.data, typename))
            elif msgdef.format is MessageDefinitionFormat.IDL and msgdef.data:
                self.typestore.register(get_types_from_idl(msgdef.data))
            else:
                return False
        except (TypesysError, ValueError) as err:
            raise UnknownMessageType(f"the bag's definition of {typename} does not parse: {err}") from err
        return self.known(typename)

    def definition(self, typename: str) -> tuple[str, str]:
        """(concatenated .msg text with dependencies, RIHS01 hash) as rosbag2 stores them."""
        self.ensure(typename)
        text, _ = self.typestore.generate_msgdef(typename, ros_version=2)
        return text, self.typestore.hash_rihs01(typename)

    def deserialize(self, data: bytes | memoryview, typename: str) -> object:
        """Decode CDR bytes (raises on malformed data; used to validate what a damaged bag yields)."""
        return self.typestore.deserialize_cdr(data, typename)

    # ------------------------------------------------------------------------------------------------

    def _definition_file(self, typename: str) -> Path:
        pkg, kind, name = split_typename(typename)
        for base in self.search_dirs:
            path = base / pkg / kind / f"{name}.msg"
            if path.is_file():
                return path
        where = ", ".join(str(d) for d in self.search_dirs) or "(no search directories)"
        raise UnknownMessageType(f"no definition of {typename}: {pkg}/{kind}/{name}.msg is not under {where}")

    def _register(self, path: Path, typename: str) -> None:
        try:
            self.typestore.register(get_types_from_msg(path.read_text(encoding="utf-8"), typename))
        except (TypesysError, ValueError, OSError) as err:
            raise UnknownMessageType(f"cannot load {typename} from {path}: {err}") from err

    def _nested_types(self, typename: str) -> list[str]:
        """Names of the message types ``typename``'s fields refer to (arrays and sequences included)."""
        _, fields = self.typestore.fielddefs[typename]
        nested: list[str] = []

        def visit(desc: tuple) -> None:
            kind, value = desc
            if kind.name == "NAME":
                nested.append(value)
            elif kind.name in ("ARRAY", "SEQUENCE"):
                visit(value[0])

        for _, desc in fields:
            visit(desc)
        return nested
