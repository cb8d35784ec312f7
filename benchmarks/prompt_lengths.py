"""Student prompt length at K retrieved examples, by prompt form and objects kept (issue 13).

Held-out items of the bank (the split of ``luna-offline distill``), their K examples retrieved from the
training items as ``evaluate`` does, each prompt rendered by the student's encoder (chat template) under
each given prompt, FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS: ``StudentConfig.prompt_form``, ``query_objects``
and ``example_objects`` (``compact/0/0`` is the prompt of ``models/student``). Besides the
whole prompt, the tokens after the system message: what a decision computes when the system message's
KV cache is reused. Tokens only: no forward pass, so the figures do not depend on the machine's load.

    .venv/bin/python benchmarks/prompt_lengths.py --items 300 --k 3 --prompts compact/0/0 compact/0/1 brief/6/1

``--query-lines`` adds, per prompt, where the current query's tokens go: each kind of line (its label
before the colon; the object lines together), how many tokens it takes, and how many of those are digits
(the tokenizer spends one per digit). The current query is what a steady-state decision computes.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from tqdm import tqdm

from luna_core.assets import default_path
from luna_core.memory import MemoryBank
from luna_core.prompts import PromptManager
from luna_core.student import StudentConfig
from luna_core.student.config import PROMPT_FORMS
from luna_core.student.context import chat_ids, student_encoder
from luna_offline.distill import retrieve_examples, split_items, subset


def parse_prompt(spec: str) -> tuple[str, int, int]:
    """FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS -> its three values; ``ValueError`` naming the spec otherwise."""
    parts = spec.split("/")
    if len(parts) != 3 or parts[0] not in PROMPT_FORMS or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"--prompts {spec!r}: expected FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS with FORM one of "
                         f"{', '.join(PROMPT_FORMS)}, e.g. brief/6/1")
    return parts[0], int(parts[1]), int(parts[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", default="", help="memory bank (default: the bundled one)")
    ap.add_argument("--items", type=int, default=300, help="held-out items measured (a seeded subset)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", nargs="+", default=["compact/0/0", "compact/0/1", "brief/6/1"],
                    help="FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS per row (0 = every object)")
    ap.add_argument("--query-lines", action="store_true",
                    help="also break the current query's tokens down by kind of line, digits apart")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from luna_core.model_cache import resolve

    tokenizer = AutoTokenizer.from_pretrained(str(resolve(StudentConfig().base_model)))
    prompts = PromptManager()
    bank_path = args.bank or str(default_path("memory_bank"))
    with MemoryBank.open(bank_path) as bank:
        _, held = split_items(list(bank), 0.1)
        exclude = {it.id for it in held}
        held = subset(held, args.items, 0)
        cases = [(it.query, retrieve_examples(bank, it, args.k, exclude)) for it in held]
    print(f"bank {bank_path}: {len(cases)} held-out items, K = {args.k}\n")
    print("| form | query objects | objects per example | prompt tokens p50 | p90 | max | over 1,000 "
          "| after the system message p50 | p90 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    breakdowns = []
    for spec in args.prompts:
        form, query_objects, example_objects = parse_prompt(spec)
        # No budget: the full length of every prompt is what is measured.
        config = StudentConfig(prompt_form=form, query_objects=query_objects, example_objects=example_objects,
                               max_context_tokens=1 << 20)
        encoder = student_encoder(tokenizer, prompts, config)
        fitted = [encoder.fit(q, ex) for q, ex in tqdm(cases, desc=spec, leave=False)]
        lengths = np.array([len(f.input_ids) for f in fitted])
        system = len(chat_ids(tokenizer, fitted[0].messages[:1]))  # the system turn, whose KV cache is kept
        after = lengths - system
        print(f"| {form} | {query_objects or 'every'} | {example_objects or 'every'} | {np.median(lengths):.0f} "
              f"| {np.percentile(lengths, 90):.0f} | {lengths.max()} | {100 * np.mean(lengths > 1000):.0f} % "
              f"| {np.median(after):.0f} | {np.percentile(after, 90):.0f} |")
        if args.query_lines:
            breakdowns.append((spec, query_line_tokens(tokenizer, [f.messages[-1]["content"] for f in fitted])))
    for spec, rows in breakdowns:
        print(f"\nThe current query of {spec}, tokens per query by kind of line (mean over {len(cases)} queries; "
              "the chat template's tokens around it not counted):\n")
        print("| line | in % of queries | tokens per query | of which digits |\n|---|---:|---:|---:|")
        for kind, share, tokens, digits in rows:
            print(f"| {kind} | {share:.0f} | {tokens:.1f} | {digits:.1f} |")
    return 0


def line_kind(line: str) -> str:
    """The kind of a query line: "object lines" for the object list's entries, else its label."""
    return "object lines" if line.startswith("- ") else line.split(":", 1)[0]


def query_line_tokens(tokenizer, queries: list[str]) -> list[tuple[str, float, float, float]]:
    """(kind of line, % of queries with it, mean tokens per query, mean digit tokens per query), most tokens
    first, and a last row for the whole query."""
    tokens: dict[str, float] = {}
    digits: dict[str, float] = {}
    present: dict[str, int] = {}
    for query in queries:
        kinds = set()
        for line in query.split("\n"):
            kind = line_kind(line)
            pieces = [tokenizer.decode([i]) for i in tokenizer(line, add_special_tokens=False)["input_ids"]]
            tokens[kind] = tokens.get(kind, 0) + len(pieces)
            digits[kind] = digits.get(kind, 0) + sum(p.strip().isdigit() for p in pieces)
            kinds.add(kind)
        for kind in kinds:
            present[kind] = present.get(kind, 0) + 1
    n = len(queries)
    rows = sorted(((k, 100 * present[k] / n, tokens[k] / n, digits[k] / n) for k in tokens), key=lambda r: -r[2])
    return rows + [("whole query", 100.0, sum(tokens.values()) / n, sum(digits.values()) / n)]


if __name__ == "__main__":
    sys.exit(main())
