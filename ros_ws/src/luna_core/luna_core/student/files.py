"""On-disk layout of a saved student and the base-model hash that ties it to its base.

    <dir>/student_config.json   StudentConfig
    <dir>/student_meta.json     format version, base-model hash, d_model, file checksums
    <dir>/adapter.safetensors   LoRA adapter weights (peft state dict)
    <dir>/head.safetensors      DPP head weights
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from luna_core.student.errors import StudentModelFileError

CONFIG_FILE = "student_config.json"
META_FILE = "student_meta.json"
ADAPTER_FILE = "adapter.safetensors"
HEAD_FILE = "head.safetensors"
FORMAT_VERSION = 1

_HASH_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# Keys of a base model's config.json that say who wrote it, not what the model is: the same weights
# converted under another transformers version (a vehicle's, a GPU machine's) must hash alike.
WRITER_KEYS = ("transformers_version",)


def base_model_hash(folder: Path, legacy: bool = False) -> str:
    """SHA-256 over the base model's config and weight files (weights memoised per file size and mtime).

    config.json counts as its JSON without ``WRITER_KEYS``; ``legacy=True`` hashes its raw bytes, as
    metas written before session 17 did (still accepted on load)."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir()
                   if p.name == "config.json" or p.suffix in (".safetensors", ".bin", ".gguf"))
    if not any(p.suffix in (".safetensors", ".bin", ".gguf") for p in files):
        raise StudentModelFileError(f"base model folder {folder} has no weight files")
    h = hashlib.sha256()
    for p in files:
        if p.name == "config.json" and not legacy:
            digest = hashlib.sha256(_model_config_bytes(p)).hexdigest()
        else:
            st = p.stat()
            key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
            if key not in _HASH_CACHE:
                _HASH_CACHE[key] = file_sha256(p)
            digest = _HASH_CACHE[key]
        h.update(f"{p.name}:{digest}\n".encode())
    return h.hexdigest()


def _model_config_bytes(path: Path) -> bytes:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StudentModelFileError(f"{path}: unreadable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise StudentModelFileError(f"{path}: not a JSON object")
    kept = {k: v for k, v in config.items() if k not in WRITER_KEYS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()


def read_meta(directory: Path) -> dict:
    path = Path(directory) / META_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise StudentModelFileError(f"{path}: missing (not a saved student directory?)") from exc
    except (OSError, ValueError) as exc:
        raise StudentModelFileError(f"{path}: unreadable JSON ({exc})") from exc
    for key in ("format_version", "base_model_hash", "files"):
        if key not in meta:
            raise StudentModelFileError(f"{path}: no {key!r} entry")
    if meta["format_version"] != FORMAT_VERSION:
        raise StudentModelFileError(f"{path}: format version {meta['format_version']} is not "
                                    f"{FORMAT_VERSION}")
    return meta


def check_file(directory: Path, name: str, meta: dict) -> Path:
    """The path of a weight file, verified against the checksum written at save time."""
    path = Path(directory) / name
    if not path.is_file():
        raise StudentModelFileError(f"{path}: missing")
    expected = meta["files"].get(name)
    if expected is None:
        raise StudentModelFileError(f"{Path(directory) / META_FILE}: no checksum for {name}")
    if file_sha256(path) != expected:
        raise StudentModelFileError(f"{path}: corrupt (checksum differs from the one saved)")
    return path


def staging_dir(directory: Path) -> Path:
    """An empty folder beside ``directory`` to write a student into before ``replace_dir``."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def write_meta(folder: Path, base_hash: str, base_model: str, d_model: int) -> None:
    """``META_FILE`` of a student written into ``folder``: the base's hash and the weight files' checksums."""
    meta = {"format_version": FORMAT_VERSION, "base_model_hash": base_hash, "base_model": base_model,
            "d_model": int(d_model),
            "files": {name: file_sha256(Path(folder) / name) for name in (ADAPTER_FILE, HEAD_FILE)}}
    (Path(folder) / META_FILE).write_text(json.dumps(meta, indent=2))


def replace_dir(tmp: Path, directory: Path) -> Path:
    """Put the student written into ``tmp`` at ``directory``: a crash leaves the old copy intact."""
    directory = Path(directory)
    old = directory.with_name(directory.name + f".old{os.getpid()}")
    if directory.exists():
        directory.rename(old)
    Path(tmp).rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory
