"""Held-out scores of saved students' decision heads on cached h_{i*} (``distill --stage head`` caches).

    .venv/bin/python benchmarks/score_cached_heads.py --student models/student \
        --features out/s1_k13/features out/s1_k0/features [--bank out/bank_train50] [--targets-from-bank]

For each feature folder: the held-out rows' K, top-action accuracy and KL(pi || pi_hat) (Eq. 17) of the
student's head, as the head stage computes them after every epoch. No language-model pass: the hidden
states are the cached ones, so scoring a head at K = 0 and K = 3 takes seconds. A head that reads the scene
vector (``StudentConfig.head_scene_dim``) takes each row's from its teacher item in ``--bank``. With
``--targets-from-bank`` the rows are scored against ``--bank``'s labels instead of the cached ones (a bank of
the same frames relabelled by another teacher, as ``distill --targets-from-bank`` trains on it; K = 0 rows only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from luna_core.scene import head_scene_part
from luna_core.student.model import load_decision_head
from luna_offline.distill_head import (SceneJoinedHead, bank_targets, kl_and_accuracy, load_features,
                                      with_scene_vectors)


def bank_items(path: Path) -> dict:
    from luna_core.memory import MemoryBank

    with MemoryBank.open(str(path)) as bank:
        return {it.id: it for it in bank}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", type=Path, required=True, help="saved student folder (head.safetensors)")
    p.add_argument("--features", type=Path, nargs="+", required=True, help="feature cache folders")
    p.add_argument("--bank", type=Path, help="the teacher bank of the caches (a head that reads the scene vector)")
    p.add_argument("--targets-from-bank", action="store_true",
                   help="score against --bank's labels of the rows' items (a relabelled bank of the same frames)")
    args = p.parse_args(argv)
    head = load_decision_head(args.student)
    items = None
    if head.scene_dim or args.targets_from_bank:
        if args.bank is None:
            p.error(f"{args.student}: the head reads the scene vector or --targets-from-bank; --bank gives each row's")
        items = bank_items(args.bank)
    print("| features | held-out rows | K | top-action accuracy (%) | KL |\n|---|---:|---|---:|---:|")
    for folder in args.features:
        hidden, target, rows = load_features(folder, "heldout")
        if args.targets_from_bank:
            target = bank_targets(rows, items, "held-out", target)
        if not head.scene_dim:
            kl, acc = kl_and_accuracy(head, hidden, target)
        else:
            joined = with_scene_vectors(hidden, rows, items, head_scene_part(head.scene_dim))
            kl, acc = kl_and_accuracy(SceneJoinedHead(head), joined, target)
        ks = json.dumps(sorted({k for _, k in rows}))
        print(f"| {folder} | {len(rows)} | {ks} | {100 * acc:.1f} | {kl:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
