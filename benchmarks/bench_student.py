"""Student latency (issue 5): one-pass DPP decision versus an autoregressive chain-of-thought decision.

Same machine, same base model (SmolLM2-135M-Instruct), same prompts (the project's PromptManager with
its default decision-making instruction; K retrieved examples with teacher-style answers):

- DPP: ``DualHeadStudent.predict`` (one forward pass to the commitment position + head), K = 0 and 3:
  consecutive decisions retrieving the same items (the KV cache of the shared prefix is reused), other
  items at every call (only the system message is shared), no cache, and ONNX Runtime (CPU provider here);
- CoT: the knowledge-driven baselines' way, greedy generation of ~200 tokens of reasoning + decision
  after the same prompt (``min_new_tokens = max_new_tokens = 200``);
- decision latency while an explanation is being generated in a worker thread, versus idle.

Medians over repeats; the machine's 2 cores are shared with other jobs, so absolute figures are noisy
(ratios from one run are more stable than absolute times). The latency of an untrained student equals
that of a distilled one (same graph), so ``--student`` is optional.

    .venv/bin/python benchmarks/bench_student.py --repeats 5 --cot-repeats 1 --docs
    .venv/bin/python benchmarks/bench_student.py --student models/student --threads 1 --profile-steady  # by operator
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from luna_core.prompts import PromptManager, format_ranked_answer
from luna_core.scene import item_head_values, head_scene_values
from luna_core.student import DualHeadStudent, StudentConfig
from luna_core.student.context import chat_ids, student_encoder
from luna_core.student.onnx_dpp import OnnxDecisionPredictor, export_dpp_onnx
from luna_core.types import MemoryItem, ObjectClass, ObjectDescription, RoadSection, SceneDescriptor

from docs_section import write_section  # noqa: E402 - benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Student latency (issue 5)"
COT_TOKENS = 200
T_D = 2.0  # s between decisions (CALMM-Drive's decision period, the stack's default)
WARM = "DPP torch, consecutive decisions retrieving the same items (KV cache of the shared prefix)"
COLD = "DPP torch, other retrieved items every call (KV cache of the system message)"
FULL = "DPP torch, full prefill"
ONNX = "DPP ONNX Runtime (CPU provider), full prefill"
COT = f"CoT: generate {COT_TOKENS} tokens (base model, adapters off)"


def scene(i: int, n_objects: int = 4) -> SceneDescriptor:
    objects = [ObjectDescription(id=f"veh{j}", object_class=ObjectClass.VEHICLE, distance=8.0 + 9.0 * j + i,
                                 bearing=0.1 * ((-1) ** j) * j, heading=0.0, speed=5.0 + j, length=4.6,
                                 width=1.9, lane_relation=("same lane", "left lane", "right lane")[j % 3])
               for j in range(n_objects)]
    return SceneDescriptor(stamp=float(i), road_section=RoadSection.NORMAL_MULTI_LANE, num_lanes=3,
                           ego_lane_index=2, ego_speed=7.0 + i, objects=objects, has_left_lane=True,
                           has_right_lane=True, recent_decisions=["CK", "CK"])


def example(prompts: PromptManager, i: int) -> MemoryItem:
    why = {"CK": "The lead vehicle veh0 keeps a steady speed with a safe gap, so cruising keeps progress "
                 "without closing in; no lane change is needed.",
           "DK": "If veh0 slows further the gap shrinks below two seconds, so a gentle deceleration keeps "
                 "the time headway and comfort.",
           "AL": "The left lane is free for a long stretch; changing left and accelerating gains progress."}
    return MemoryItem(id=f"ex{i}", query=prompts.decision_query(scene(10 + i)),
                      answer=format_ranked_answer(["CK", "DK", "AL"], why), distribution=np.full(10, 0.1))


def timed(fn, repeats: int, desc: str, warmups: int = 1, sync=None) -> list[float]:
    """Wall time of ``fn(i)`` for i = 1..repeats (``fn(0)`` called ``warmups`` times before, untimed); ``sync``
    (e.g. ``torch.cuda.synchronize``) runs after every call, inside the timing, for asynchronous devices."""
    for _ in range(warmups):
        fn(0)
    if sync:
        sync()
    out = []
    for i in tqdm(range(1, repeats + 1), desc=desc, leave=False):
        t0 = time.perf_counter()
        fn(i)
        if sync:
            sync()
        out.append(time.perf_counter() - t0)
    return out


@torch.inference_mode()
def cot_decision(student: DualHeadStudent, query: str, examples: list[MemoryItem]) -> int:
    """The base model's autoregressive answer: prompt prefill + COT_TOKENS greedy tokens (adapters off)."""
    ids = torch.tensor([student.encoder.fit(query, examples).input_ids])
    with student.adapter_disabled():
        out = student.lm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=COT_TOKENS, min_new_tokens=COT_TOKENS,
                                  pad_token_id=student.tokenizer.eos_token_id)
    return int(out.shape[1] - ids.shape[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", help="a saved student directory (default: a fresh one on the default base)")
    ap.add_argument("--repeats", type=int, default=7, help="timed DPP calls per setting")
    ap.add_argument("--cot-repeats", type=int, default=2, help="timed 200-token generations per K")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--docs", action="store_true", help=f"replace '{SECTION}' in docs/benchmarks.md")
    ap.add_argument("--compare-banks", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="instead: K = 3 prompt length and decision latency with the real items (queries and "
                         "teacher answers) of two memory banks, alternating calls between them in one run")
    ap.add_argument("--compare-precisions", nargs="+", metavar="WEIGHTS[/AUTOCAST]",
                    help="instead: the --student at each precision (e.g. float32 bfloat16 float32/bfloat16: "
                         "weights dtype, then the autocast dtype of the matrix products), on the real items "
                         "of --bank: K = 3 decision latency and the decisions' difference to the first one's, "
                         "alternating calls in one run")
    ap.add_argument("--compare-students", nargs="+", metavar="DIRECTORY[:WEIGHTS[/AUTOCAST]][@PROMPT]",
                    help="instead: saved students (each in its own prompt form, e.g. models/student "
                         "out/brief/student, or in PROMPT = FORM/QUERY_OBJECTS/EXAMPLE_OBJECTS, e.g. "
                         "out/brief/student@rounded/4/1), optionally at a precision as --compare-precisions, "
                         "on the real items of --bank, alternating calls in one run")
    ap.add_argument("--profile-steady", action="store_true",
                    help="instead: --repeats steady-state decisions of --student on the real items of --bank, the "
                         "last under torch.profiler: its operators by CPU time")
    ap.add_argument("--bank", default="models/memory_bank",
                    help="the bank of --compare-precisions, --compare-students and --profile-steady")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare_precisions or args.compare_students:
        if args.compare_precisions and not args.student:
            ap.error("--compare-precisions needs --student")
        specs = args.compare_students or [f"{args.student}:{p}" for p in args.compare_precisions]
        print(compare_students(specs, args.bank, args.repeats))
        return 0
    prompts = PromptManager()
    student = (DualHeadStudent.from_pretrained(args.student, prompts, device="cpu") if args.student
               else DualHeadStudent.from_base(StudentConfig(device="cpu"), prompts))
    if args.compare_banks:
        print(compare_banks(student, args.compare_banks, args.repeats))
        return 0
    if args.profile_steady:
        print(profile_steady(student, args.bank, args.repeats))
        return 0
    queries = [prompts.decision_query(scene(i)) for i in range(args.repeats + 1)]  # the scene moves on
    vectors = [head_scene_values(scene(i)) for i in range(args.repeats + 1)]  # for a head that reads them
    query = queries[0]
    pool = [example(prompts, i) for i in range(3 * (args.repeats + 1))]

    rows: dict[str, dict[int, list[float]]] = {}
    tokens: dict[int, int] = {}
    extra: list[str] = []
    command = " ".join([".venv/bin/python", "benchmarks/bench_student.py", *sys.argv[1:]])

    def report() -> None:  # after every stage, so a run cut short still leaves its figures
        text = render(rows, tokens, extra, command, args)
        print(text, flush=True)
        if args.docs:
            write_section(ROOT / "docs" / "benchmarks.md", SECTION, text)

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_dpp_onnx(student, Path(tmp) / "dpp.onnx")
        onnx = OnnxDecisionPredictor(onnx_path, student.tokenizer, prompts, student.config,
                                     threads=args.threads)
        for k in (0, 3):
            same = pool[:k]

            def other(i: int) -> list[MemoryItem]:
                return pool[k * i:k * (i + 1)]

            tokens[k] = student.predict(query, same, scene_vector=vectors[0])[1].prompt_tokens
            rows.setdefault(WARM, {})[k] = timed(lambda i: student.predict(queries[i], same, scene_vector=vectors[i]), args.repeats,
                                                 f"dpp same items K={k}")
            rows.setdefault(COLD, {})[k] = timed(lambda i: student.predict(queries[i], other(i), scene_vector=vectors[i]), args.repeats,
                                                 f"dpp other items K={k}")
            student.config.reuse_prefix_cache = False
            rows.setdefault(FULL, {})[k] = timed(lambda i: student.predict(queries[i], same, scene_vector=vectors[i]), args.repeats,
                                                 f"dpp full K={k}")
            student.config.reuse_prefix_cache = True
            rows.setdefault(ONNX, {})[k] = timed(lambda i: onnx.predict(queries[i], same, scene_vector=vectors[i]), args.repeats,
                                                 f"onnx K={k}")
            rows.setdefault(COT, {})[k] = timed(lambda i: cot_decision(student, queries[i], same),
                                                args.cot_repeats, f"cot K={k}")
            report()
        extra[:] = [busy_versus_idle(student, queries, vectors, pool[:3], args.repeats)]
        report()
    return 0


def _bank_items(path: str) -> list[MemoryItem]:
    from luna_core.memory import MemoryBank

    with MemoryBank.open(path) as bank:
        return [it for it in bank if it.distribution is not None]


def _next_decisions(items: list[MemoryItem]) -> dict[str, MemoryItem]:
    """Each item's next decision: the same scenario's item T_D s later (bank ids read ``<scenario>@<time>``,
    frames at 2 Hz), where the bank has it."""
    by_id = {it.id: it for it in items}
    out = {}
    for it in items:
        scenario, sep, stamp = it.id.rpartition("@")
        try:
            following = by_id.get(f"{scenario}@{float(stamp) + T_D:07.2f}") if sep else None
        except ValueError:  # not a bank id of that form
            following = None
        if following is not None:
            out[it.id] = following
    return out


@dataclass
class Pool:
    """Real bank items for the latency comparisons: ``items`` every n-th item that has a next decision
    (scenes and answers from across the bank, which is written scenario by scenario), ``next`` each one's
    next decision (``_next_decisions``)."""

    items: list[MemoryItem]
    next: dict[str, MemoryItem]


def _pool(items: list[MemoryItem], k: int, repeats: int) -> Pool:
    following = _next_decisions(items)
    items = [it for it in items if it.id in following]
    step = max(1, len(items) // ((k + 1) * (repeats + 1)))
    return Pool(items[::step][:(k + 1) * (repeats + 1)], following)


def _prompt_tokens(student: DualHeadStudent, items: list[MemoryItem], k: int) -> list[int]:
    """Prompt length over 200 random (query, K items) draws: tokenisation only, no forward pass."""
    rng = np.random.default_rng(0)
    draws = [rng.choice(len(items), size=k + 1, replace=False) for _ in range(200)]
    return [len(student.encoder.fit(items[d[0]].query, [items[j] for j in d[1:]]).input_ids) for d in draws]


def _system_tokens(student: DualHeadStudent, query: str) -> int:
    """Tokens of the student's system turn, whose KV cache every decision reuses."""
    return len(chat_ids(student.tokenizer, student.encoder.messages_fn(query, [])[:1]))


def _after_previous_decision(student: DualHeadStudent, pool: Pool, i: int, k: int
                             ) -> tuple[MemoryItem, list[MemoryItem]]:
    """Decide on pool frame ``i`` with the pool's first K items, leaving that prompt's KV cache as the node
    does; return the frame's next decision and those K items: deciding on it is a steady-state decision."""
    previous = pool.items[(k + 1) * i]
    same = pool.items[1:k + 1]
    student.predict(previous.query, same, scene_vector=item_head_values(previous))
    return pool.next[previous.id], same


def profile_steady(student: DualHeadStudent, bank: str, repeats: int, k: int = 3) -> str:
    """Where a steady-state decision's time goes: ``repeats`` steady-state decisions on the real items of
    ``bank`` (as ``_compare`` makes them), the last under ``torch.profiler``, its operators by self CPU time."""
    pool = _pool(_bank_items(bank), k, repeats)
    lines = ["| decision | total (s) | prompt tokens | from the KV cache | computed |", "|---|---:|---:|---:|---:|"]
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for i in range(repeats + 1):
        current, same = _after_previous_decision(student, pool, i, k)
        with profiler if i == repeats else contextlib.nullcontext():  # only the last decision is profiled
            _, lat = student.predict(current.query, same, scene_vector=item_head_values(current))
        if i:  # the first warms up
            lines.append(f"| {i}{' (profiled)' if i == repeats else ''} | {lat.total:.3f} | {lat.prompt_tokens} | "
                         f"{lat.cached_prefix_tokens} | {lat.prompt_tokens - lat.cached_prefix_tokens} |")
    table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    return "\n".join(lines) + "\n\n" + table + f"\n(load average {os.getloadavg()[0]:.1f} at the end of the run)"


def _compare(variants: list[tuple[str, DualHeadStudent, Pool, list[int]]], repeats: int, k: int,
             first_column: str, agreement: Sequence[bool] = ()) -> str:
    """The steady state and a retrieval change at every call, per variant (label, student, item pool,
    prompt tokens). Steady state: a decision on a bank frame, then the next decision of its scenario (the
    frame T_D s later) with the same K retrieved items, as the decision node meets them: only what the
    next frame's prompt does not share with the previous one is computed. Calls alternate between the
    variants, so load on the shared machine affects all alike. ``agreement`` (the same pool for every
    variant): per variant, whether its outputs are compared with the first one's on the same prompts
    (the same student at another precision; the pool pairs a query with unrelated items, not retrieved
    ones, so two students' decisions on them say nothing about their decisions in use)."""
    steady: list[list[float]] = [[] for _ in variants]
    change: list[list[float]] = [[] for _ in variants]
    outputs: list[list[np.ndarray]] = [[] for _ in variants]
    for i in tqdm(range(repeats + 1), desc="compare"):
        for v, (_, student, pool, _) in enumerate(variants):
            current, same = _after_previous_decision(student, pool, i, k)
            other = pool.items[(k + 1) * i + 1:(k + 1) * (i + 1)]
            query, vector = current.query, item_head_values(current)
            probs, lat = student.predict(query, same, scene_vector=vector)
            t0 = time.perf_counter()
            probs_other, _ = student.predict(query, other, scene_vector=vector)
            outputs[v] += [np.asarray(probs, dtype=float), np.asarray(probs_other, dtype=float)]
            if i:  # the first round warms up
                steady[v].append(lat.total)
                change[v].append(time.perf_counter() - t0)
    header = f"| {first_column} | K = {k} prompt tokens (median, max of 200 draws; median after the system " \
             "turn) | steady state (s, p50) | " \
             "retrieval change (s, p50) |"
    rule = "|---|---|---|---|"
    if agreement:
        header += f" same top action as {variants[0][0]} | max abs. probability difference | mean KL to it |"
        rule += "---|---|---|"
    lines = [header, rule]
    for v, (label, student, pool, tokens) in enumerate(variants):
        row = (f"| {label} | {statistics.median(tokens):.0f}, {max(tokens)}; "
               f"{statistics.median(tokens) - _system_tokens(student, pool.items[0].query):.0f} | {statistics.median(steady[v]):.3f} | "
               f"{statistics.median(change[v]):.3f} |")
        if agreement and not agreement[v]:
            row += " another student | - | - |"
        elif agreement:
            ref, out = outputs[0], outputs[v]
            same_top = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, out))
            diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, out))
            kl = statistics.mean(float(np.sum(a * (np.log(a + 1e-12) - np.log(b + 1e-12)))) for a, b in zip(ref, out))
            row += f" {same_top} of {len(ref)} | {diff:.4f} | {kl:.5f} |"
        lines.append(row)
    return "\n".join(lines) + f"\n\n(load average {os.getloadavg()[0]:.1f} at the end of the run)"


def compare_banks(student: DualHeadStudent, banks: list[str], repeats: int, k: int = 3) -> str:
    """Prompt tokens and decision latency at K = ``k`` with the real items of each bank."""
    variants = []
    for path in banks:
        items = _bank_items(path)
        variants.append((f"`{path}`", student, _pool(items, k, repeats), _prompt_tokens(student, items, k)))
    return _compare(variants, repeats, k, "bank")


def compare_students(specs: list[str], bank: str, repeats: int, k: int = 3) -> str:
    """Each student ``<directory>[:<weights dtype>[/<autocast dtype>]][@<form>/<query objects>/<example
    objects>]`` (e.g. ``models/student``, ``models/student:float32/bfloat16``), on the same real items of
    ``bank``, each in its own prompt form or the one after ``@`` (as ``prompt_lengths.py --prompts``: latency
    does not depend on the weights, so a prompt no head was trained on can be timed): the latency of each
    and how far its decisions are from the first one's on the same scenes."""
    from prompt_lengths import parse_prompt  # benchmarks/ is on sys.path when run as a script

    items = _bank_items(bank)
    pool = _pool(items, k, repeats)
    variants, read_as = [], []  # read_as: (directory, prompt) of each, for which decisions are compared
    for spec in specs:
        loaded, _, prompt = spec.partition("@")
        directory, _, precision = loaded.partition(":")
        read_as.append((directory, prompt))
        dtype, _, autocast = (precision or "float32").partition("/")
        student = DualHeadStudent.from_pretrained(directory, PromptManager(), device="cpu", dtype=dtype,
                                                  autocast=autocast or "none")
        c = student.config
        if prompt:
            c.prompt_form, c.query_objects, c.example_objects = parse_prompt(prompt)
            student.encoder = student_encoder(student.tokenizer, student.prompts, c)
        label = (f"`{directory}` ({c.prompt_form}, query objects {c.query_objects or 'all'}, example objects "
                 f"{c.example_objects or 'all'}), {dtype} weights" + (f", {autocast} autocast" if autocast else ""))
        variants.append((label, student, pool, _prompt_tokens(student, items, k)))
    return _compare(variants, repeats, k, "student", agreement=[r == read_as[0] for r in read_as])


def busy_versus_idle(student: DualHeadStudent, queries: list[str], vectors: list[np.ndarray],
                     retrieved: list[MemoryItem], repeats: int) -> str:
    """Decision latency (K = 3, same retrieved items) while an explanation of a K = 3 decision is being
    generated in a worker thread sharing the model, versus idle."""
    stop = threading.Event()

    def explain_until_stopped() -> None:
        while not stop.is_set():
            student.explain(queries[0], retrieved, ["CK", "DK"], max_new_tokens=64, stop=stop)

    idle = timed(lambda i: student.predict(queries[i], retrieved, scene_vector=vectors[i]), repeats, "idle")
    worker = threading.Thread(target=explain_until_stopped)
    worker.start()
    time.sleep(1.0)
    busy = [student.predict(queries[i], retrieved, scene_vector=vectors[i])[1].total for i in tqdm(range(repeats), desc="busy", leave=False)]
    stop.set()
    worker.join()
    return (f"Decision latency (torch, K = 3, same retrieved items) while an explanation of a K = 3 decision is "
            f"generated in a worker thread sharing the model: {statistics.median(busy):.3f} s median, max "
            f"{max(busy):.3f} s (idle: {statistics.median(idle):.3f} s median). Between steps the explainer "
            f"yields to a pending decision, and it reads its prompt in steps of "
            f"{student.config.explanation_prefill_chunk} tokens, so a decision waits at most one step; both "
            "still share the 2 cores.")


def render(rows: dict[str, dict[int, list[float]]], tokens: dict[int, int], extra: list[str], command: str,
           args: argparse.Namespace) -> str:
    med = {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in rows.items()}
    student_kind = (f"the student in {args.student}" if args.student else
                    "untrained adapters and head: same graph and cost as a distilled student")
    cot = med.get(COT, {})

    def cell(m: dict[int, float], k: int) -> str:
        return f"{m[k]:.2f}" if k in m else "not measured (run cut short)"

    def ratio(m: dict[int, float], k: int) -> str:
        return f"{cot[k] / m[k]:.1f}x" if k in m and k in cot else "-"

    lines = [SECTION, "",
             f"Command: `{command}` (torch {torch.__version__}, {args.threads} threads, SmolLM2-135M-Instruct "
             f"fp32 on the CPU, {student_kind}; "
             f"{args.repeats} timed DPP calls after one warm-up and {args.cot_repeats} generation(s) per "
             "setting; medians from one run). The 2 cores were shared with other jobs (load average "
             f"{os.getloadavg()[0]:.0f} at the end of the run): absolute times are inflated and noisy, "
             "the ratios less so.", "",
             "Prompt: the default decision-making system message + one scene query with 4 objects (the "
             "scene moves on between calls, as between decisions); K retrieved examples with "
             "teacher-style answers, all in the student's compact Q_md form. Prompt tokens: "
             + ", ".join(f"K={k}: {n}" for k, n in tokens.items()) + ". The first row is the steady state "
             "of the decision node (retrieval returns the same items for consecutive scenes); the second "
             "is a retrieval change at every call.", "",
             "| setting | K = 0 (s) | K = 3 (s) | CoT / this, K = 0 | CoT / this, K = 3 |",
             "|---|---|---|---|---|"]
    for name, m in med.items():
        lines.append(f"| {name} | {cell(m, 0)} | {cell(m, 3)} | {ratio(m, 0)} | {ratio(m, 3)} |")
    lines += [""] + extra + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
