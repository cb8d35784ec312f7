"""A real (untrained) student saved to disk and a small real memory bank, for node and loop tests.

The student is SmolLM2-135M-Instruct with freshly initialised LoRA adapters and head: its
distribution is arbitrary but it runs the exact code path of a trained one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from luna_core import types as T
from luna_core.memory.bank import MemoryBank
from luna_core.memory.embedders import MiniLMEmbedder
from luna_core.prompts import PromptManager
from luna_core.student import DualHeadStudent, StudentConfig
from tests import samples


def make_student_dir(root: Path) -> Path:
    folder = root / "student"
    if not (folder / "config.json").exists():
        DualHeadStudent.from_base(StudentConfig(device="cpu", explanation_max_new_tokens=16)).save_pretrained(folder)
    return folder


def make_bank(root: Path, n: int = 4) -> tuple[Path, list[str]]:
    path = root / "bank"
    prompts = PromptManager()
    ids = []
    with MemoryBank.create(path, MiniLMEmbedder()) as bank:
        for i in range(n):
            scene = samples.scene()
            scene.ego_speed = 4.0 + 2.0 * i
            p = np.zeros(T.NUM_ACTIONS)
            p[T.ACTION_INDEX["CK"]], p[T.ACTION_INDEX["DK"]] = 0.7, 0.3
            item = bank.append(T.MemoryItem(id=f"item-{i}", query=prompts.decision_query(scene),
                                            answer="Recommended decisions: CK,DK\nExplanations: keep the lane.",
                                            distribution=p))
            ids.append(item.id)
    return path, ids
