"""Top-action changes between two memory banks of the same frames (e.g. the bank collected again by a new
teacher), the figures of docs/student.md "Relabelled by the reachable A band"::

    .venv/bin/python benchmarks/bank_label_changes.py models/memory_bank out/bank_train50_r
"""
import argparse
import collections

import numpy as np

from luna_core.memory import MemoryBank
from luna_core.types import ACTION_CODES


def top_actions(path: str) -> dict[str, str]:
    bank = MemoryBank.open(path)
    try:
        return {it.id: ACTION_CODES[int(np.argmax(it.distribution))] for it in bank if it.distribution is not None}
    finally:
        bank.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    args = p.parse_args()
    before, after = top_actions(args.before), top_actions(args.after)
    common = sorted(before.keys() & after.keys())
    if not common:
        raise SystemExit(f"{args.before} and {args.after} share no item ids: not banks of the same frames")
    moves = collections.Counter((before[i], after[i]) for i in common if before[i] != after[i])
    changed = sum(moves.values())
    print(f"{len(common)} items in both, {len(common) - changed} keep their top action, {changed} change")
    print("| before -> after | items | share of the changes (%) |\n|---|---:|---:|")
    for (a, b), n in moves.most_common():
        print(f"| {a} -> {b} | {n} | {100.0 * n / changed:.1f} |")


if __name__ == "__main__":
    main()
