"""A disk cache of model answers keyed by a hash of (model, messages, sampling parameters).

Wrapping a backend in ``CachingChatModel`` makes a rerun of the same requests free and identical:
collection after an interruption, or with a changed downstream step, never pays twice. Entries are
JSON files written atomically (temporary file + rename), so a crash never leaves a corrupt entry; an
unreadable entry is treated as a miss and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from luna_core.llm.base import Choice, ChoiceModel, Completion, Message, UnsupportedCapability

CACHE_FORMAT = 1


def request_key(kind: str, model: str, payload: dict[str, Any]) -> str:
    blob = json.dumps({"format": CACHE_FORMAT, "kind": kind, "model": model, **payload}, sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CachingChatModel:
    def __init__(self, inner: Any, directory: str | Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0

    @property
    def meter(self):
        return self.inner.meter

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def _load(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) and entry.get("key") == key else None

    def _store(self, key: str, value: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{id(value)}")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump({"key": key, "value": value}, f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def chat(self, messages: Sequence[Message], temperature: float = 0.0, top_k: int | None = None,
             seed: int | None = None, max_tokens: int = 256) -> Completion:
        key = request_key("chat", self.name, {"messages": list(messages), "temperature": temperature,
                                               "top_k": top_k, "seed": seed, "max_tokens": max_tokens})
        entry = self._load(key)
        if entry is not None:
            self.hits += 1
            self.inner.meter.record_cache_hit(self.name)
            return Completion(**{**entry["value"], "latency": 0.0, "cached": True})
        self.misses += 1
        completion = self.inner.chat(messages, temperature=temperature, top_k=top_k, seed=seed,
                                     max_tokens=max_tokens)
        self._store(key, asdict(completion))
        return completion

    def choose(self, messages: Sequence[Message], choices: Sequence[str], assistant_prefix: str = "",
               temperature: float = 0.0, seed: int | None = None) -> Choice:
        if not isinstance(self.inner, ChoiceModel):
            raise UnsupportedCapability(f"{self.name} cannot score fixed choices")
        key = request_key("choose", self.name, {"messages": list(messages), "choices": list(choices),
                                                 "prefix": assistant_prefix, "temperature": temperature,
                                                 "seed": seed})
        entry = self._load(key)
        if entry is not None:
            self.hits += 1
            self.inner.meter.record_cache_hit(self.name)
            return Choice(**{**entry["value"], "latency": 0.0, "cached": True})
        self.misses += 1
        choice = self.inner.choose(messages, choices, assistant_prefix, temperature=temperature, seed=seed)
        self._store(key, asdict(choice))
        return choice
