"""Reflection: Eq. 29 query, strict validation, memory update, durable outbox with backoff.

The endpoint here is a scripted fake chat model (the validation logic is what is tested); the
in-process SmolLM2 path is exercised in tests/ros/test_reflection_loop.py.
"""

import numpy as np
import pytest

from luna_core import types as T
from luna_core.llm.base import Completion, LLMUnavailable
from luna_core.memory.bank import MemoryBank
from luna_core.memory.embedders import MiniLMEmbedder
from luna_core.prompts import PromptManager
from luna_core.reflection import Outbox, ReflectionRequest, ReflectionSystem
from tests import samples


class ScriptedFakeModel:
    """Answers from a list; raises LLMUnavailable while ``down``."""

    name = "scripted-fake"

    def __init__(self, answers):
        self.answers = list(answers)
        self.down = False
        self.seen = []

    def chat(self, messages, temperature=0.0, top_k=None, seed=None, max_tokens=None):
        if self.down:
            raise LLMUnavailable("connection refused")
        self.seen.append(messages)
        return Completion(text=self.answers.pop(0), prompt_tokens=10, completion_tokens=10, latency=0.01)



@pytest.fixture(scope="module")
def embedder():
    return MiniLMEmbedder()  # loaded once for the module


@pytest.fixture
def bank(tmp_path, embedder):
    with MemoryBank.create(tmp_path / "bank", embedder) as b:
        yield b


def _request(collision=True):
    query = PromptManager().decision_query(samples.scene())
    failure = T.FailureEvent(14.0, "AK", 13.0, ["veh-1"] if collision else [], not collision)
    expl = T.DecisionExplanation(14.5, 13.0, 14.0, query, ["AK", "CK"], "Recommended decisions: AK,CK\n...")
    return ReflectionRequest.from_events(expl, failure)


REVISED = "Recommended decisions: DK,CK\nExplanations:\n- DK: the lead car brakes.\n- CK: keep distance."


def test_revised_answer_becomes_reflection_item_without_distribution(bank, tmp_path):
    model = ScriptedFakeModel([REVISED])
    system = ReflectionSystem(model, PromptManager(), bank)
    req = _request()
    result = system.reflect(req)
    assert not result.normal and result.memory_item_id
    item = bank.get(result.memory_item_id)
    assert item.source == "reflection" and item.distribution is None and item.query == req.query
    assert item.answer.startswith("Recommended decisions: DK,CK")
    text = model.seen[0][-1]["content"]
    assert req.query in text and "collided" in text and req.answer in text  # Eq. 29 inputs


@pytest.mark.parametrize("answer,collision", [("normal", True), ("Recommended decisions: XX\nExplanations: -", True),
                                              ("Recommended decisions: CR\nExplanations:\n- CR: go right.", False)])
def test_invalid_reflections_are_rejected(bank, answer, collision):
    system = ReflectionSystem(ScriptedFakeModel([answer] * 3), PromptManager(), bank)
    outbox_dir = bank.path + "-outbox"
    outbox = Outbox(outbox_dir)
    outbox.put(_request(collision))
    results = [system.process(outbox, p) for _ in range(3) for p in outbox.due()]
    final = [r for r in results if r is not None]
    assert len(final) == 1 and final[0].error.startswith("invalid reflection")
    assert len(bank) == 0 and len(outbox) == 0


def test_normal_without_collision_adds_nothing(bank):
    result = ReflectionSystem(ScriptedFakeModel(["normal"]), PromptManager(), bank).reflect(_request(collision=False))
    assert result.normal and len(bank) == 0


def test_outbox_survives_restart_and_retries_until_endpoint_returns(bank, tmp_path):
    model = ScriptedFakeModel([REVISED])
    model.down = True
    system = ReflectionSystem(model, PromptManager(), bank)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put(_request())
    pending = outbox.due()
    assert system.process(outbox, pending[0], backoff_base=0.0) is None  # endpoint down: stays queued
    outbox.close()
    reopened = Outbox(tmp_path / "outbox")  # a restart: the acknowledged request is still there
    assert len(reopened) == 1
    model.down = False
    result = system.process(reopened, reopened.due()[0])
    assert result is not None and result.memory_item_id
    reopened.close()
    assert len(Outbox(tmp_path / "outbox")) == 0  # done is durable too
