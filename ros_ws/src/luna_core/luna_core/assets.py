"""Where the bundled default artifacts live (``models/`` of the repository, or ``$LUNA_MODELS_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

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
    return path


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
        import shutil

        tmp = live.with_name(live.name + f".seed{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(default_path("memory_bank"), tmp, ignore=shutil.ignore_patterns("writer.lock"))
        tmp.rename(live)
    return live
