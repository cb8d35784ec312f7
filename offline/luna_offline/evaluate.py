"""``luna-offline evaluate``: open-loop evaluation of the student on held-out frames (LUNA-AD Sec. V-B1).

For each number of retrieved examples K (default 0..5; the student was trained with K in 0..3):
top-action accuracy and KL(pi || pi_hat) (Eq. 17) against the teacher distribution, BLEU-1 and BLEU-4
(sacrebleu), METEOR (nltk, needs WordNet data) and ROUGE-L F1 (rouge_score) of the explanation
against the teacher answer A_sum, and the latency of the DPP pass and of the explanation. Baselines:
the majority class of the training items (KL with their mean distribution) and the zero-shot base
model (adapters off; pi from its next-token probabilities of each action code after the answer prefix).

Held-out frames are the bank items that ``distill`` held out (the same split by scenario); their retrieved
examples come from the training items only. Writes metrics.json, metrics.md and fig7.png (the layout
of LUNA-AD Fig. 7; shaded: K unseen during training). Every evaluated frame is appended to
``frames.jsonl`` in the output folder as it is done, so a rerun of the same command resumes where an
interrupted one stopped (the latencies then come from both runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from luna_core.scene import item_head_values
from luna_core.student import DualHeadStudent
from luna_core.types import ACTION_CODES, NUM_ACTIONS, MemoryItem, candidate_set, validate_distribution
from luna_offline.distill import retrieve_examples, split_items, subset

# WordNet's fixed list of lexicographer files (wndb(5WN) 'lexnames': number, name, syntactic category).
_LEXNAMES = ("adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
             "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
             "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
             "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
             "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
             "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather "
             "adj.ppl").split()
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
METEOR_UNAVAILABLE = ("METEOR unavailable: no WordNet data found (nltk's corpora/wordnet, $LUNA_WORDNET_DIR, "
                      "or the Debian package wordnet-base in /usr/share/wordnet)")


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    """KL(p || q) in nats (Eq. 17); terms with p = 0 contribute nothing."""
    p = np.asarray(p, dtype=np.float64)
    q = np.clip(np.asarray(q, dtype=np.float64), eps, None)
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def wordnet_reader():
    """A WordNet corpus reader for METEOR, or None when no WordNet data is on this machine."""
    import nltk

    try:
        nltk.data.find("corpora/wordnet")
        from nltk.corpus import wordnet

        wordnet.ensure_loaded()
        return wordnet
    except (LookupError, OSError):
        pass
    from nltk.corpus.reader import WordNetCorpusReader

    for folder in (os.environ.get("LUNA_WORDNET_DIR", ""), "/usr/share/wordnet"):
        root = Path(folder) if folder else None
        if root is None or not (root / "data.noun").is_file() or not (root / "index.noun").is_file():
            continue
        if not (root / "lexnames").is_file():
            # Debian's wordnet-base ships the database without the 'lexnames' table: copy it into the
            # cache with that table added (nltk refuses symlinks that leave the corpus root).
            import shutil

            from luna_core.model_cache import cache_root

            copy = cache_root() / "wordnet"
            copy.mkdir(parents=True, exist_ok=True)
            for f in root.iterdir():
                target = copy / f.name
                if f.is_file() and (not target.exists() or target.stat().st_size != f.stat().st_size):
                    shutil.copyfile(f, target)
            (copy / "lexnames").write_text("".join(
                f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}\n" for i, name in enumerate(_LEXNAMES)))
            root = copy
        if str(root) not in nltk.data.path:
            nltk.data.path.append(str(root))  # nltk only opens corpora under its data path

        class WordNet30Reader(WordNetCorpusReader):
            # nltk maps other versions onto its own 'wordnet' corpus (3.0), which is absent here; this
            # database is 3.0 itself (checked below), so the mapping is the identity.
            def map_wn(self, version: str = "wordnet") -> None:
                return None

        reader = WordNet30Reader(str(root), None)
        if reader.get_version() == "3.0":
            return reader
    return None


class TextMetrics:
    """BLEU-1/4 (sacrebleu), METEOR (nltk + WordNet) and ROUGE-L F1 (rouge_score), in percent."""

    def __init__(self) -> None:
        from rouge_score import rouge_scorer
        from sacrebleu.metrics import BLEU

        self._bleu1 = BLEU(max_ngram_order=1, effective_order=True)
        self._bleu4 = BLEU(max_ngram_order=4, effective_order=True)
        self._rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        self.wordnet = wordnet_reader()
        self.meteor_note = "" if self.wordnet is not None else METEOR_UNAVAILABLE

    def score(self, hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | None]:
        if len(hypotheses) != len(references) or not hypotheses:
            raise ValueError(f"need as many hypotheses as references (>0), got {len(hypotheses)} and "
                             f"{len(references)}")
        refs = [list(references)]
        out: dict[str, float | None] = {
            "bleu1": self._bleu1.corpus_score(list(hypotheses), refs).score,
            "bleu4": self._bleu4.corpus_score(list(hypotheses), refs).score,
            "rougeL": 100.0 * statistics.fmean(self._rouge.score(r, h)["rougeL"].fmeasure
                                               for h, r in zip(hypotheses, references)),
            "meteor": None,
        }
        if self.wordnet is not None:
            from nltk.translate.meteor_score import meteor_score

            out["meteor"] = 100.0 * statistics.fmean(
                meteor_score([r.split()], h.split(), wordnet=self.wordnet)
                for h, r in zip(hypotheses, references))
        return out


@dataclass
class KResult:
    k: int
    n: int
    accuracy: float
    kl: float
    dpp_latency_median: float  # s, tokenisation + forward pass
    n_explained: int = 0
    bleu1: float | None = None
    bleu4: float | None = None
    meteor: float | None = None
    rougeL: float | None = None
    explain_latency_median: float | None = None
    prompt_tokens_median: float = 0.0


@dataclass
class EvalReport:
    student: str
    bank: str
    heldout: int
    train_items: int
    results: list[KResult] = field(default_factory=list)
    majority: dict = field(default_factory=dict)
    zero_shot: dict = field(default_factory=dict)
    meteor_note: str = ""
    k_max_train: int = 3


def majority_baseline(train: Sequence[MemoryItem], held: Sequence[MemoryItem]) -> dict:
    """Always the most frequent top action of the training items; pi_hat = their mean distribution."""
    tops = np.bincount([int(np.argmax(it.distribution)) for it in train], minlength=NUM_ACTIONS)
    majority = int(np.argmax(tops))
    mean = np.mean([validate_distribution(it.distribution) for it in train], axis=0)
    acc = float(np.mean([int(np.argmax(it.distribution)) == majority for it in held]))
    kl = float(np.mean([kl_divergence(it.distribution, mean) for it in held]))
    return {"action": ACTION_CODES[majority], "accuracy": acc, "kl": kl}


@torch.inference_mode()
def zero_shot_distribution(student: DualHeadStudent, query: str) -> np.ndarray:
    """pi of the base model without adapters: P(code | prompt || u_pref) over the 10 codes."""
    # u_pref without its trailing space: BPE tokenisers attach the space to the code (" AK").
    prefix = student.prompts.explanation_prefix([ACTION_CODES[0]]).split(ACTION_CODES[0])[0].rstrip()
    tok = student.tokenizer
    fitted = student.encoder.fit(query, [])
    ids = fitted.input_ids + list(tok(prefix, add_special_tokens=False)["input_ids"])
    scores = np.zeros(NUM_ACTIONS)
    with student.adapter_disabled():
        out = student.lm(input_ids=torch.tensor([ids], device=student.device), use_cache=True)
        cache, first = out.past_key_values, torch.log_softmax(out.logits[0, -1].float(), -1)
        base_len = len(ids)
        for a, code in enumerate(ACTION_CODES):
            code_ids = list(tok(" " + code, add_special_tokens=False)["input_ids"])
            logp = float(first[code_ids[0]])
            if len(code_ids) > 1:
                rest = student.lm(input_ids=torch.tensor([code_ids[:-1]], device=student.device),
                                  past_key_values=cache, use_cache=True)
                lp = torch.log_softmax(rest.logits[0].float(), -1)
                logp += float(sum(lp[i, t] for i, t in enumerate(code_ids[1:])))
                cache.crop(-(cache.get_seq_length() - base_len))
            scores[a] = logp
    p = np.exp(scores - scores.max())
    return p / p.sum()


class FrameJournal:
    """The frames evaluated so far, one JSON line each after a header line naming the evaluation; a
    journal of another evaluation is refused, a torn last line (a killed run) is dropped."""

    def __init__(self, path: Path | None, header: dict) -> None:
        self.path = path
        self.done: dict[tuple[int, str], dict] = {}
        if path is None:
            return
        if path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            records = []
            for n, line in enumerate(lines):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    if n < len(lines) - 1:
                        raise ValueError(f"{path}: line {n + 1} is not JSON (only a last line may be torn)") from None
            if records and records[0] != {"evaluation": header}:
                raise ValueError(f"{path} belongs to another evaluation ({records[0].get('evaluation')}); remove it "
                                 f"or choose another --out")
            self.done = {(r["k"], r["id"]): r for r in records[1:]}
            path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")  # without a torn tail
        if not self.done:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"evaluation": header}) + "\n", encoding="utf-8")

    def add(self, record: dict) -> None:
        self.done[(record["k"], record["id"])] = record
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def evaluate(student: DualHeadStudent, bank_path: str, ks: Sequence[int] = range(6), limit: int = 0,
             explain_limit: int = 5, heldout_fraction: float = 0.1, zero_shot: bool = True,
             max_new_tokens: int = 96, progress: bool = True, journal: Path | None = None,
             student_name: str = "") -> EvalReport:
    """The report over ``ks``; with ``journal`` (a file) every frame is recorded as it is done, and the
    frames already recorded there by the same evaluation are not evaluated again."""
    from tqdm.auto import tqdm

    from luna_core.memory import MemoryBank

    bank = MemoryBank.open(bank_path)
    try:
        train, held = split_items(list(bank), heldout_fraction)
        held = subset(held, limit, seed=0)
        if not held or not train:
            raise ValueError(f"memory bank {bank_path}: need held-out and training items with a distribution "
                             f"(held out {len(held)}, training {len(train)}; heldout_fraction={heldout_fraction})")
        exclude = {it.id for it in held}
        neighbours = {it.id: retrieve_examples(bank, it, max(ks), exclude) for it in held}
    finally:
        bank.close()
    metrics = TextMetrics()
    report = EvalReport(student="", bank=str(bank_path), heldout=len(held), train_items=len(train),
                        meteor_note=metrics.meteor_note)
    report.majority = majority_baseline(train, held)
    frames = FrameJournal(journal, {"student": student_name, "bank": str(bank_path), "limit": limit,
                                    "explain_limit": explain_limit, "heldout_fraction": heldout_fraction,
                                    "max_new_tokens": max_new_tokens})
    total = len(ks) * len(held) + (len(held) if zero_shot else 0)
    bar = tqdm(total=total, desc="evaluate", unit="frame", disable=not progress,
               initial=sum(1 for k in ks for item in held if (k, item.id) in frames.done))
    for k in ks:
        accs, kls, lats, toks, hyps, refs, exp_lats = [], [], [], [], [], [], []
        for i, item in enumerate(held):
            record = frames.done.get((k, item.id))
            if record is None:
                examples = neighbours[item.id][:k]
                values = item_head_values(item) if student.config.head_scene_dim else None  # as the decision path
                probs, lat = student.predict(item.query, examples, scene_vector=values)
                record = {"k": k, "id": item.id, "probabilities": [float(v) for v in probs],
                          "latency": lat.total, "prompt_tokens": lat.prompt_tokens}
                if i < explain_limit:
                    e = student.explain(item.query, examples, candidate_set(probs), max_new_tokens=max_new_tokens)
                    record.update(explanation=e.text, explain_latency=e.latency)
                frames.add(record)
                bar.update(1)
            probs = np.asarray(record["probabilities"])
            accs.append(int(np.argmax(probs)) == int(np.argmax(item.distribution)))
            kls.append(kl_divergence(item.distribution, probs))
            lats.append(record["latency"])
            toks.append(record["prompt_tokens"])
            if "explanation" in record:
                hyps.append(record["explanation"])
                refs.append(item.answer)
                exp_lats.append(record["explain_latency"])
        r = KResult(k=k, n=len(held), accuracy=float(np.mean(accs)), kl=float(np.mean(kls)),
                    dpp_latency_median=statistics.median(lats), prompt_tokens_median=statistics.median(toks),
                    n_explained=len(hyps))
        if hyps:
            text = metrics.score(hyps, refs)
            r.bleu1, r.bleu4, r.meteor, r.rougeL = text["bleu1"], text["bleu4"], text["meteor"], text["rougeL"]
            r.explain_latency_median = statistics.median(exp_lats)
        report.results.append(r)
    if zero_shot:
        accs, kls = [], []
        for item in held:
            p = zero_shot_distribution(student, item.query)
            accs.append(int(np.argmax(p)) == int(np.argmax(item.distribution)))
            kls.append(kl_divergence(item.distribution, p))
            bar.update(1)
        report.zero_shot = {"accuracy": float(np.mean(accs)), "kl": float(np.mean(kls))}
    bar.close()
    return report


def plot_fig7(report: EvalReport, path: Path) -> None:
    """Six panels like LUNA-AD Fig. 7: accuracy, KL, BLEU, METEOR / ROUGE-L, DPP and explanation latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r.k for r in report.results]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    panels = [
        ("Accuracy (%)", [("student", [100 * r.accuracy for r in report.results])],
         [("majority", 100 * report.majority.get("accuracy", np.nan)),
          ("zero-shot base", 100 * report.zero_shot.get("accuracy", np.nan))]),
        ("KL divergence (nats)", [("student", [r.kl for r in report.results])],
         [("majority", report.majority.get("kl", np.nan)), ("zero-shot base", report.zero_shot.get("kl", np.nan))]),
        ("BLEU", [("BLEU-1", [r.bleu1 for r in report.results]), ("BLEU-4", [r.bleu4 for r in report.results])], []),
        ("METEOR / ROUGE-L", [("METEOR", [r.meteor for r in report.results]),
                              ("ROUGE-L", [r.rougeL for r in report.results])], []),
        ("DPP latency (s, median)", [("predict", [r.dpp_latency_median for r in report.results])], []),
        ("Explanation latency (s, median)", [("explain", [r.explain_latency_median for r in report.results])], []),
    ]
    for ax, (title, series, lines) in zip(axes.flat, panels):
        if all(y is None for _, ys in series for y in ys):  # e.g. explanations not asked for (--explain-limit 0)
            ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
            ax.set_yticks([])
            series = []
        for label, ys in series:
            ys = [np.nan if y is None else y for y in ys]
            ax.plot(ks, ys, marker="o", label=label)
        for label, y in lines:
            if np.isfinite(y):
                ax.axhline(y, ls="--", lw=1, color="gray" if label == "majority" else "tab:red", label=label)
        unseen = [k for k in ks if k > report.k_max_train]
        if unseen:
            ax.axvspan(min(unseen) - 0.5, max(unseen) + 0.5, color="0.9", zorder=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("retrieved examples K")
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        if series or lines:
            ax.legend(fontsize=7)
    if report.meteor_note:
        fig.text(0.5, 0.005, report.meteor_note, ha="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(report: EvalReport) -> str:
    def f(v: float | None, fmt: str = "{:.2f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    lines = [f"Held-out frames: {report.heldout} (training items: {report.train_items}); bank `{report.bank}`.",
             "", "| K | accuracy (%) | KL | BLEU-1 | BLEU-4 | METEOR | ROUGE-L | DPP latency (s) | "
             "explanation latency (s) | prompt tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.results:
        lines.append(f"| {r.k} | {100 * r.accuracy:.1f} | {r.kl:.4f} | {f(r.bleu1)} | {f(r.bleu4)} | "
                     f"{f(r.meteor)} | {f(r.rougeL)} | {r.dpp_latency_median:.3f} | "
                     f"{f(r.explain_latency_median, '{:.1f}')} | {r.prompt_tokens_median:.0f} |")
    lines += ["", "| baseline | accuracy (%) | KL |", "|---|---|---|",
              f"| majority class ({report.majority['action']}) | {100 * report.majority['accuracy']:.1f} | "
              f"{report.majority['kl']:.4f} |"]
    if report.zero_shot:
        lines.append(f"| zero-shot base model | {100 * report.zero_shot['accuracy']:.1f} | "
                     f"{report.zero_shot['kl']:.4f} |")
    if report.meteor_note:
        lines += ["", report.meteor_note]
    return "\n".join(lines) + "\n"


def write_report(report: EvalReport, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(asdict(report), indent=2))
    (out / "metrics.md").write_text(markdown_table(report))
    plot_fig7(report, out / "fig7.png")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("evaluate", help="open-loop evaluation of a student on held-out frames (Fig. 7)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--student", required=True, help="a saved student directory (distill's out/student)")
    p.add_argument("--bank", required=True, help="the memory bank the student was distilled from")
    p.add_argument("--out", required=True, help="output directory for metrics.json, metrics.md, fig7.png")
    p.add_argument("--ks", type=int, nargs="+", default=list(range(6)), help="numbers of retrieved examples")
    p.add_argument("--limit", type=int, default=0,
                   help="at most this many held-out frames, a seeded random subset (0 = all)")
    p.add_argument("--explain-limit", type=int, default=5, help="frames per K that get an explanation")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="must match distill's")
    p.add_argument("--no-zero-shot", action="store_true", help="skip the zero-shot base-model baseline")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--autocast", choices=("none", "bfloat16"), default=None,
                   help="the base's matrix products in bfloat16 (StudentConfig.autocast); default: the student's own")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    student = DualHeadStudent.from_pretrained(args.student, device=args.device, autocast=args.autocast)
    t0 = time.perf_counter()
    report = evaluate(student, args.bank, args.ks, args.limit, args.explain_limit, args.heldout_fraction,
                      zero_shot=not args.no_zero_shot, max_new_tokens=args.max_new_tokens,
                      journal=Path(args.out) / "frames.jsonl",
                      student_name=f"{args.student} (autocast {student.config.autocast})")
    report.student = str(args.student)
    write_report(report, Path(args.out))
    print(markdown_table(report))
    print(f"evaluation took {time.perf_counter() - t0:.0f} s; results in {args.out}")
    return 0
