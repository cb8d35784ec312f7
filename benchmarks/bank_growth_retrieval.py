"""How much a grown memory bank's retrieval moves where the new items are not retrieved.

A bank that grows (a reflection round's copy, a vehicle's live bank) should return, for every query
whose top K holds none of the new items, exactly what the bank before the growth returned. With the
IVF index that holds only if the lists are kept (``index-ivf-*`` beside the journal) rather than trained
again on open. Probe queries are the base bank's own embeddings at random rows plus small Gaussian noise
(scenes like those the bank was built from)::

    .venv/bin/python benchmarks/bank_growth_retrieval.py --base models/memory_bank \
        --grown retrained=<round_1/memory_bank opened before the lists were kept> kept=<the same items, lists kept>

Prints, per grown bank, the index it opened with, whether it reused saved lists, how many probes
retrieved a new item, and how many of the others got a different top K than the base bank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import faiss
import numpy as np

from luna_core.memory.bank import MemoryBank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the bank before the growth")
    parser.add_argument("--grown", nargs="+", required=True, metavar="NAME=PATH", help="grown copies of it")
    parser.add_argument("--probes", type=int, default=3000)
    parser.add_argument("--noise", type=float, default=0.02, help="std of the noise added to each probe")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(1)
    base = MemoryBank.open(args.base)
    items = base.items  # parses every record once (a few seconds at 21.7k items)
    base_ids = {item.id for item in items}
    rng = np.random.default_rng(args.seed)
    rows = rng.choice(len(items), min(args.probes, len(items)), replace=False)
    vectors = np.stack([items[int(r)].embedding for r in rows]).astype(np.float32)
    probes = vectors + rng.normal(0.0, args.noise, vectors.shape).astype(np.float32)
    expected = [[item.id for item, _ in base.retrieve(q, args.k)] for q in probes]
    print(f"base {args.base}: {len(base)} items, {base.index_description}; {len(probes)} probes, K = {args.k}")
    print("| grown bank | items | index | lists reused | probes retrieving a new item | others moved |")
    print("|---|---:|---|---|---:|---:|")
    for spec in args.grown:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--grown {spec!r}: expected NAME=PATH")
        grown = MemoryBank.open(path)
        entered = moved = 0
        for q, before in zip(probes, expected):
            got = [item.id for item, _ in grown.retrieve(q, args.k)]
            if any(i not in base_ids for i in got):
                entered += 1
            else:
                moved += got != before
        reused = "yes" if grown.ivf_lists_kept else "no"
        print(f"| {name} | {len(grown)} | {grown.index_description} | {reused} | {entered} | {moved} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
