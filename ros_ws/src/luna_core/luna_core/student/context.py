"""Prompt encoding for the student and the context-length policy.

The decision commitment position i* (LUNA-AD Eq. 14-16; conference paper Eq. 7) is the last token of
the prompt rendered with the chat template's generation prompt, i.e. the token just before the
assistant's response starts. With ``add_generation_prompt=True`` it is simply the last prompt token.

Context-length policy ``drop_examples_then_objects`` (when the prompt exceeds ``max_tokens``):
1. drop retrieved examples, least similar first (retrieval returns them most similar first, so the
   last one goes first), down to zero examples;
2. then drop object lines of the current query's traffic state from the far end of the list (the
   scene descriptor lists objects nearest first, so the farthest object goes first);
3. if the prompt still does not fit, raise ``ContextOverflowError`` naming the sizes.
Every shortening is reported (``examples_used``, ``objects_dropped``) so callers can log it.

Independently of the budget, the student's config shortens its prompt (``student_messages``; issue 13: a
K = 3 prompt of ~1,400 tokens against a goal of ~1,000, and each token costs time on a CPU):
- ``example_objects`` > 0 keeps in each retrieved example the objects its answer names (the decisive
  ones) and its ``example_objects`` nearest; each further object line costs ~32 tokens per example;
- ``query_objects`` > 0 keeps the current query's nearest ``query_objects`` objects;
- ``prompt_form`` "brief" writes every traffic state in the brief form (``prompts.compact.brief_query``)
  and states its layout once in the system message; "rounded" is brief with the object lines' numbers in
  whole units (``prompts.compact.rounded_query``).
The defaults (0, 0, "compact") leave the prompt as ``PromptManager.md_messages`` renders it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from luna_core.prompts import knowledge
from luna_core.prompts.compact import brief_query, rounded_query
from luna_core.student.errors import ContextOverflowError, PromptTemplateError
from luna_core.types import MemoryItem

Message = dict[str, str]
MessagesFn = Callable[[str, Sequence[MemoryItem]], list[Message]]

# Object lines of a rendered traffic state (luna_core.scene.render_traffic_state): "- <id> <type>, ...".
OBJECT_LINE_PREFIX = "- "


@dataclass
class FittedPrompt:
    """Token ids of a prompt that fits the window, and how it was shortened to fit."""

    input_ids: list[int]
    examples_used: int
    examples_given: int
    objects_dropped: int
    query: str  # the (possibly shortened) current query
    messages: list[Message]  # the chat messages the ids were rendered from

    @property
    def commit_index(self) -> int:
        """i*: the last prompt token (the chat template's generation prompt is included)."""
        return len(self.input_ids) - 1

    @property
    def truncated(self) -> bool:
        return self.examples_used < self.examples_given or self.objects_dropped > 0


def drop_farthest_object(query: str) -> str | None:
    """The query without its last-listed object line (the farthest object), or None if it has none."""
    lines = query.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(OBJECT_LINE_PREFIX):
            return "\n".join(lines[:i] + lines[i + 1:])
    return None


# An object an answer names: the teacher's brief rationale reads "<kind> <id> <distance> m ahead|behind"
# (luna_core.teacher._brief_object).
_NAMED_OBJECT = re.compile(r"\b(?:vehicle|pedestrian|cyclist|obstacle) (\S+) \d+ m (?:ahead|behind)\b",
                           re.IGNORECASE)


def named_objects(answer: str) -> frozenset[str]:
    """The ids of the objects an answer's rationales name."""
    return frozenset(_NAMED_OBJECT.findall(answer))


def keep_nearest_objects(query: str, count: int, named: frozenset[str] = frozenset()) -> str:
    """The query with only its first ``count`` object lines (the nearest: the scene descriptor lists them
    nearest first) and those whose id is in ``named``; the other lines unchanged."""
    kept, out = 0, []
    for line in query.split("\n"):
        if line.startswith(OBJECT_LINE_PREFIX):
            kept += 1
            if kept > count and line[len(OBJECT_LINE_PREFIX):].split(" ", 1)[0] not in named:
                continue
        out.append(line)
    return "\n".join(out)


def student_messages(messages_fn: MessagesFn, config) -> MessagesFn:
    """``messages_fn`` (``PromptManager.md_messages``) shortened as ``config`` (a ``StudentConfig``) says:
    its ``query_objects``, ``example_objects`` and ``prompt_form`` (module docstring). The defaults return
    ``messages_fn`` itself."""
    query_objects, example_objects = config.query_objects, config.example_objects
    form = _SHORT_FORMS.get(config.prompt_form)
    if not (query_objects or example_objects or form):
        return messages_fn

    def messages(query: str, examples: Sequence[MemoryItem]) -> list[Message]:
        if query_objects:
            query = keep_nearest_objects(query, query_objects)
        if example_objects:
            examples = [replace(item, query=keep_nearest_objects(item.query, example_objects,
                                                                 named_objects(item.answer)))
                        for item in examples]
        out = messages_fn(query, examples)
        return [_short_message(m, *form) for m in out] if form else out
    return messages


# The shortened prompt forms: how a compact traffic state is rewritten, and what the system message adds.
_SHORT_FORMS: dict[str, tuple[Callable[[str], str], str]] = {
    "brief": (brief_query, knowledge.BRIEF_FORM),
    "rounded": (rounded_query, knowledge.ROUNDED_FORM),
}


def _short_message(message: Message, rewrite: Callable[[str], str], layout: str) -> Message:
    """A message of the compact prompt in a short form: traffic states rewritten, the layout stated once."""
    if message["role"] == "user":
        return {**message, "content": rewrite(message["content"])}
    if message["role"] == "system":
        return {**message, "content": message["content"] + "\n" + layout}
    return message


def student_encoder(tokenizer, prompts, config) -> "PromptEncoder":
    """The encoder of a student with ``config`` (a ``StudentConfig``): ``prompts.md_messages`` shortened by
    ``student_messages``, under its ``max_context_tokens``; the one way the student, its ONNX form and the
    prompt-length benchmark build prompts."""
    return PromptEncoder(tokenizer, student_messages(prompts.md_messages, config), config.max_context_tokens)


def chat_ids(tokenizer, messages: list[Message], add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template (whichever container it returns)."""
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


class PromptEncoder:
    """Messages -> token ids with the chat template, under the context-length policy."""

    def __init__(self, tokenizer, messages_fn: MessagesFn, max_tokens: int) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise PromptTemplateError("the base model's tokenizer has no chat template; the student "
                                      "needs an instruction-tuned base with one")
        if tokenizer.eos_token_id is None:
            raise PromptTemplateError("the base model's tokenizer has no eos token (end of turn)")
        self.tokenizer = tokenizer
        self.messages_fn = messages_fn
        self.max_tokens = max_tokens

    def render(self, messages: list[Message]) -> list[int]:
        """Token ids of the messages with the generation prompt (ending at i*)."""
        if not messages or messages[-1].get("role") != "user":
            raise PromptTemplateError("the student's prompt must end with the current user query")
        return chat_ids(self.tokenizer, messages, add_generation_prompt=True)

    def fit(self, query: str, retrieved: Sequence[MemoryItem], reserve: int = 0) -> FittedPrompt:
        """Encode ``query`` with ``retrieved`` examples so that it leaves ``reserve`` tokens free."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("student prompt: the scene query is empty")
        budget = self.max_tokens - reserve
        if budget <= 0:
            raise ContextOverflowError(f"no room for a prompt: max_context_tokens={self.max_tokens}, "
                                       f"reserved {reserve}")
        examples = list(retrieved)
        messages = self.messages_fn(query, examples)
        ids = self.render(messages)
        while len(ids) > budget and examples:
            examples.pop()  # least similar example first
            messages = self.messages_fn(query, examples)
            ids = self.render(messages)
        dropped = 0
        while len(ids) > budget:
            shorter = drop_farthest_object(query)
            if shorter is None:
                raise ContextOverflowError(
                    f"prompt needs {len(ids)} tokens with no retrieved examples and no objects left, more "
                    f"than the budget of {budget} (max_context_tokens={self.max_tokens}, reserved {reserve})")
            query, dropped = shorter, dropped + 1
            messages = self.messages_fn(query, examples)
            ids = self.render(messages)
        return FittedPrompt(ids, len(examples), len(retrieved), dropped, query, messages)

    def answer_ids(self, answer: str) -> list[int]:
        """The assistant answer's tokens followed by the end-of-turn token."""
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"]) + [
            self.tokenizer.eos_token_id]
