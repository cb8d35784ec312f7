"""Student prompt length at K retrieved examples, by how many objects each example keeps (issue 13).

Held-out items of the bank (the split of ``luna-offline distill``), their K examples retrieved from the
training items as ``evaluate`` does, each prompt rendered by the student's encoder (chat template,
compact Q_md) with ``StudentConfig.example_objects`` = 0 (every object, the current students) and the
given caps. Tokens only: no forward pass, so the figures do not depend on the machine's load.

    .venv/bin/python benchmarks/prompt_lengths.py --items 300 --k 3 --example-objects 0 1 2 3
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
from luna_core.student.context import student_encoder
from luna_offline.distill import retrieve_examples, split_items, subset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", default="", help="memory bank (default: the bundled one)")
    ap.add_argument("--items", type=int, default=300, help="held-out items measured (a seeded subset)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--example-objects", type=int, nargs="+", default=[0, 1, 2, 3])
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
    print("| objects per example | prompt tokens p50 | p90 | max | prompts over 1,000 tokens |")
    print("|---|---:|---:|---:|---:|")
    for n in args.example_objects:
        # No budget: the full length of every prompt is what is measured.
        encoder = student_encoder(tokenizer, prompts, StudentConfig(example_objects=n, max_context_tokens=1 << 20))
        lengths = np.array([len(encoder.fit(q, ex).input_ids)
                            for q, ex in tqdm(cases, desc=f"example_objects={n}", leave=False)])
        print(f"| {n or 'every'} | {np.median(lengths):.0f} | {np.percentile(lengths, 90):.0f} | {lengths.max()} "
              f"| {100 * np.mean(lengths > 1000):.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
