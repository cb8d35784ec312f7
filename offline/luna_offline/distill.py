"""``luna-offline distill``: dual-objective distillation of the student (LUNA-AD Eq. 13-18).

Each teacher item v = <Q_md, e, pi, A_sum> of the memory bank becomes one sample: K ~ U{K_min..K_max}
retrieved examples (cosine retrieval from the same bank, never from the item's own scenario nor a
held-out item)
as earlier chat turns (Eq. 13), the current Q_md, then A_sum as the assistant answer (Eq. 14). The loss
is L_LM over the sequence + alpha * KL(pi || pi_hat) at the commitment position (Eq. 15-18).

On CUDA the defaults follow LUNA-AD Sec. IV-B: 4-bit NF4 base, LoRA r 16, gradient checkpointing and
8-bit AdamW (bitsandbytes); several GPUs through ``accelerate launch -m luna_offline.cli distill ...``.
On the CPU the same code runs at small scale with fp32 and torch AdamW.

Two stages for hardware without a GPU (``--stage``): ``head`` trains the DPP head on cached hidden states
of the frozen base (``luna_offline.distill_head``: one forward pass per (sample, K) variant, then many
cheap epochs); ``joint`` (the default) trains LoRA adapters and head together with the full objective,
from scratch or from a stage-1 student (``--init <head run>/student``).

Output directory (``--stage joint``)::

    student/            the distilled student (DualHeadStudent.save_pretrained)
    checkpoint/         the last checkpoint: student + optimizer.pt + trainer_state.json (resume)
    history.json        per optimizer step: total, LM and KL loss, learning rate
    loss_curves.png     the loss curves
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from luna_core.scene import HEAD_SCENE_PARTS, item_head_values
from luna_core.student import DualHeadStudent, StudentConfig
from luna_core.student.config import PROMPT_FORMS
from luna_core.student.model import StudentPrompts, default_prompts, scene_tensor
from luna_core.types import MemoryItem, validate_distribution
from luna_offline.distill_head import FEATURE_MODES, CachePart, HeadSettings, run_head_stage

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"


class DistillError(ValueError):
    """Bad distillation input (bank, settings, or a checkpoint that does not match them)."""


@dataclass
class DistillSettings:
    """Everything that determines a distillation run (saved with every checkpoint)."""

    bank: str
    out: str
    base_model: str = "smollm2-135m-instruct"
    epochs: int = 1
    max_steps: int = 0  # optimizer steps; 0 = all epochs
    batch_size: int = 1
    grad_accum: int = 8
    lr: float = 2e-4
    warmup_steps: int = 10
    alpha: float = 0.7
    k_min: int = 0
    k_max: int = 3
    heldout_fraction: float = 0.1
    limit: int = 0  # use at most this many training items, a seeded random subset (0 = all); small CPU runs
    seed: int = 0
    max_context_tokens: int = 2048
    # The student's prompt (StudentConfig.example_objects, query_objects, prompt_form; student.context).
    example_objects: int = 0
    query_objects: int = 0
    prompt_form: str = "compact"
    quantization: str = "auto"  # auto = nf4 on CUDA, none on CPU
    gradient_checkpointing: str = "auto"  # auto = on with CUDA
    optimizer: str = "auto"  # auto = adamw8bit on CUDA, adamw on CPU
    device: str = "auto"
    checkpoint_every: int = 50
    max_time: float = 0.0  # s of training wall time after which the run stops at the next optimizer step (0 = none)
    init: str = ""  # a saved student to start from (stage 2 after ``--stage head``); "" = fresh adapters and head

    def validate(self) -> None:
        if not 0 <= self.k_min <= self.k_max:
            raise DistillError(f"need 0 <= k_min <= k_max, got k_min={self.k_min}, k_max={self.k_max}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise DistillError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        for name in ("epochs", "batch_size", "grad_accum", "checkpoint_every"):
            if getattr(self, name) <= 0:
                raise DistillError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or self.alpha < 0:
            raise DistillError(f"lr must be > 0 and alpha >= 0, got lr={self.lr}, alpha={self.alpha}")
        for name, allowed in (("quantization", ("auto", "none", "nf4")),
                              ("gradient_checkpointing", ("auto", "on", "off")),
                              ("optimizer", ("auto", "adamw", "adamw8bit"))):
            if getattr(self, name) not in allowed:
                raise DistillError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    def resumable_keys(self) -> dict:
        """The settings a checkpoint must share with the run that resumes it."""
        d = asdict(self)
        for key in ("out", "checkpoint_every", "max_steps", "epochs", "max_time"):
            d.pop(key)
        return d

    def prompt_settings(self) -> dict:
        """The ``StudentConfig`` fields that shape the student's prompt."""
        return {"example_objects": self.example_objects, "query_objects": self.query_objects,
                "prompt_form": self.prompt_form}


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps done
    samples_seen: int = 0  # samples consumed in the sample order (for resuming mid-epoch)
    history: list[dict] = field(default_factory=list)


# ---- data -------------------------------------------------------------------------------------------
def split_group(item_id: str) -> str:
    """The unit of the held-out split: the scenario of a frame item (ids ``<scenario>@<time>`` from
    ``luna-offline frames``), else the id itself. Frames of one scenario are near-duplicates of each
    other, so holding out single frames would leak their neighbours into training."""
    return item_id.split("@", 1)[0]


def scenario_draw(item_id: str, salt: str = "") -> float:
    """A deterministic number in [0, 1) per scenario (``split_group``): a hash of ``salt`` + its name. Splits
    by scenario compare it with their fraction; another salt gives a split independent of this one."""
    h = int.from_bytes(hashlib.sha256((salt + split_group(item_id)).encode()).digest()[:8], "big")
    return h / 2.0 ** 64


def is_heldout(item_id: str, fraction: float) -> bool:
    """Deterministic held-out split by scenario (``split_group``), the same in ``distill`` and
    ``evaluate``: a group is held out when a hash of its name falls below ``fraction``."""
    return fraction > 0.0 and scenario_draw(item_id) < fraction


def split_items(items: Sequence[MemoryItem], fraction: float) -> tuple[list[MemoryItem], list[MemoryItem]]:
    """(training items, held-out items) among the teacher items that carry a distribution."""
    usable = [it for it in items if it.distribution is not None and it.answer.strip()]
    train = [it for it in usable if not is_heldout(it.id, fraction)]
    held = [it for it in usable if is_heldout(it.id, fraction)]
    return train, held


def subset(items: Sequence[MemoryItem], limit: int, seed: int) -> list[MemoryItem]:
    """At most ``limit`` items (0 = all) drawn at random with ``seed``, in bank order: a bank is
    written scenario by scenario, so its first items would all come from a few scenarios."""
    if not limit or limit >= len(items):
        return list(items)
    keep = np.random.default_rng([seed, 17]).choice(len(items), size=limit, replace=False)
    return [items[i] for i in sorted(keep)]


def retrieve_examples(bank, item: MemoryItem, k: int, exclude: set[str]) -> list[MemoryItem]:
    """The ``k`` bank items most similar to ``item`` (its stored embedding), excluding ``exclude``."""
    if k <= 0:
        return []
    key = item.embedding if item.embedding is not None else item.query
    hits = bank.retrieve(key, k=k, exclude_ids=exclude | {item.id})
    return [hit for hit, _ in hits]


def sample_order(n: int, epochs: int, seed: int, k_min: int, k_max: int) -> list[tuple[int, int]]:
    """(item index, K) for every sample of every epoch: a fresh permutation per epoch, K ~ U{k_min..k_max}."""
    order = []
    for epoch in range(epochs):
        rng = np.random.default_rng([seed, epoch])
        for idx in rng.permutation(n):
            order.append((int(idx), int(rng.integers(k_min, k_max + 1))))
    return order


def collate(samples: list[tuple[list[int], int, np.ndarray]], pad_id: int,
            device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded batch of (ids, i*, pi)."""
    width = max(len(ids) for ids, _, _ in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (seq, _, _) in enumerate(samples):
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "commit_index": torch.tensor([c for _, c, _ in samples], device=device),
            "target": torch.tensor(np.stack([p for _, _, p in samples]), dtype=torch.float32, device=device)}


# ---- training ---------------------------------------------------------------------------------------
def _resolve(settings: DistillSettings, cuda: bool) -> tuple[str, bool, str]:
    quant = settings.quantization if settings.quantization != "auto" else ("nf4" if cuda else "none")
    ckpt = settings.gradient_checkpointing == "on" or (settings.gradient_checkpointing == "auto" and cuda)
    optim = settings.optimizer if settings.optimizer != "auto" else ("adamw8bit" if cuda else "adamw")
    return quant, ckpt, optim


def _make_optimizer(params: list[torch.nn.Parameter], kind: str, lr: float) -> torch.optim.Optimizer:
    if kind == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up, then linear decay to 10 % of the peak at the last step."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if total <= warmup:
        return 1.0
    return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, total - warmup))


def plot_history(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, key, title in zip(axes, ("total", "lm", "kl"),
                              ("L_total = L_LM + alpha L_DPP", "L_LM (Eq. 15)", "L_DPP = KL(pi || pi_hat) (Eq. 17)")):
        ax.plot(steps, [h[key] for h in history], lw=1.2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _save_checkpoint(student: DualHeadStudent, optimizer, state: TrainerState,
                     settings: DistillSettings, out: Path) -> None:
    ckpt = out / "checkpoint"
    tmp = out / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    student.save_pretrained(tmp)
    torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    (tmp / STATE_FILE).write_text(json.dumps({"settings": settings.resumable_keys(), **asdict(state)}))
    old = out / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if ckpt.exists():
        ckpt.rename(old)
    tmp.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)
    (out / "history.json").write_text(json.dumps(state.history))
    if state.history:
        plot_history(state.history, out / "loss_curves.png")


def distill(settings: DistillSettings, prompts: StudentPrompts | None = None,
            progress: bool = True) -> Path:
    """Run (or resume) distillation; returns the directory of the distilled student."""
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    from luna_core.memory import MemoryBank

    settings.validate()
    prompts = prompts or default_prompts()
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(gradient_accumulation_steps=settings.grad_accum,
                              cpu=settings.device == "cpu")
    cuda = accelerator.device.type == "cuda"
    quant, grad_ckpt, optim_kind = _resolve(settings, cuda)

    bank = MemoryBank.open(settings.bank)
    try:
        train, held = split_items(list(bank), settings.heldout_fraction)
        train = subset(train, settings.limit, settings.seed)
        if not train:
            raise DistillError(f"memory bank {settings.bank} has no teacher items with a distribution "
                               f"for training (held out: {len(held)})")
        for item in train:
            try:
                validate_distribution(item.distribution)
            except ValueError as exc:
                raise DistillError(f"memory item {item.id!r}: {exc}") from exc
        exclude = {it.id for it in held}
        # Examples never come from the sample's own scenario: its neighbouring frames carry nearly the
        # same answer, and copying them is not what retrieval offers on a new scene (nor in evaluate).
        groups: dict[str, set[str]] = {}
        for it in bank.items:
            groups.setdefault(split_group(it.id), set()).add(it.id)
        neighbours = {it.id: retrieve_examples(bank, it, settings.k_max, exclude | groups[split_group(it.id)])
                      for it in train}
    finally:
        bank.close()

    state = TrainerState()
    ckpt = out / "checkpoint"
    config = StudentConfig(base_model=settings.base_model, max_context_tokens=settings.max_context_tokens,
                           **settings.prompt_settings(), device=str(accelerator.device.type), quantization=quant)
    torch.manual_seed(settings.seed)
    if (ckpt / STATE_FILE).exists():
        saved = json.loads((ckpt / STATE_FILE).read_text())
        # A checkpoint written before a setting existed ran with that setting's default.
        saved_settings = {**DistillSettings(bank="", out="").resumable_keys(), **saved["settings"]}
        if saved_settings != settings.resumable_keys():
            diff = sorted(k for k in saved_settings if saved_settings[k] != settings.resumable_keys().get(k))
            raise DistillError(f"{ckpt} was written with different settings ({', '.join(diff)}); use "
                               f"another --out or the same settings")
        student = DualHeadStudent.from_pretrained(ckpt, prompts, device=config.device, for_training=True)
        state = TrainerState(saved["step"], saved["samples_seen"], saved["history"])
    elif settings.init:
        student = DualHeadStudent.from_pretrained(settings.init, prompts, device=config.device,
                                                   for_training=True)
        if student.config.base_model != settings.base_model:
            raise DistillError(f"--init {settings.init} was trained on {student.config.base_model!r}, not "
                               f"--base-model {settings.base_model!r}")
        read = {k: getattr(student.config, k) for k in settings.prompt_settings()}
        if read != settings.prompt_settings():
            raise DistillError(f"--init {settings.init} was trained on the prompt {read}, not "
                               f"{settings.prompt_settings()} (--example-objects, --query-objects, --prompt-form)")
    else:
        student = DualHeadStudent.from_base(config, prompts)
    if quant == "nf4":
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(student.lm, use_gradient_checkpointing=grad_ckpt)
    elif grad_ckpt:
        student.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        student.lm.enable_input_require_grads()
    optimizer = _make_optimizer(student.trainable_parameters(), optim_kind, settings.lr)
    if (ckpt / OPTIMIZER_FILE).exists() and state.step > 0:
        optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, weights_only=True,
                                             map_location=accelerator.device))

    order = sample_order(len(train), settings.epochs, settings.seed, settings.k_min, settings.k_max)
    per_step = settings.batch_size * settings.grad_accum * accelerator.num_processes
    total_steps = math.ceil(len(order) / per_step)
    if settings.max_steps:
        total_steps = min(total_steps, settings.max_steps)
    start_step = state.step
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s + start_step, settings.warmup_steps, total_steps))
    model, optimizer = accelerator.prepare(student, optimizer)
    student.train()
    pad_id = student.tokenizer.pad_token_id
    pad_id = student.tokenizer.eos_token_id if pad_id is None else pad_id

    # Each process takes every num_processes-th batch of the shared order.
    batches = [order[i:i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]
    # Equal shares, so that no process waits for a gradient all-reduce the others never start.
    batches = batches[:len(batches) - len(batches) % accelerator.num_processes]
    start_batch = state.samples_seen // settings.batch_size
    bar = tqdm(total=total_steps, initial=state.step, desc="distill", unit="step",
               disable=not (progress and accelerator.is_main_process))
    sums = {"total": 0.0, "lm": 0.0, "kl": 0.0, "n": 0}
    started = time.monotonic()
    for b in range(start_batch, len(batches)):
        if state.step >= total_steps:
            break
        if settings.max_time and time.monotonic() - started > settings.max_time and sums["n"] == 0:
            # A time budget on a shared machine: stop between optimizer steps (resumable as any stop).
            print(f"[distill] max_time {settings.max_time:.0f} s reached after {state.step} steps", flush=True)
            break
        state.samples_seen = (b + 1) * settings.batch_size
        if b % accelerator.num_processes != accelerator.process_index:
            continue
        samples = []
        for idx, k in batches[b]:
            item = train[idx]
            ids, commit, _ = student.encode_training_sample(item.query, neighbours[item.id][:k], item.answer)
            samples.append((ids, commit, validate_distribution(item.distribution)))
        batch = collate(samples, pad_id, accelerator.device)
        if student.config.head_scene_dim:  # an --init student whose head reads xi_t beside h_i*
            batch["scene"] = torch.stack([scene_tensor(student.config, item_head_values(train[idx]), accelerator.device)
                                          for idx, _ in batches[b]])
        with accelerator.accumulate(model):
            losses = model(**batch, alpha=settings.alpha)
            accelerator.backward(losses["total"])
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(student.trainable_parameters(), 1.0)
            optimizer.step()  # a no-op until the last micro-batch of the accumulation
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            scheduler.step()
        for key in ("total", "lm", "kl"):
            sums[key] += float(losses[key])
        sums["n"] += 1
        if accelerator.sync_gradients:
            state.step += 1
            n = max(1, sums["n"])
            state.history.append({"step": state.step, "total": sums["total"] / n, "lm": sums["lm"] / n,
                                  "kl": sums["kl"] / n, "lr": scheduler.get_last_lr()[0]})
            sums = {"total": 0.0, "lm": 0.0, "kl": 0.0, "n": 0}
            bar.update(1)
            bar.set_postfix(lm=f"{state.history[-1]['lm']:.3f}", kl=f"{state.history[-1]['kl']:.3f}")
            if state.step % settings.checkpoint_every == 0 and accelerator.is_main_process:
                _save_checkpoint(student, optimizer, state, settings, out)
    bar.close()
    accelerator.wait_for_everyone()
    student.eval()
    final = out / "student"
    if accelerator.is_main_process:
        _save_checkpoint(student, optimizer, state, settings, out)
        student.save_pretrained(final)
    return final


# ---- command line -------------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("distill", help="distil the dual-head student from a memory bank (Eq. 13-18)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DistillSettings(bank="", out="")
    p.add_argument("--bank", required=True, help="memory bank directory (teacher items with pi)")
    p.add_argument("--out", required=True, help="output directory (resumes from its checkpoint)")
    p.add_argument("--base-model", default=d.base_model, help="packaged model name or local HF folder")
    for name, typ in (("epochs", int), ("max_steps", int), ("batch_size", int), ("grad_accum", int),
                      ("lr", float), ("warmup_steps", int), ("alpha", float), ("k_min", int), ("k_max", int),
                      ("heldout_fraction", float), ("limit", int), ("seed", int),
                      ("max_context_tokens", int), ("example_objects", int), ("query_objects", int),
                      ("checkpoint_every", int), ("max_time", float)):
        p.add_argument("--" + name.replace("_", "-"), type=typ, default=getattr(d, name))
    p.add_argument("--prompt-form", choices=PROMPT_FORMS, default=d.prompt_form,
                   help="how the prompt's traffic states read (StudentConfig.prompt_form)")
    p.add_argument("--quantization", choices=("auto", "none", "nf4"), default=d.quantization)
    p.add_argument("--gradient-checkpointing", choices=("auto", "on", "off"), default=d.gradient_checkpointing)
    p.add_argument("--optimizer", choices=("auto", "adamw", "adamw8bit"), default=d.optimizer)
    p.add_argument("--device", choices=("auto", "cpu"), default=d.device)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--stage", choices=("joint", "head"), default="joint",
                   help="joint: LoRA + head with L_LM + alpha KL; head: stage 1 on cached hidden states")
    p.add_argument("--features", choices=FEATURE_MODES, default="compute",
                   help="--stage head: compute the missing cache then train; only: compute and stop; "
                        "cached: train on the shards that exist")
    p.add_argument("--cache-part", default="0/1", metavar="I/N",
                   help="--stage head: compute shard s only when s %% N == I (parallel cache processes)")
    p.add_argument("--cache-like", default="", metavar="DIR",
                   help="--stage head: compute only the shards that this other cache (a features/ folder of the "
                        "same bank, seed and K settings) holds: the same rows, e.g. read in another prompt form")
    p.add_argument("--init", default="", help="--stage joint: start from this saved student (stage-1 output)")
    h = p.add_argument_group("stage 1 (--stage head)")
    hd = HeadSettings()
    for name, typ in (("variants", int), ("eval_k", int), ("head_epochs", int), ("head_lr", float),
                      ("head_batch", int), ("head_weight_decay", float), ("head_lr_final", float),
                      ("val_fraction", float), ("heldout_limit", int)):
        h.add_argument("--" + name.replace("_", "-"), type=typ, default=getattr(hd, name))
    h.add_argument("--extra-features", nargs="+", default=[], metavar="DIR",
                   help="also train the head on these caches' training rows (same bank and split, e.g. "
                        "<a K = 0 run>/features)")
    h.add_argument("--head-scene-vector", dest="scene_vector", nargs="?", const="all", default="",
                   choices=sorted(HEAD_SCENE_PARTS),
                   help="the head also reads the scene vector xi_t stored with each teacher item, beside h_i*: "
                        "all of it (the default), 'ego-road', its road, ego, light and navigation values, "
                        "'ego-road-timing', those and the objects' timing, or 'all-timing', xi_t and the timing "
                        "(StudentConfig.head_scene_dim; docs/student.md)")
    h.add_argument("--targets-from-bank", dest="targets_from_bank", action="store_true",
                   help="train on the distributions --bank gives the cached rows' items (a bank relabelled by "
                        "a new teacher, same frames) instead of the cached targets; K > 0 rows must have been cached "
                        "from this bank")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    names = {f for f in DistillSettings.__dataclass_fields__}
    settings = DistillSettings(**{k: v for k, v in vars(args).items() if k in names})
    if args.stage == "head":
        settings.validate()
        head = HeadSettings(**{k: v for k, v in vars(args).items() if k in HeadSettings.__dataclass_fields__})
        final = run_head_stage(settings, head, features=args.features, part=CachePart.parse(args.cache_part),
                               like=Path(args.cache_like) if args.cache_like else None)
        if final is None:
            print(f"cached part {args.cache_part} of the features in {settings.out}")
            return 0
    else:
        final = distill(settings)
    print(f"distilled student: {final}")
    return 0
