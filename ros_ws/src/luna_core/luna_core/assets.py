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
