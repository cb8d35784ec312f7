"""Where the bundled default artifacts live (``models/`` of the repository, or ``$LUNA_MODELS_DIR``)."""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
from pathlib import Path

from luna_core.model_cache import cache_root

#: Bundled artifact names -> folder under the models directory.
DEFAULTS = {"student": "student", "memory_bank": "memory_bank", "diffusion_prior": "diffusion_prior"}


def models_dir() -> Path:
    env = os.environ.get("LUNA_MODELS_DIR")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "models"
        if (candidate / "README.md").exists():
            return candidate
    raise FileNotFoundError("cannot find the bundled models directory; set LUNA_MODELS_DIR")


def default_path(name: str) -> Path:
    """The bundled artifact ``name`` (see DEFAULTS); raises FileNotFoundError if it is not there."""
    if name not in DEFAULTS:
        raise KeyError(f"unknown bundled artifact {name!r}; one of {sorted(DEFAULTS)}")
    path = models_dir() / DEFAULTS[name]
    if not path.exists():
        raise FileNotFoundError(f"bundled artifact {name!r} is missing at {path}")
    return unpacked(path)


def unpacked(folder: Path) -> Path:
    """``folder`` itself, or, where some of its files ship xz-compressed (``<name>.xz``: the default memory
    bank's 49 MB journal is 3.9 MB so), a copy with those files decompressed, made once in the cache
    (``$LUNA_CACHE/bundled/<folder>-<hash of its files>``; a changed bundle gets a new copy)."""
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.name != "writer.lock")
    if not any(f.suffix == ".xz" for f in files):
        return folder
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    target = cache_root() / "bundled" / f"{folder.name}-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in files:
        if f.suffix == ".xz":
            with lzma.open(f) as src, open(tmp / f.stem, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        else:
            shutil.copy2(f, tmp / f.name)
    try:
        tmp.rename(target)  # atomic: a reader sees no copy or a whole one
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(path_or_empty: str, name: str) -> Path:
    """A configured path, or the bundled default when the configuration leaves it empty."""
    return Path(path_or_empty).expanduser() if path_or_empty else default_path(name)


def data_dir() -> Path:
    """Where the stack keeps what it learns on the vehicle (``$LUNA_DATA``, default
    ``~/.local/share/luna-ad``): the live memory bank and the reflection outbox."""
    return Path(os.environ.get("LUNA_DATA", Path.home() / ".local" / "share" / "luna-ad"))


def live_memory_bank(path_or_empty: str) -> Path:
    """The memory bank the stack reads and the reflection system appends to.

    A configured path is used as is. Empty means the live bank in ``data_dir()``, seeded once from
    the bundled default bank, so the repository's ``models/`` stays as built.
    """
    if path_or_empty:
        return Path(path_or_empty).expanduser()
    live = data_dir() / "memory_bank"
    if not (live / "manifest.json").exists():
        tmp = live.with_name(live.name + f".seed{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(default_path("memory_bank"), tmp, ignore=shutil.ignore_patterns("writer.lock"))
        tmp.rename(live)
    return live
