"""The memory bank of LUNA-AD (Eq. 12): items <Q_md, e, pi, A>, durable appends, versions, retrieval.

    from luna_core.memory import MemoryBank, MiniLMEmbedder

    with MemoryBank.create("bank/", MiniLMEmbedder()) as bank:       # the one writer
        bank.append(MemoryItem(id="", query=q_md, answer=a_sum, distribution=pi))
    reader = MemoryBank.open("bank/")                                # embedder from the manifest
    reader.refresh()                                                 # follow the writer's appends
    for item, score in reader.retrieve(q_md, k=3, exclude_ids={"..."}):
        ...
"""

from luna_core.memory.bank import (BankIntegrityError, BankLockedError, EmbedderMismatchError, IndexKind, InvalidItemError,
                                   MemoryBank, MemoryBankError, ReadOnlyBankError, stored_version)
from luna_core.memory.embedders import (Embedder, EmbeddingError, MiniLMEmbedder, SceneVectorEmbedder,
                                        embedder_from_spec)
from luna_core.memory.journal import JournalCorruptionError, JournalWarning

__all__ = ["BankIntegrityError", "BankLockedError", "EmbedderMismatchError", "Embedder", "EmbeddingError",
           "IndexKind", "InvalidItemError", "JournalCorruptionError", "JournalWarning", "MemoryBank",
           "MemoryBankError", "MiniLMEmbedder", "ReadOnlyBankError", "SceneVectorEmbedder", "embedder_from_spec",
           "stored_version"]
