"""How near the memory bank's items are to the scenes of a suite: the cosine similarity of each frame's
nearest items, as the decision path retrieves them, and the share of frames a retrieval floor
(``--min-similarity`` / the ``min_similarity`` parameter) would leave with fewer than K examples.

    .venv/bin/python benchmarks/retrieval_similarity.py --bank <bank> \
        --frames commonroad=<frames>.jsonl hard=<frames>.jsonl --floors 0.8 0.85 0.9 0.95

Why: the bank's items come from procedural roads. A scene far from all of them still gets K examples,
which then describe other situations. The reference row is the bank's own held-out scenarios (the
split of ``luna-offline distill``, ``--heldout-fraction``) against its training items: the similarity an
unseen scenario of the bank's own kind finds. Frames come from ``luna-offline frames`` (the expert's
states); a floor set from the reference row alone is not tuned to any evaluation suite.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from luna_core.heuristic import retrieval_key
from luna_core.memory import MemoryBank
from luna_core.prompts import PromptManager
from luna_offline.distill import split_items
from luna_offline.frames import read_frames

PERCENTILES = (1, 5, 10, 50)


def nearest_similarities(queries: np.ndarray, items: np.ndarray, k: int) -> np.ndarray:
    """(n, k) cosine similarities of each query's k nearest items, best first (exact, like a flat index)."""
    scores = queries @ items.T
    return -np.sort(-scores, axis=1)[:, :k]


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def row(label: str, sims: np.ndarray, floors: list[float]) -> str:
    top1, mean_k = sims[:, 0], sims.mean(axis=1)
    pct = " / ".join(f"{np.percentile(top1, p):.3f}" for p in PERCENTILES)
    below = " / ".join(f"{100 * np.mean(top1 < f):.1f}" for f in floors)
    full = " / ".join(f"{100 * np.mean(sims[:, -1] < f):.1f}" for f in floors)
    return f"| {label} | {len(sims)} | {pct} | {np.median(mean_k):.3f} | {below} | {full} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True, help="memory bank folder")
    ap.add_argument("--frames", nargs="+", default=[], metavar="LABEL=FRAMES",
                    help="frames files of `luna-offline frames` (JSON lines)")
    ap.add_argument("--floors", nargs="+", type=float, default=[0.8, 0.85, 0.9, 0.95])
    ap.add_argument("--k", type=int, default=3, help="retrieved items per decision (K)")
    ap.add_argument("--heldout-fraction", type=float, default=0.1, help="the bank's held-out split (by scenario)")
    args = ap.parse_args(argv)

    bank = MemoryBank.open(args.bank)
    try:
        items = list(bank)
        train, held = split_items(items, args.heldout_fraction)
        held_ids = {it.id for it in held}
        train_rows = _unit(np.stack([it.embedding for it in items if it.id not in held_ids]))
        prompts = PromptManager()
        out = [f"Bank `{args.bank}`: {len(items)} items, {len(train)} training and {len(held)} held-out teacher "
               f"items (fraction {args.heldout_fraction:g} by scenario); K = {args.k}.", "",
               f"| frames | n | nearest item's cosine, p{' / p'.join(map(str, PERCENTILES))} | median mean of K "
               f"| % with no item >= floor {' / '.join(f'{f:g}' for f in args.floors)} "
               f"| % with fewer than K items >= floor |",
               "|---|---:|---|---:|---|---|"]
        held_rows = _unit(np.stack([it.embedding for it in held]))
        out.append(row("the bank's held-out scenarios (reference)", nearest_similarities(held_rows, train_rows, args.k),
                       args.floors))
        all_rows = _unit(np.stack([it.embedding for it in items]))
        for spec in args.frames:
            label, sep, path = spec.partition("=")
            if not sep:
                ap.error(f"--frames {spec!r}: expected LABEL=FRAMES")
            frames = read_frames(path)
            if not frames:
                ap.error(f"--frames {spec!r}: no frames in {path}")
            queries = np.stack([bank.embedder.embed_query(
                retrieval_key(bank, f.scene, prompts.decision_query(f.scene))) for f in frames])
            out.append(row(f"{label} (all items)", nearest_similarities(_unit(queries), all_rows, args.k), args.floors))
    finally:
        bank.close()
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
