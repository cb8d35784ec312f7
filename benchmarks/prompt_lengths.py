"""Student prompt length at K retrieved examples, by prompt form and objects kept (issue 13).

Held-out items of the bank (the split of ``luna-offline distill``), their K examples retrieved from the
training items as ``evaluate`` does, each prompt rendered by the student's encoder (chat template) under
each given prompt, FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS: ``StudentConfig.prompt_form``, ``query_objects``
and ``example_objects`` (``compact/0/0`` is the prompt of ``models/student``). Besides the
whole prompt, the tokens after the system message: what a decision computes when the system message's
KV cache is reused. Tokens only: no forward pass, so the figures do not depend on the machine's load.

    .venv/bin/python benchmarks/prompt_lengths.py --items 300 --k 3 --prompts compact/0/0 compact/0/1 brief/6/1
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
