"""Rewrite the include dirs that the ROS wheels' exported CMake files name to this interpreter's.

The ros-kilted-* wheels were built on a host whose Python lived under /opt/python/cp3XX-cp3XX; their
``*Export.cmake`` files under ``<venv>/share`` still name that host's Python include dir and numpy's
include dir below it, and CMake refuses non-existent include paths. Idempotent: re-run after
installing any further ``*-msgs`` wheel.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

import numpy

HOST_INCLUDE = re.compile(r"/opt/python/cp3\d+-cp3\d+[^\";\s]*")


def target_for(path: str) -> str:
    if "numpy" in path:
        return numpy.get_include()
    return sysconfig.get_paths()["include"]


def main(venv: str) -> int:
    changed = 0
    for cmake_file in Path(venv, "share").rglob("*.cmake"):
        text = cmake_file.read_text(errors="replace")
        if "/opt/python/" not in text:
            continue
        new = HOST_INCLUDE.sub(lambda m: target_for(m.group(0)), text)
        if new != text:
            cmake_file.write_text(new)
            changed += 1
    print(f"fixed include paths in {changed} CMake file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else sys.prefix))
