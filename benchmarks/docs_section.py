"""Write one benchmark's section of docs/benchmarks.md (shared by the benchmark scripts)."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, heading: str, text: str) -> None:
    """Replace the section starting at the line ``heading`` (up to the next '## ' heading), or append it."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = old.splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = text.rstrip("\n").splitlines() + [""]
        new = "\n".join(lines) + "\n"
    else:
        new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(new)
