"""Held-out scores of saved students' decision heads on cached h_{i*} (``distill --stage head`` caches).

    .venv/bin/python benchmarks/score_cached_heads.py --student models/student \
        --features out/s1_k13/features out/s1_k0/features [--bank out/bank_train50] [--targets-from-bank]

For each feature folder: the held-out rows' K, top-action accuracy and KL(pi || pi_hat) (Eq. 17) of the
student's head, as the head stage computes them after every epoch. No language-model pass: the hidden
states are the cached ones, so scoring a head at K = 0 and K = 3 takes seconds. A head that reads the scene
vector (``StudentConfig.head_scene_dim``) takes each row's from its teacher item in ``--bank``. With
``--targets-from-bank`` the rows are scored against ``--bank``'s labels instead of the cached ones (a bank of
the same frames relabelled by another teacher, as ``distill --targets-from-bank`` trains on it; K = 0 rows only).
With ``--by-type`` the scores are also given per scenario type of the held-out frames (the item id's scenario
without its split prefix and index, e.g. ``stopping_with_lead`` for ``train_stopping_with_lead_06@0005.00``),
one column pair per feature folder: where the K = 3 rows and the K = 0 rows of the same frames part.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from luna_core.scene import head_scene_part
from luna_core.student.model import load_decision_head
from luna_offline.distill import split_group
from luna_offline.distill_head import (SceneJoinedHead, bank_targets, kl_and_accuracy, load_features,
                                      with_scene_vectors)


def bank_items(path: Path) -> dict:
    from luna_core.memory import MemoryBank

    with MemoryBank.open(str(path)) as bank:
        return {it.id: it for it in bank}


def scenario_type(item_id: str) -> str:
    """``stopping_with_lead`` for ``train_stopping_with_lead_06@0005.00`` (split prefix and index dropped)."""
    scenario = split_group(item_id)
    return scenario.split("_", 1)[-1].rsplit("_", 1)[0]


def by_type_table(scores: list[tuple[str, dict[str, tuple[int, float, float]]]]) -> str:
    """Rows: scenario types; per folder its held-out rows, accuracy (%) and KL on that type."""
    types = sorted({t for _, per in scores for t in per})
    head = "| scenario type | " + " | ".join(f"{folder}: rows, accuracy (%), KL" for folder, _ in scores) + " |"
    lines = [head, "|---|" + "---:|" * len(scores)]
    for t in types:
        cells = [(f"{per[t][0]}, {100 * per[t][2]:.1f}, {per[t][1]:.3f}" if t in per else "-") for _, per in scores]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", type=Path, required=True, help="saved student folder (head.safetensors)")
    p.add_argument("--features", type=Path, nargs="+", required=True, help="feature cache folders")
    p.add_argument("--bank", type=Path, help="the teacher bank of the caches (a head that reads the scene vector)")
    p.add_argument("--targets-from-bank", action="store_true",
                   help="score against --bank's labels of the rows' items (a relabelled bank of the same frames)")
    p.add_argument("--by-type", action="store_true", help="also the scores per scenario type of the held-out frames")
    args = p.parse_args(argv)
    head = load_decision_head(args.student)
    items = None
    if head.scene_dim or args.targets_from_bank:
        if args.bank is None:
            p.error(f"{args.student}: the head reads the scene vector or --targets-from-bank; --bank gives each row's")
        items = bank_items(args.bank)
    print("| features | held-out rows | K | top-action accuracy (%) | KL |\n|---|---:|---|---:|---:|")
    per_type = []
    for folder in args.features:
        hidden, target, rows = load_features(folder, "heldout")
        if args.targets_from_bank:
            target = bank_targets(rows, items, "held-out", target)
        scored, inputs = head, hidden
        if head.scene_dim:
            scored = SceneJoinedHead(head)
            inputs = with_scene_vectors(hidden, rows, items, head_scene_part(head.scene_dim))
        kl, acc = kl_and_accuracy(scored, inputs, target)
        ks = json.dumps(sorted({k for _, k in rows}))
        print(f"| {folder} | {len(rows)} | {ks} | {100 * acc:.1f} | {kl:.3f} |")
        if args.by_type:
            index = defaultdict(list)
            for i, (item_id, _) in enumerate(rows):
                index[scenario_type(item_id)].append(i)
            per_type.append((str(folder), {t: (len(ix), *kl_and_accuracy(scored, inputs[ix], target[ix]))
                                           for t, ix in index.items()}))
    if per_type:
        print("\n" + by_type_table(per_type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
