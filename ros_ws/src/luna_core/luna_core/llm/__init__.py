"""LLM access: one chat interface over OpenAI-compatible endpoints and an in-process transformers model.

    chat(messages, temperature, top_k, seed, max_tokens) -> Completion(text, prompt_tokens,
                                                                      completion_tokens, latency, ...)

``TransformersChatModel`` (imported lazily: it loads torch) additionally offers ``choose`` for
constrained answers. ``CachingChatModel`` wraps any backend with a disk cache.
"""

from luna_core.llm.base import (BudgetExceeded, ChatModel, Choice, ChoiceModel, Completion, LLMConfigError,
                                LLMError, LLMRequestError, LLMUnavailable, Message, UnsupportedCapability,
                                UsageMeter)
from luna_core.llm.cache import CachingChatModel, request_key
from luna_core.llm.openai_client import EndpointConfig, OpenAIChatModel

__all__ = ["BudgetExceeded", "ChatModel", "Choice", "ChoiceModel", "Completion", "LLMConfigError", "LLMError",
           "LLMRequestError", "LLMUnavailable", "Message", "UnsupportedCapability", "UsageMeter",
           "CachingChatModel", "request_key", "EndpointConfig", "OpenAIChatModel", "TransformersChatModel"]


def __getattr__(name: str):
    if name == "TransformersChatModel":
        from luna_core.llm.local import TransformersChatModel

        return TransformersChatModel
    raise AttributeError(name)
