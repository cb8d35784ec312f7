"""Stage 1 of ``luna-offline distill`` (``--stage head``): the DPP head on cached hidden states.

On a CPU the language model's forward pass is the whole cost of distillation (SmolLM2-135M reads about
200 tokens per second on one core), so stage 1 pays it once: for every training item and each of
``--variants`` draws of K ~ U{K_min..K_max} retrieved examples (Eq. 13) the frozen student (base + LoRA
adapters at their initialisation, which leave the base unchanged) computes h_{i*} (Eq. 14-16) exactly as
``DualHeadStudent.predict`` does at run time, reusing the KV cache of the shared system prompt. The
states are cached as safetensors shards (resumable: a rerun computes only what is missing). The head is
then trained on the cache for many epochs with the KL term of Eq. 17-18 (L_LM is constant while the LM is
frozen); the held-out items (K = ``--eval-k``) give the learning curve after every epoch.

Output (under ``--out``)::

    features/train-XXXXX.safetensors   h_{i*} (n, d), pi (n, 10); metadata: item ids and K per row
    features/heldout-XXXXX.safetensors
    head_state/                        head + AdamW moments (safetensors) + head_state.json (resume)
    head_history.json, head_curves.png per epoch: training KL, held-out KL and top-action accuracy
    data_curve.json                    held-out accuracy / KL of heads trained on 1/8..all of the cache
    student/                           the stage-1 student (init adapters + trained head); stage 2
                                       (``--stage joint --init <out>/student``) continues from it
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from luna_core.scene import HEAD_SCENE_PARTS

FEATURES = "features"
HEAD_STATE = "head_state"
SHARD_ROWS = 64  # rows per feature shard: a crash loses at most this much work


@dataclass
class HeadSettings:
    """Stage-1 settings beyond ``DistillSettings`` (saved with the head state; resume needs the same)."""

    variants: int = 1  # K draws per training item
    eval_k: int = 3
    head_epochs: int = 200
    head_lr: float = 1e-3
    head_batch: int = 64
    head_weight_decay: float = 0.01
    # The learning rate falls linearly from head_lr to this fraction of it at the last epoch (1.0 = constant,
    # the session-7 recipe, whose held-out KL swung by +-0.05 between consecutive epochs at the end).
    head_lr_final: float = 0.1
    # Early stopping: the training rows of this fraction of the training scenarios (chosen by a hash of the
    # scenario, independent of the held-out split) are not trained on but validate every epoch; the head of
    # the epoch with the lowest validation KL is the result. 0 = no validation, the last epoch's head.
    val_fraction: float = 0.1
    heldout_limit: int = 0  # held-out items to cache (0 = all)
    # Training rows from other caches of the same bank and split (e.g. a K = 0 cache beside a K = 1..3
    # one): the head sees every K without recomputing rows that exist.
    extra_features: list[str] = field(default_factory=list)
    # The head also reads the scene vector xi_t stored with each teacher item (``DecisionHead`` with
    # ``scene_dim``): nothing to recompute, the cached h_{i*} rows are joined with their items' vectors.
    # "all" of it, or "ego-road": its road, ego, light and navigation values (no recent decisions, no
    # objects); "" = h_{i*} alone.
    scene_vector: str = ""
    # Targets from the bank's items instead of the cache: a bank of the same frames relabelled by a new
    # teacher trains a head without recomputing h_{i*}. K = 0 rows take the new labels; a K > 0 prompt
    # holds other items' answers, so a K > 0 row must have been cached from this bank (``bank_targets``).
    targets_from_bank: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.head_lr_final <= 1.0:
            raise ValueError(f"HeadSettings.head_lr_final must be in (0, 1], got {self.head_lr_final}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"HeadSettings.val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.scene_vector and self.scene_vector not in HEAD_SCENE_PARTS:
            raise ValueError(f"HeadSettings.scene_vector must be '' or one of {sorted(HEAD_SCENE_PARTS)}, "
                             f"got {self.scene_vector!r}")


# ---- feature cache ------------------------------------------------------------------------------------
def feature_plan(train_ids: Sequence[str], held_ids: Sequence[str], variants: int, eval_k: int, seed: int,
                 k_min: int, k_max: int) -> dict[str, list[tuple[str, int]]]:
    """(item id, K) rows to cache: ``variants`` seeded draws of K per training item; K = eval_k held out.
    Rows stay in bank order: consecutive frames of one scenario share most of their prompt, whose KV cache
    ``predict`` reuses (about 3x fewer tokens to compute than in a shuffled order)."""
    rng = np.random.default_rng([seed, 7])
    train = [(i, int(rng.integers(k_min, k_max + 1))) for _ in range(variants) for i in train_ids]
    return {"train": train, "heldout": [(i, eval_k) for i in held_ids]}


@dataclass(frozen=True)
class CachePart:
    """Which shards of the plan one process computes: shard s when s % count == index. Several processes
    (``--cache-part 0/2``, ``--cache-part 1/2``) fill one cache in parallel; shards are written atomically."""

    index: int = 0
    count: int = 1
    # Only these shards of each split (``--cache-like``: the rows another cache holds, e.g. the same rows read
    # in another prompt form); None = every shard.
    only: Mapping[str, frozenset[int]] | None = None

    @classmethod
    def parse(cls, text: str) -> "CachePart":
        try:
            index, count = (int(v) for v in text.split("/"))
        except ValueError:
            raise ValueError(f"--cache-part {text!r}: expected I/N, e.g. 0/2") from None
        if not 0 <= index < count:
            raise ValueError(f"--cache-part {text!r}: I must be in 0..N-1")
        return cls(index, count)

    def owns(self, shard: int, split: str = "train") -> bool:
        return shard % self.count == self.index and (self.only is None or shard in self.only.get(split, ()))


def like_shards(folder: Path, plan: Mapping[str, Sequence[tuple[str, int]]]) -> dict[str, frozenset[int]]:
    """The shards of each split that the cache ``folder`` holds (``--cache-like``), each checked to hold its
    slice of ``plan``: the other cache must come from the same bank, seed and K settings."""
    from luna_offline.distill import DistillError

    if not folder.is_dir():
        raise DistillError(f"--cache-like {folder}: not a feature cache folder")
    found: dict[str, frozenset[int]] = {}
    for split, plan_rows in plan.items():
        indices = set()
        for path in _shards(folder, split):
            if not _holds_its_slice(path, _meta_rows(_meta(path)), plan_rows):
                raise DistillError(f"--cache-like {path}: holds rows of another plan (bank, seed or K settings)")
            indices.add(_shard_index(path))
        found[split] = frozenset(indices)
    if not any(found.values()):
        raise DistillError(f"--cache-like {folder}: holds no shards (train-*.safetensors, heldout-*.safetensors)")
    return found


def _meta_rows(meta: Mapping[str, str]) -> list[tuple[str, int]]:
    """A shard's rows, [(item id, K)], from its metadata."""
    return [(i, int(k)) for i, k in zip(json.loads(meta["ids"]), json.loads(meta["ks"]))]


def _shard_index(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def _holds_its_slice(path: Path, shard_rows: list[tuple[str, int]], plan_rows: Sequence[tuple[str, int]]) -> bool:
    """Whether the shard at ``path`` holds exactly its slice of the plan (shard s = rows s*SHARD_ROWS...)."""
    s = _shard_index(path)
    return shard_rows == list(plan_rows[s * SHARD_ROWS:(s + 1) * SHARD_ROWS])


def _shard_path(folder: Path, split: str, index: int) -> Path:
    return folder / f"{split}-{index:05d}.safetensors"


def _shards(folder: Path, split: str) -> list[Path]:
    return sorted(folder.glob(f"{split}-*.safetensors"))


def load_features(folder: Path, split: str, plan_rows: Sequence[tuple[str, int]] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]]:
    """All cached rows of ``split``: hidden (n, d), pi (n, 10), [(item id, K)]. With ``plan_rows`` every
    shard must hold exactly its slice of the plan (shard s = rows s*SHARD_ROWS...), else the cache belongs
    to another bank, seed or K setting."""
    from safetensors import safe_open

    hidden, target, rows = [], [], []
    for path in _shards(folder, split):
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            hidden.append(f.get_tensor("hidden").float())
            target.append(f.get_tensor("target"))
        shard_rows = _meta_rows(meta)
        if plan_rows is not None and not _holds_its_slice(path, shard_rows, plan_rows):
            raise ValueError(f"{path} holds rows of another plan (bank, seed or K settings changed); "
                             "use another --out")
        rows += shard_rows
    if not hidden:
        return torch.zeros(0, 0), torch.zeros(0, 10), []
    return torch.cat(hidden), torch.cat(target), rows


def _write_shard(folder: Path, split: str, index: int, hidden: list[torch.Tensor], target: list[np.ndarray],
                 rows: list[tuple[str, int]]) -> None:
    from safetensors.torch import save_file

    # float16 halves the cache that is committed between sessions; the head trains in float32.
    path = _shard_path(folder, split, index)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    save_file({"hidden": torch.stack(hidden).to(torch.float16).contiguous(),
               "target": torch.tensor(np.stack(target), dtype=torch.float32)}, str(tmp),
              metadata={"ids": json.dumps([r[0] for r in rows]), "ks": json.dumps([r[1] for r in rows])})
    tmp.replace(path)


def cache_features(student, plan: dict[str, list[tuple[str, int]]], items: dict, neighbours: dict,
                   folder: Path, progress: bool = True, part: CachePart = CachePart()) -> None:
    """Compute and store h_{i*} for every planned shard of ``part`` not yet cached (resumable by shard)."""
    from tqdm.auto import tqdm

    from luna_core.types import validate_distribution

    folder.mkdir(parents=True, exist_ok=True)
    for split in sorted(plan, key=lambda name: name != "heldout"):  # the held-out rows first: small, needed by any run
        rows = plan[split]
        # Shards in a seeded random order: the shards cached so far are a uniform sample of the plan's
        # scenarios, whenever a run stops.
        order = np.random.default_rng([len(rows), 13]).permutation(math.ceil(len(rows) / SHARD_ROWS))
        shards = [int(s) for s in order if part.owns(int(s), split) and not _shard_path(folder, split, int(s)).exists()]
        total = sum(len(rows[s * SHARD_ROWS:(s + 1) * SHARD_ROWS]) for s in shards)
        bar = tqdm(total=total, desc=f"h_i* {split} part {part.index}/{part.count}", unit="row",
                   disable=not progress)
        with torch.inference_mode():
            for s in shards:
                chunk = rows[s * SHARD_ROWS:(s + 1) * SHARD_ROWS]
                hidden, target = [], []
                for item_id, k in chunk:
                    item = items[item_id]
                    fitted = student.encoder.fit(item.query, neighbours[item_id][:k])
                    h, _ = student._commitment_hidden(fitted)  # the run-time path, system-prompt KV reused
                    hidden.append(h.detach().to("cpu"))
                    target.append(validate_distribution(item.distribution))
                    bar.update(1)
                _write_shard(folder, split, s, hidden, target, chunk)
        bar.close()


def _meta(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()


def _with_extra_rows(x: torch.Tensor, y: torch.Tensor, rows: list[tuple[str, int]], folders: Sequence[str],
                     train_ids: set[str]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, int]]]:
    """``x, y, rows`` plus the training rows of the caches in ``folders``. Every extra row must be a training item
    of this run's split: a row of a held-out item (another split, seed or bank) would leak into training."""
    from luna_offline.distill import DistillError

    rows = list(rows)
    for folder in folders:
        ex, ey, extra = load_features(Path(folder), "train")
        if not extra:
            raise DistillError(f"--extra-features {folder}: no cached training rows (train-*.safetensors)")
        foreign = sorted({i for i, _ in extra} - train_ids)
        if foreign:
            raise DistillError(f"--extra-features {folder}: {len(foreign)} rows are not training items of this "
                               f"run (e.g. {foreign[0]}): another bank, seed or held-out split")
        if ex.shape[1] != x.shape[1]:
            raise DistillError(f"--extra-features {folder}: hidden size {ex.shape[1]}, this cache {x.shape[1]} "
                               "(another base model)")
        x, y = torch.cat([x, ex.to(x.device)]), torch.cat([y, ey.to(y.device)])
        rows += extra
    return x, y, rows


class SceneJoinedHead(torch.nn.Module):
    """A ``DecisionHead`` that reads (h_{i*}, xi_t), trained on cached rows that hold both side by side,
    [h | xi] (n, d_model + scene_dim), so that ``train_head`` and ``kl_and_accuracy`` serve both heads."""

    def __init__(self, head) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x[:, :self.head.d_model], x[:, self.head.d_model:])


def with_scene_vectors(x: torch.Tensor, rows: Sequence[tuple[str, int]], items: dict, part: Sequence[int]
                       ) -> torch.Tensor:
    """[h | xi] rows: each cached h_{i*} beside the ``part`` (``luna_core.scene.HEAD_SCENE_PARTS``) of its
    teacher item's scene values (``luna_core.scene.item_head_values``)."""
    from luna_core.scene import item_head_values
    from luna_offline.distill import DistillError

    missing = [i for i, _ in rows if items[i].scene_vector is None]
    if missing:
        raise DistillError(f"--head-scene-vector: {len(missing)} teacher item(s) carry no scene vector "
                           f"(e.g. {missing[0]!r}); collect stores it with every item")
    values = np.stack([item_head_values(items[i])[list(part)] for i, _ in rows])
    return torch.cat([x, torch.from_numpy(values).to(x.device)], dim=1)


def bank_targets(rows: Sequence[tuple[str, int]], items: dict, split: str = "training",
                 cached: torch.Tensor | None = None) -> torch.Tensor:
    """pi (n, 10) of the rows' teacher items (``HeadSettings.targets_from_bank``), each an item of ``items``,
    the bank's ``split`` items (a row of the other split would leak across it).

    A K = 0 row's state does not depend on any answer, so it takes the bank's label whatever bank it was
    cached with. A K > 0 row's prompt holds its examples' answers: it is kept only where its ``cached``
    target already is this bank's, i.e. it was cached from this bank (a cache of another teacher's bank
    fails that on the items whose labels changed, and is refused)."""
    from luna_core.types import ACTION_CODES, validate_distribution
    from luna_offline.distill import DistillError

    missing = [i for i, _ in rows if i not in items]
    if missing:
        raise DistillError(f"--targets-from-bank: {len(missing)} cached rows are not {split} items of the bank "
                           f"(e.g. {missing[0]!r}): the bank must hold the same frames, split alike")
    y = torch.from_numpy(np.stack([validate_distribution(items[i].distribution) for i, _ in rows])).float() \
        if rows else torch.zeros((0, len(ACTION_CODES)))
    prompted = [n for n, (_, k) in enumerate(rows) if k != 0]
    if prompted:
        stale = [rows[n] for n in prompted
                 if cached is None or not torch.allclose(cached[n].float().cpu(), y[n], atol=1e-4)]
        if stale:
            raise DistillError(f"--targets-from-bank: {len(stale)} cached rows have K > 0 and another teacher's "
                               f"target (e.g. {stale[0]}): their prompts hold that teacher's answers; cache the "
                               "K > 0 rows from this bank")
    return y


def is_validation(item_id: str, fraction: float) -> bool:
    """Whether a training item's scenario validates the head (``HeadSettings.val_fraction``): a hash of the
    scenario below ``fraction``, salted so that it does not repeat the held-out split's choice."""
    from luna_offline.distill import scenario_draw

    return scenario_draw(item_id, "validation:") < fraction


def split_validation(x: torch.Tensor, y: torch.Tensor, rows: Sequence[tuple[str, int]], fraction: float
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(training rows, validation rows) by scenario (``is_validation``)."""
    mask = torch.tensor([is_validation(i, fraction) for i, _ in rows], dtype=torch.bool, device=x.device)
    return (x[~mask], y[~mask]), (x[mask], y[mask])


# ---- head training ------------------------------------------------------------------------------------
def kl_and_accuracy(head, hidden: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """Mean KL(pi || pi_hat) (Eq. 17) and top-action accuracy of ``head`` on cached rows."""
    if len(hidden) == 0:
        return math.nan, math.nan
    with torch.no_grad():
        log_q = torch.log_softmax(head(hidden), dim=-1)
        kl = F.kl_div(log_q, target, reduction="batchmean")
        acc = (log_q.argmax(-1) == target.argmax(-1)).float().mean()
    return float(kl), float(acc)


def _save_head_state(folder: Path, head, optimizer, epoch: int, history: list[dict], settings: dict,
                     best: dict[str, torch.Tensor] | None = None) -> None:
    """Head weights (and the best epoch's, with validation) and AdamW moments as safetensors (no pickle),
    the rest as JSON; atomic by rename."""
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(tmp / "head.safetensors"))
    if best is not None:
        save_file({k: v.contiguous() for k, v in best.items()}, str(tmp / "best_head.safetensors"))
    moments, steps = {}, {}
    for i, p in enumerate(head.parameters()):
        st = optimizer.state.get(p)
        if st:
            moments[f"{i}.exp_avg"] = st["exp_avg"].contiguous()
            moments[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
            steps[str(i)] = float(st["step"])
    save_file(moments or {"empty": torch.zeros(1)}, str(tmp / "optimizer.safetensors"))
    (tmp / "head_state.json").write_text(json.dumps({"epoch": epoch, "steps": steps, "history": history,
                                                     "settings": settings}))
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        import shutil

        shutil.rmtree(old)


def _load_head_state(folder: Path, head, optimizer
                     ) -> tuple[int, list[dict], dict, dict[str, torch.Tensor] | None]:
    from safetensors.torch import load_file

    state = json.loads((folder / "head_state.json").read_text())
    best = load_file(str(folder / "best_head.safetensors")) if (folder / "best_head.safetensors").exists() else None
    head.load_state_dict(load_file(str(folder / "head.safetensors")))
    moments = load_file(str(folder / "optimizer.safetensors"))
    for i, p in enumerate(head.parameters()):
        if str(i) in state["steps"]:
            optimizer.state[p] = {"step": torch.tensor(state["steps"][str(i)]),
                                  "exp_avg": moments[f"{i}.exp_avg"], "exp_avg_sq": moments[f"{i}.exp_avg_sq"]}
    return state["epoch"], state["history"], state["settings"], best


def head_lr_factor(epoch: int, epochs: int, final: float) -> float:
    """Linear decay from 1 at the first epoch to ``final`` at the last (a function of the epoch alone, so a
    resumed run follows the same schedule)."""
    return 1.0 - (1.0 - final) * epoch / max(1, epochs - 1)


def train_head(head, train: tuple[torch.Tensor, torch.Tensor], held: tuple[torch.Tensor, torch.Tensor],
               settings: HeadSettings, seed: int, state_dir: Path | None = None, epochs: int | None = None,
               progress: bool = True, val: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[dict]:
    """Train ``head`` on cached (hidden, pi) rows; one history row per epoch (training KL, held-out KL and
    accuracy, and with ``val`` the validation KL and accuracy). With ``val`` rows the head ends as it was
    at the epoch of the lowest validation KL (early stopping; the held-out rows never choose). With
    ``state_dir`` it checkpoints every epoch and resumes from there: the shuffle of epoch e depends only on
    (seed, e), so a resumed run gives the same head as an uninterrupted one."""
    from tqdm.auto import tqdm

    x, y = train
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.head_lr, weight_decay=settings.head_weight_decay)
    start, history, best = 0, [], None
    validate = val is not None and len(val[0]) > 0
    keys = {k: v for k, v in asdict(settings).items() if k != "head_epochs"}  # more epochs may follow
    if state_dir is not None and (state_dir / "head_state.json").exists():
        start, history, saved, best = _load_head_state(state_dir, head, optimizer)
        if saved != keys:
            raise ValueError(f"{state_dir} was trained with other head settings ({saved}); use another --out")
    total = settings.head_epochs if epochs is None else epochs
    for epoch in tqdm(range(start, total), initial=start, total=total, desc="head", unit="epoch",
                      disable=not progress):
        for group in optimizer.param_groups:
            group["lr"] = settings.head_lr * head_lr_factor(epoch, settings.head_epochs, settings.head_lr_final)
        order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(x)))
        losses = []
        head.train()
        for b in range(0, len(x), settings.head_batch):
            idx = order[b:b + settings.head_batch]
            log_q = torch.log_softmax(head(x[idx]), dim=-1)
            loss = F.kl_div(log_q, y[idx], reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()) * len(idx))
        head.eval()
        kl, acc = kl_and_accuracy(head, *held)
        history.append({"epoch": epoch + 1, "train_kl": sum(losses) / len(x), "heldout_kl": kl,
                        "heldout_accuracy": acc})
        if validate:
            vkl, vacc = kl_and_accuracy(head, *val)
            history[-1].update(val_kl=vkl, val_accuracy=vacc)
            earlier = [h["val_kl"] for h in history[:-1] if "val_kl" in h]
            if best is None or not earlier or vkl < min(earlier):
                best = {k: v.detach().clone() for k, v in head.state_dict().items()}
        if state_dir is not None:
            _save_head_state(state_dir, head, optimizer, epoch + 1, history, keys, best)
    if validate and best is not None:
        head.load_state_dict(best)
    return history


def best_epoch(history: list[dict]) -> dict:
    """The history row of the head ``train_head`` kept: the lowest validation KL, else the last epoch."""
    with_val = [h for h in history if "val_kl" in h]
    return min(with_val, key=lambda h: h["val_kl"]) if with_val else history[-1]


def data_curve(make_head, train: tuple[torch.Tensor, torch.Tensor], held: tuple[torch.Tensor, torch.Tensor],
               settings: HeadSettings, seed: int, fractions: Sequence[float] = (0.125, 0.25, 0.5, 1.0),
               val: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[dict]:
    """Held-out KL / accuracy of heads trained on growing seeded subsets of the cache: a curve still rising
    at 1.0 says more data would help; a flat one says capacity or label noise limits the student."""
    out = []
    n = len(train[0])
    perm = torch.from_numpy(np.random.default_rng([seed, 11]).permutation(n))
    for frac in fractions:
        idx = perm[:max(1, int(round(frac * n)))]
        head = make_head()
        train_head(head, (train[0][idx], train[1][idx]), held, settings, seed, progress=False, val=val)
        kl, acc = kl_and_accuracy(head, *held)
        out.append({"fraction": frac, "rows": len(idx), "heldout_kl": kl, "heldout_accuracy": acc})
    return out


def plot_head_history(history: list[dict], curve: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    ep = [h["epoch"] for h in history]
    axes[0].plot(ep, [h["train_kl"] for h in history], label="train")
    axes[0].plot(ep, [h["heldout_kl"] for h in history], label="held out")
    if "val_kl" in history[-1]:
        axes[0].plot(ep, [h.get("val_kl", math.nan) for h in history], label="validation")
        axes[0].axvline(best_epoch(history)["epoch"], color="grey", ls=":", lw=1, label="kept (lowest validation)")
    axes[0].set_title("KL(pi || pi_hat) (Eq. 17)", fontsize=9)
    axes[1].plot(ep, [100 * h["heldout_accuracy"] for h in history])
    axes[1].set_title("held-out top-action accuracy (%)", fontsize=9)
    for ax in axes[:2]:
        ax.set_xlabel("epoch")
    if curve:
        rows = [c["rows"] for c in curve]
        axes[2].plot(rows, [100 * c["heldout_accuracy"] for c in curve], marker="o", label="accuracy (%)")
        ax2 = axes[2].twinx()
        ax2.plot(rows, [c["heldout_kl"] for c in curve], marker="s", color="tab:red", label="KL")
        axes[2].set_xscale("log")
        axes[2].set_title("held out vs training rows (data curve)", fontsize=9)
        axes[2].set_xlabel("training rows")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: What ``run_head_stage`` does with the feature cache (``--features``).
FEATURE_MODES = ("compute", "only", "cached")


def run_head_stage(settings, head_settings: HeadSettings, prompts=None, progress: bool = True,
                   features: str = "compute", part: CachePart = CachePart(), like: Path | None = None
                   ) -> Path | None:
    """Stage 1 end to end (module docstring); ``settings`` is the run's ``DistillSettings``.

    ``features``: "compute" fills the missing shards of ``part`` and trains the head on the cache;
    "only" fills them and returns None (parallel processes, each with its own ``part``); "cached" trains on
    the shards that exist (a cache filled over several sessions) without computing any. ``like``: compute only
    the shards that this other cache holds (``--cache-like``)."""
    from luna_core.memory import MemoryBank
    from luna_core.student import DualHeadStudent, StudentConfig
    from luna_offline.distill import DistillError, retrieve_examples, split_group, split_items, subset

    if features not in FEATURE_MODES:
        raise ValueError(f"features {features!r} is not one of {', '.join(FEATURE_MODES)}")
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    bank = MemoryBank.open(settings.bank)
    try:
        train, held = split_items(list(bank), settings.heldout_fraction)
        train_by_id, held_by_id = {it.id: it for it in train}, {it.id: it for it in held}  # before any subset
        train = subset(train, settings.limit, settings.seed)
        held = subset(held, head_settings.heldout_limit, settings.seed)
        if not train:
            raise DistillError(f"memory bank {settings.bank} has no teacher items with a distribution for training")
        neighbours: dict[str, list] = {}
        if features != "cached":
            _, all_held = split_items(list(bank), settings.heldout_fraction)
            exclude = {it.id for it in all_held}
            groups: dict[str, set[str]] = {}
            for it in bank.items:
                groups.setdefault(split_group(it.id), set()).add(it.id)
            k_need = max(settings.k_max, head_settings.eval_k)
            # Training examples never come from the item's own scenario nor a held-out one; held-out items
            # retrieve from the training items only (as ``evaluate`` does).
            neighbours = {it.id: retrieve_examples(bank, it, k_need, exclude | groups[split_group(it.id)])
                          for it in train}
            neighbours.update({it.id: retrieve_examples(bank, it, k_need, exclude) for it in held})
    finally:
        bank.close()
    items = {it.id: it for it in [*train, *held]}
    plan = feature_plan([it.id for it in train], [it.id for it in held], head_settings.variants,
                        head_settings.eval_k, settings.seed, settings.k_min, settings.k_max)
    config = StudentConfig(base_model=settings.base_model, max_context_tokens=settings.max_context_tokens,
                           **settings.prompt_settings(),
                           device="cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu")
    if like is not None:  # checked before the base model loads
        part = replace(part, only=like_shards(like, plan))
    student = DualHeadStudent.from_base(config, prompts)
    t0 = time.process_time()
    if features != "cached":
        cache_features(student, plan, items, neighbours, out / FEATURES, progress, part)
    feature_cpu = time.process_time() - t0
    if features == "only":
        return None
    try:
        # Relabelled: the cache's rows stand for themselves (a bank collected again may list its items in
        # another order, so another plan); bank_targets checks each row's split instead.
        relabel = head_settings.targets_from_bank
        x, y, rows = load_features(out / FEATURES, "train", None if relabel else plan["train"])
        hx, hy, held_rows = load_features(out / FEATURES, "heldout", None if relabel else plan["heldout"])
    except ValueError as exc:
        raise DistillError(str(exc)) from None
    if not rows:
        raise DistillError(f"{out / FEATURES} holds no cached training rows; run with --features compute or only")
    x, y, rows = _with_extra_rows(x, y, rows, head_settings.extra_features, {it.id for it in train})
    if relabel:
        y, hy = bank_targets(rows, train_by_id, "training", y), bank_targets(held_rows, held_by_id, "held-out", hy)
    d_model = x.shape[1]
    if head_settings.scene_vector:
        from luna_core.scene import SCENE_VECTOR_DIM

        stored = {len(train_by_id[i].scene_vector) for i, _ in rows if train_by_id[i].scene_vector is not None}
        if stored - {SCENE_VECTOR_DIM}:
            raise DistillError(f"the bank's scene vectors have {sorted(stored)} values, "
                               f"luna_core.scene.scene_vector gives {SCENE_VECTOR_DIM}: collect the bank again")
        part = HEAD_SCENE_PARTS[head_settings.scene_vector]
        # Looked up among all of the bank's items of each split: relabelled rows need not be this run's subset.
        x = with_scene_vectors(x, rows, train_by_id, part)
        hx = with_scene_vectors(hx, held_rows, held_by_id, part)
        student.config.head_scene_dim = len(part)
    x, hx = x.to(student.device), hx.to(student.device)
    y, hy = y.to(student.device), hy.to(student.device)
    (x, y), val = split_validation(x, y, rows, head_settings.val_fraction)

    def fresh_head():
        """The stage-1 head, as a module of the cached rows (``SceneJoinedHead`` where it reads xi_t)."""
        from luna_core.student.model import decision_head

        torch.manual_seed(settings.seed)
        head = decision_head(student.config, d_model).to(student.device)
        if not head.scene_dim:
            return head
        head.set_scene_normalisation(x[:, d_model:])  # the training rows' scale, saved with the weights
        return SceneJoinedHead(head)

    # A head on h_i* alone is the student's own (initialised with the student, as before the scene-vector head).
    trained = fresh_head() if head_settings.scene_vector else student.head
    if head_settings.val_fraction > 0 and not len(val[0]):
        print(f"[distill] no training scenario fell in the validation fraction {head_settings.val_fraction}: "
              "the last epoch's head is kept", flush=True)
    t0 = time.process_time()
    history = train_head(trained, (x, y), (hx, hy), head_settings, settings.seed, out / HEAD_STATE,
                         progress=progress, val=val)
    student.head = trained.head if isinstance(trained, SceneJoinedHead) else trained
    head_cpu = time.process_time() - t0
    curve = data_curve(fresh_head, (x, y), (hx, hy), head_settings, settings.seed, val=val) if len(hx) else []
    (out / "head_history.json").write_text(json.dumps(history))
    (out / "data_curve.json").write_text(json.dumps({"curve": curve, "feature_cpu_s": feature_cpu,
                                                     "head_cpu_s": head_cpu, "train_rows": len(x),
                                                     "validation_rows": len(val[0]), "kept": best_epoch(history),
                                                     "planned_train_rows": len(plan["train"]),
                                                     "heldout_rows": len(hx)}, indent=2))
    plot_head_history(history, curve, out / "head_curves.png")
    student.eval()
    return student.save_pretrained(out / "student")
