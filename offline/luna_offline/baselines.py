"""``luna-offline baselines``: what is learnable from the descriptor, on the student's held-out frames.

Every baseline predicts pi_hat for the held-out teacher items of a memory bank (the split of ``distill``
and ``evaluate``: whole scenarios held out by a hash of their name) from the training items only, and is
scored like the student (top-action accuracy, KL(pi || pi_hat) of Eq. 17):

* ``majority``: always the training items' most frequent top action; pi_hat = their mean distribution.
* ``gbt``: gradient-boosted trees (scikit-learn ``HistGradientBoostingClassifier``) on the numeric scene
  vector xi_t (``luna_core.scene.scene_vector``, stored with each teacher item). The soft labels are
  learnt as weighted rows (one row per action with pi(a) > 0, weight pi(a)), so predict_proba estimates
  pi rather than only its argmax. The non-language classifier the student must beat.
* ``gbt+timing``: the same trees on xi_t followed by the objects' timing (``luna_core.scene.object_timing``,
  read back from each item's query): what the closest approach and the crossing paths add to the descriptor.
* ``knn``: retrieval only: the similarity-weighted mean pi of the K nearest training items by the bank's
  own embedding (what RAG hands the student, without the student).
* ``zero-shot``: the base language model without adapters or head (``evaluate.zero_shot_distribution``:
  its next-token probabilities of each action code after the answer prefix), on at most
  ``--zero-shot-limit`` held-out items (one forward pass each).

Also the labels of the whole bank (top-action counts and shares, mean pi, mean entropy of pi), the
class balance the bank's card quotes. Writes ``baselines.json`` and ``baselines.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from luna_core.scene import item_head_values
from luna_core.types import ACTION_CODES, NUM_ACTIONS, MemoryItem, validate_distribution
from luna_offline.distill import split_group, split_items, subset
from luna_offline.evaluate import kl_divergence, majority_baseline

EPS = 1e-4  # probability floor of a baseline's pi_hat (an action it never saw must not make KL infinite)


@dataclass
class BaselineResult:
    name: str
    n: int
    accuracy: float
    kl: float
    seconds: float  # CPU time to fit and predict
    note: str = ""


def score(name: str, held: Sequence[MemoryItem], predicted: np.ndarray, seconds: float,
          note: str = "") -> BaselineResult:
    """Top-action accuracy and mean KL(pi || pi_hat) of (N, 10) predictions for ``held``."""
    if len(held) == 0:
        raise ValueError(f"baseline {name}: no held-out items to score")
    p = np.clip(predicted, EPS, None)
    p = p / p.sum(axis=1, keepdims=True)
    acc = float(np.mean([int(np.argmax(q)) == int(np.argmax(it.distribution)) for it, q in zip(held, p)]))
    kl = float(np.mean([kl_divergence(it.distribution, q) for it, q in zip(held, p)]))
    return BaselineResult(name, len(held), acc, kl, seconds, note)


def label_stats(items: Sequence[MemoryItem]) -> dict:
    """Class balance of teacher items: per action the top-action count and share and the mean pi; the mean
    entropy of pi (nats)."""
    pis = np.stack([validate_distribution(it.distribution) for it in items])
    tops = np.bincount(pis.argmax(axis=1), minlength=NUM_ACTIONS)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.nansum(np.where(pis > 0, pis * np.log(pis), 0.0), axis=1)
    return {"items": len(items), "mean_entropy": float(entropy.mean()),
            "actions": {code: {"top": int(tops[a]), "share": float(tops[a] / len(items)),
                               "mean_pi": float(pis[:, a].mean())} for a, code in enumerate(ACTION_CODES)}}


def _vectors(items: Sequence[MemoryItem], where: str, timing: bool = False) -> np.ndarray:
    """(n, SCENE_VECTOR_DIM) stored scene vectors, or with ``timing`` (n, HEAD_SCENE_VALUES_DIM): each
    followed by its objects' timing (``luna_core.scene.item_head_values``)."""
    missing = [it.id for it in items if it.scene_vector is None]
    if missing:
        raise ValueError(f"{where}: {len(missing)} teacher item(s) carry no scene vector (e.g. {missing[0]!r}); "
                         "collect stores it with every item")
    if timing:
        return np.stack([item_head_values(it) for it in items]).astype(np.float64)
    return np.stack([np.asarray(it.scene_vector, dtype=np.float64) for it in items])


class SceneVectorTrees:
    """Gradient-boosted trees on the scene vector (with ``timing``: followed by the objects' timing), trained
    on the teacher's soft labels (each action with mass is a row weighted by it)."""

    def __init__(self, train: Sequence[MemoryItem], seed: int = 0, timing: bool = False) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier
        from threadpoolctl import threadpool_limits

        x = _vectors(train, "gbt training items", timing)
        pis = np.stack([validate_distribution(it.distribution) for it in train])
        rows, cols = np.nonzero(pis > 0.0)
        self.model = HistGradientBoostingClassifier(max_iter=150, learning_rate=0.1, max_leaf_nodes=31,
                                                    l2_regularization=1.0, random_state=seed)
        with threadpool_limits(1):  # OpenMP threads only thrash on a shared machine
            self.model.fit(x[rows], cols, sample_weight=pis[rows, cols])

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        """(n, 10) pi_hat for scene vectors (n, SCENE_VECTOR_DIM); actions never seen in training get 0."""
        from threadpoolctl import threadpool_limits

        out = np.zeros((len(vectors), NUM_ACTIONS))
        with threadpool_limits(1):
            out[:, self.model.classes_] = self.model.predict_proba(vectors)
        return out


def gbt_predict(train: Sequence[MemoryItem], held: Sequence[MemoryItem], seed: int = 0,
                timing: bool = False) -> np.ndarray:
    """(len(held), 10) pi_hat of ``SceneVectorTrees`` trained on ``train``."""
    return SceneVectorTrees(train, seed, timing).predict(_vectors(held, "gbt held-out items", timing))


def knn_predict(train: Sequence[MemoryItem], held: Sequence[MemoryItem], k: int = 10) -> np.ndarray:
    """(len(held), 10) similarity-weighted mean pi of the ``k`` nearest training items (cosine on the
    stored embeddings, which the bank keeps unit length), never from the item's own scenario."""
    emb = np.stack([it.embedding for it in train]).astype(np.float64)
    pis = np.stack([validate_distribution(it.distribution) for it in train])
    groups = np.array([split_group(it.id) for it in train])
    out = np.zeros((len(held), NUM_ACTIONS))
    for n, it in enumerate(held):
        sim = emb @ np.asarray(it.embedding, dtype=np.float64)
        sim[groups == split_group(it.id)] = -np.inf
        top = np.argsort(-sim)[:k]
        w = np.maximum(sim[top], 0.0) + 1e-6
        out[n] = w @ pis[top] / w.sum()
    return out


def zero_shot_predict(held: Sequence[MemoryItem], base_model: str, threads: int) -> np.ndarray:
    import torch

    from luna_core.student import DualHeadStudent, StudentConfig
    from luna_offline.evaluate import zero_shot_distribution

    torch.set_num_threads(threads)
    student = DualHeadStudent.from_base(StudentConfig(base_model=base_model, device="cpu"))
    return np.stack([zero_shot_distribution(student, it.query) for it in held])


def _timed(fn: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def run_baselines(bank_path: str, heldout_fraction: float = 0.1, knn_k: int = 10, zero_shot_limit: int = 0,
                  base_model: str = "smollm2-135m-instruct", threads: int = 1, seed: int = 0,
                  heldout_limit: int = 0) -> dict:
    """The baselines on the held-out items, or on the seeded subset of ``heldout_limit`` of them that
    ``distill --heldout-limit`` and ``evaluate --limit`` draw with the same seed (the same frames)."""
    from luna_core.memory import MemoryBank

    bank = MemoryBank.open(bank_path)
    try:
        train, held = split_items(list(bank), heldout_fraction)
    finally:
        bank.close()
    labels = label_stats([*train, *held])
    held = subset(held, heldout_limit, seed)
    if not train or not held:
        raise ValueError(f"memory bank {bank_path}: need training and held-out teacher items (got {len(train)} "
                         f"and {len(held)} with heldout_fraction={heldout_fraction})")
    results = []
    t0 = time.process_time()
    maj = majority_baseline(train, held)
    results.append(BaselineResult("majority", len(held), maj["accuracy"], maj["kl"], time.process_time() - t0,
                                  f"always {maj['action']}"))
    p, s = _timed(lambda: gbt_predict(train, held, seed))
    results.append(score("gbt", held, p, s, "HistGradientBoosting on the scene vector, soft labels"))
    p, s = _timed(lambda: gbt_predict(train, held, seed, timing=True))
    results.append(score("gbt+timing", held, p, s, "the same on the scene vector and the objects' timing"))
    p, s = _timed(lambda: knn_predict(train, held, knn_k))
    results.append(score("knn", held, p, s, f"k = {knn_k} nearest by the bank's embedding"))
    if zero_shot_limit:
        some = subset(held, zero_shot_limit, seed)
        p, s = _timed(lambda: zero_shot_predict(some, base_model, threads))
        results.append(score("zero-shot", some, p, s, f"{base_model}, no adapters, {len(some)} items"))
    groups_train = {split_group(it.id) for it in train}
    groups_held = {split_group(it.id) for it in held}
    return {"bank": str(bank_path), "heldout_fraction": heldout_fraction, "labels": labels,
            "train_items": len(train),
            "heldout_items": len(held), "train_scenarios": len(groups_train), "heldout_scenarios": len(groups_held),
            "shared_scenarios": sorted(groups_train & groups_held),
            "results": [asdict(r) for r in results]}


def markdown(report: dict) -> str:
    lines = [f"Bank `{report['bank']}`: {report['train_items']} training items ({report['train_scenarios']} "
             f"scenarios), {report['heldout_items']} held-out items ({report['heldout_scenarios']} scenarios).", "",
             "| baseline | held-out items | top-action accuracy (%) | KL | CPU s | note |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['name']} | {r['n']} | {100 * r['accuracy']:.1f} | {r['kl']:.4f} | {r['seconds']:.1f} | "
                     f"{r['note']} |")
    labels = report["labels"]
    lines += ["", f"Labels of all {labels['items']} teacher items (mean entropy of pi: "
                  f"{labels['mean_entropy']:.2f} nats):", "", "| action | top-action count | share (%) | mean pi |", "|---|---|---|---|"]
    for code, a in labels["actions"].items():
        lines.append(f"| {code} | {a['top']} | {100 * a['share']:.1f} | {a['mean_pi']:.3f} |")
    return "\n".join(lines) + "\n"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("baselines", help="majority, GBT, kNN and zero-shot baselines on the held-out frames",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bank", required=True, help="memory bank with teacher items")
    p.add_argument("--out", required=True, type=Path, help="output directory (baselines.json, baselines.md)")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="must match distill's")
    p.add_argument("--knn-k", type=int, default=10)
    p.add_argument("--zero-shot-limit", type=int, default=0,
                   help="held-out items for the zero-shot base model (0 = skip; one forward pass each)")
    p.add_argument("--base-model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-limit", type=int, default=0,
                   help="score a seeded subset of this many held-out items, the same as distill's --heldout-limit "
                        "and evaluate's --limit with the same seed (0 = all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = run_baselines(args.bank, args.heldout_fraction, args.knn_k, args.zero_shot_limit, args.base_model,
                           args.threads, args.seed, args.heldout_limit)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "baselines.json").write_text(json.dumps(report, indent=2))
    (args.out / "baselines.md").write_text(markdown(report))
    print(markdown(report))
    return 0
