"""In-process transformers backend with the packaged SmolLM2-135M-Instruct (real weights, offline)."""

from __future__ import annotations

import numpy as np
import pytest

from luna_core.llm import ChatModel, ChoiceModel, TransformersChatModel, UsageMeter

MESSAGES = [{"role": "system", "content": "You assist an automated vehicle. Answer with one action code."},
            {"role": "user", "content": "The lane ahead is free. Choose AK, CK or DK and end with 'Decision: <code>'."}]


@pytest.fixture(scope="module")
def model():
    return TransformersChatModel("smollm2-135m-instruct", num_threads=1, meter=UsageMeter())


def test_local_model_chat_is_seeded_and_reports_tokens(model):
    assert isinstance(model, ChatModel) and isinstance(model, ChoiceModel)
    a = model.chat(MESSAGES, temperature=0.7, top_k=20, seed=5, max_tokens=8)
    b = model.chat(MESSAGES, temperature=0.7, top_k=20, seed=5, max_tokens=8)
    assert a.text == b.text and a.text.strip()
    assert a.prompt_tokens > 30 and 0 < a.completion_tokens <= 8
    assert a.finish_reason in ("stop", "length")
    assert a.finish_reason == "stop" or a.completion_tokens == 8  # "length" only when the limit was hit
    greedy = model.chat(MESSAGES, temperature=0.0, max_tokens=8)
    assert greedy.text == model.chat(MESSAGES, temperature=0.0, max_tokens=8).text
    assert model.meter.prompt_tokens >= 4 * a.prompt_tokens


def test_local_model_prefix_cache_changes_nothing_but_cost(model):
    model._prefixes.clear()
    cold = model.choose(MESSAGES, ["AK", "CK", "DK"], assistant_prefix="Decision: ")
    reused_before = model.prefix_tokens_reused
    warm = model.choose(MESSAGES, ["AK", "CK", "DK"], assistant_prefix="Decision: ")
    assert model.prefix_tokens_reused > reused_before  # the prompt was not recomputed
    assert warm.text == cold.text
    assert np.allclose([warm.logprobs[c] for c in "AK CK DK".split()],
                       [cold.logprobs[c] for c in "AK CK DK".split()], atol=1e-4)
    model._prefixes.clear()
    g1 = model.chat(MESSAGES, temperature=0.0, max_tokens=6)
    g2 = model.chat(MESSAGES, temperature=0.0, max_tokens=6)  # served from the cached prompt
    assert g1.text == g2.text


def test_local_model_choose_follows_the_likelihood(model):
    choices = [f"{k / 10:.1f}" for k in range(11)]
    greedy = model.choose(MESSAGES, choices, assistant_prefix="Confidence: ")
    assert greedy.text == max(choices, key=lambda c: greedy.logprobs[c])
    assert set(greedy.logprobs) == set(choices) and all(v < 0 for v in greedy.logprobs.values())
    sampled = {model.choose(MESSAGES, ["AK", "CK", "DK"], "Decision: ", temperature=5.0, seed=s).text
               for s in range(8)}
    assert len(sampled) >= 2  # a high temperature spreads the picks over the choices
    with pytest.raises(ValueError):
        model.choose(MESSAGES, [])
