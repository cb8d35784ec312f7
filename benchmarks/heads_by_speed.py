"""Students' decision heads against the teacher by the ego's speed band, on cached h_{i*} of frames.

    .venv/bin/python benchmarks/heads_by_speed.py --features <op_k0>/features --frames <frames>.jsonl[.xz] \
        --student default=models/student s18=<a student folder> --split all

Why: in closed loop the stack can crawl where the teacher says Accelerate, and a student that answers
Cruise there keeps the ego slow (CK's band tops out at max(lambda v_t, v_bar), CALMM-Drive Eq. 5: Cruise
can raise the speed by a quarter per decision, or to 2 m/s). Open-loop figures over all rows hide such a
band. Per band of the ego speed the descriptor holds (m/s): rows, the teacher's top actions, and per head
the top-action accuracy, KL (Eq. 17) and what the head ranks first where the teacher ranks one action
first (``--where-teacher``: Accelerate x Keep unless told, e.g. DK) (a head that reads the scene vector
beside h_{i*} gets each row's from its frame's descriptor);
with ``--trees-bank`` beside them the scene-vector trees of ``luna-offline baselines`` trained on
that bank (what the descriptor alone allows). Rows that a head was trained on read better than they would
unseen: say which split (``--split``) and which heads saw it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from luna_core.scene import head_scene_part, head_scene_values, scene_vector
from luna_core.student.model import load_decision_head
from luna_core.types import ACTION_CODES, ACTION_INDEX
from luna_offline.distill_head import load_features
from luna_offline.frames import read_frames


BANDS = ((0.0, 1.0), (1.0, 5.0), (5.0, float("inf")))  # m/s: crawling or standing, getting going, driving


@dataclass
class HeadReading:
    accuracy: float  # top-action agreement with the teacher, 0..1
    kl: float  # mean KL(pi || pi_hat)
    top_where_teacher: Counter  # the head's top action on the band's rows where the teacher's is the focus action


@dataclass
class Band:
    low: float  # m/s, inclusive
    high: float  # m/s, exclusive
    rows: int
    teacher_top: Counter  # the teacher's top action per row
    readings: dict[str, HeadReading]  # per predictor (a head, or the trees)

    @property
    def name(self) -> str:
        return f"[{self.low:g}, {self.high:g})" if self.high != float("inf") else f">= {self.low:g}"


def head_log_probs(head: Callable[..., torch.Tensor], hidden: torch.Tensor,
                   scene: torch.Tensor | None = None) -> torch.Tensor:
    """log pi_hat (n, 10) of a decision head on h_{i*} (n, d), and on the scene vectors xi_t (n, 97) for a
    head that reads them beside h_{i*} (``StudentConfig.head_scene_dim``)."""
    with torch.no_grad():
        return torch.log_softmax(head(hidden) if scene is None else head(hidden, scene), dim=-1)


def trees_log_probs(bank: Path, scenes: Sequence) -> torch.Tensor:
    """log pi_hat (n, 10) of the scene-vector trees of ``luna-offline baselines``, trained on the training
    split of ``bank`` (held out by scenario as the students' heads), for these scene descriptors."""
    from luna_core.memory import MemoryBank
    from luna_offline.baselines import SceneVectorTrees
    from luna_offline.distill import DistillSettings, split_items

    with MemoryBank.open(str(bank)) as opened:  # the students' held-out split: distill's default
        train, _ = split_items(list(opened), DistillSettings.heldout_fraction)
    pi = SceneVectorTrees(train).predict(np.stack([scene_vector(s) for s in scenes]))
    return torch.log(torch.as_tensor(pi, dtype=torch.float32).clamp_min(1e-12))  # the baselines' KL floor


def read_bands(log_q: Mapping[str, torch.Tensor], target: torch.Tensor, speeds: Sequence[float],
               focus: str = "AK") -> list[Band]:
    """Each non-empty speed band's reading; ``log_q`` maps each predictor's name to its log pi_hat (n, 10),
    ``target`` holds the teacher's pi (n, 10), ``speeds`` the rows' ego speeds (m/s); ``focus`` the action
    code whose rows get the what-the-head-ranks-first count."""
    speed = torch.as_tensor(speeds, dtype=torch.float64)
    teacher = target.argmax(-1)
    bands = []
    for low, high in BANDS:
        mask = (speed >= low) & (speed < high)
        if not mask.any():
            continue
        on_focus = mask & (teacher == ACTION_INDEX[focus])
        readings = {name: HeadReading(float((lq[mask].argmax(-1) == teacher[mask]).float().mean()),
                                      float(F.kl_div(lq[mask], target[mask], reduction="batchmean")),
                                      Counter(ACTION_CODES[i] for i in lq[on_focus].argmax(-1).tolist()))
                    for name, lq in log_q.items()}
        bands.append(Band(low, high, int(mask.sum()), Counter(ACTION_CODES[i] for i in teacher[mask].tolist()),
                          readings))
    return bands


def shares(counts: Counter, n: int = 3) -> str:
    """The ``n`` most common codes with their share of the rows."""
    total = sum(counts.values())
    return ", ".join(f"{code} {100 * k / total:.0f} %" for code, k in counts.most_common(n)) if total else "-"


def markdown(bands: Sequence[Band], focus: str = "AK") -> str:
    names = list(bands[0].readings) if bands else []
    lines = ["| ego speed (m/s) | rows | teacher's top | " + " | ".join(
        f"{n}: acc % / KL | {n}: top where the teacher's is {focus}" for n in names) + " |",
             "|" + "---|" * (3 + 2 * len(names))]
    for band in bands:
        cells = [band.name, str(band.rows), shares(band.teacher_top)]
        for name in names:
            h = band.readings[name]
            cells += [f"{100 * h.accuracy:.1f} / {h.kl:.3f}",
                      f"{shares(h.top_where_teacher)} ({sum(h.top_where_teacher.values())})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=Path, required=True, help="feature cache folder of the frames' items")
    p.add_argument("--frames", type=Path, required=True, help="the frames file the items were labelled from")
    p.add_argument("--student", nargs="+", required=True, metavar="NAME=FOLDER", help="saved students (head)")
    p.add_argument("--split", choices=("heldout", "train", "all"), default="heldout")
    p.add_argument("--trees-bank", type=Path, help="also the scene-vector trees trained on this teacher bank's "
                                                   "training split (what the descriptor alone allows)")
    p.add_argument("--where-teacher", default="AK", choices=ACTION_CODES, metavar="CODE",
                   help="the teacher's top action whose rows get the what-each-head-ranks-first count (default AK)")
    args = p.parse_args(argv)
    heads = {}
    for spec in args.student:
        name, _, folder = spec.partition("=")
        if not name or not folder:
            p.error(f"--student {spec!r}: expected NAME=FOLDER")
        heads[name] = load_decision_head(Path(folder))
    parts = [load_features(args.features, s) for s in (("train", "heldout") if args.split == "all" else (args.split,))]
    parts = [part for part in parts if part[2]]
    if not parts:
        raise SystemExit(f"{args.features}: no cached {args.split} rows")
    scenes = {frame.id: frame.scene for frame in read_frames(args.frames)}
    rows = [row for _, _, rs in parts for row in rs]
    missing = [item for item, _ in rows if item not in scenes]
    if missing:
        raise SystemExit(f"{args.frames}: no frame for {len(missing)} cached row(s), e.g. {missing[0]!r}")
    hidden = torch.cat([h for h, _, _ in parts])
    vectors = None
    if any(head.scene_dim for head in heads.values()):
        vectors = torch.as_tensor(np.stack([head_scene_values(scenes[item]) for item, _ in rows]), dtype=torch.float32)
    log_q = {name: head_log_probs(head, hidden,
                                  vectors[:, list(head_scene_part(head.scene_dim))] if head.scene_dim else None)
             for name, head in heads.items()}
    if args.trees_bank is not None:
        log_q["trees"] = trees_log_probs(args.trees_bank, [scenes[item] for item, _ in rows])
    bands = read_bands(log_q, torch.cat([t for _, t, _ in parts]), [scenes[item].ego_speed for item, _ in rows],
                       args.where_teacher)
    print(f"{args.features}: {args.split} rows, {len(rows)}\n\n{markdown(bands, args.where_teacher)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
