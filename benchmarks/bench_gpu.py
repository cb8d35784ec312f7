"""The GPU path (issue 14, item 5): the planner cycle, the student's DPP decision and the joint
distillation step, each on the CPU and on CUDA in one run, with the outputs of both devices compared.

- Planner: ``DecisionGuidedPlanner`` full search (population 128, 2 rounds, |C_t| = 3, unlimited budget)
  with the denoiser on each device (``DecisionGuidedConfig.device``); the search's noise is drawn on the
  CPU, so the devices differ only by float rounding: the table gives the largest distance between the
  trajectories the two devices published for the same cycle.
- Decision: ``DualHeadStudent.predict`` (one forward pass + DPP head) at K = 0 and K = 3, consecutive
  decisions retrieving the same items (KV cache of the shared prefix) and other items at every call;
  the student's default dtype per device (fp32 on the CPU, bf16 on CUDA); largest difference between
  the two devices' decision distributions.
- Distillation: the joint stage's optimizer step (LoRA + DPP head, L_LM + alpha KL, AdamW, the student's
  training form as ``luna-offline distill`` builds it) on batches of real-form samples with K in 0..3.

Prompts are bench_student's (the default system message, a 4-object scene query, teacher-style answers).
The SAT checker's GPU figures come from ``bench_sat.py`` (its torch columns run on CUDA when present).

``--random-base DIR`` builds the base language model from DIR's ``config.json`` and tokenizer with random
weights: the same graph and cost as the real weights (for a machine the 98 MB base cannot reach); the
decision table then compares devices, not decisions.

    python benchmarks/bench_gpu.py --markdown /tmp/gpu.md
    python benchmarks/bench_gpu.py --random-base .gpu/smollm2-config --markdown $OUT/gpu.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from luna_core.planning.decision_guided import DecisionGuidedConfig, DecisionGuidedPlanner
from luna_core.prompts import PromptManager
from luna_core.student import DualHeadStudent, StudentConfig

from bench_planner import DECISIONS, commonroad_scene, scene as road_scene  # noqa: E402 - benchmarks/ on sys.path
from bench_student import example, scene as student_scene, timed as timed_calls  # noqa: E402


def timed(fn: Callable[[int], object], repeats: int, device: str, desc: str) -> tuple[list[float], list[object]]:
    """bench_student's ``timed`` on ``device`` (synchronised; three warm-up calls on a GPU, one on the CPU),
    with the results of the timed calls."""
    results: list[object] = []

    def call(i: int) -> None:
        out = fn(i)
        if i:
            results.append(out)

    cuda = device.startswith("cuda")
    times = timed_calls(call, repeats, desc, warmups=3 if cuda else 1, sync=torch.cuda.synchronize if cuda else None)
    return times, results


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}"


def planner_rows(devices: list[str], cycles: int) -> list[str]:
    scenes = [("three-lane road", road_scene(DECISIONS[3]))]
    try:
        scenes.append(("synthetic junction (hard_starting_left_turn_00)",
                       commonroad_scene(DECISIONS[3], "hard_starting_left_turn_00", "synthetic-hard")))
    except Exception as exc:  # noqa: BLE001 - the bridge's suites are optional on a bare machine
        print(f"[bench_gpu] synthetic junction left out: {exc}", file=sys.stderr)
    lines = ["| scene | device | full cycle p50 (ms) | min (ms) | chosen | max distance to the CPU's trajectory (m) |",
             "|---|---|---|---|---|---|"]
    for name, pi in scenes:
        reference = None
        for device in devices:
            planner = DecisionGuidedPlanner(DecisionGuidedConfig(device=device))
            times, results = timed(lambda i: planner.plan_detailed(pi, 60.0), cycles, device,
                                   f"planner {device} {name}")
            poses = [np.column_stack([r.trajectory.x, r.trajectory.y]) for r in results]
            if reference is None:
                reference, gap = poses, "-"
            else:
                gap = f"{max(float(np.abs(a - b).max()) for a, b in zip(reference, poses)):.2g}"
            lines.append(f"| {name} | {device} | {ms(times)} | {min(times) * 1e3:.1f} | {results[-1].action} | {gap} |")
    return lines


def decision_rows(devices: list[str], base: str, repeats: int) -> list[str]:
    prompts = PromptManager()
    queries = [prompts.decision_query(student_scene(i)) for i in range(repeats + 1)]
    pool = [example(prompts, i) for i in range(3 * (repeats + 1))]
    lines = ["| device | dtype | K | prompt tokens | same items p50 (ms) | other items p50 (ms) | "
             "max abs difference of pi to the CPU's |",
             "|---|---|---|---|---|---|---|"]
    reference: dict[int, list[np.ndarray]] = {}
    for device in devices:
        student = DualHeadStudent.from_base(StudentConfig(base_model=base, device=device), prompts)
        for k in (0, 3):
            same = pool[:k]
            warm, outs = timed(lambda i: student.predict(queries[i], same), repeats, device, f"dpp {device} K={k}")
            cold, _ = timed(lambda i: student.predict(queries[i], pool[k * i:k * (i + 1)]), repeats, device,
                            f"dpp {device} K={k} other")
            probs = [np.asarray(p, dtype=float) for p, _ in outs]
            if k not in reference:
                reference[k], gap = probs, "-"
            else:
                gap = f"{max(float(np.abs(a - b).max()) for a, b in zip(reference[k], probs)):.2g}"
            tokens = student.predict(queries[0], same)[1].prompt_tokens
            lines.append(f"| {device} | {str(student.lm.dtype).replace('torch.', '')} | {k} | {tokens} | {ms(warm)} | "
                         f"{ms(cold)} | {gap} |")
        del student
    return lines


def distill_rows(devices: list[str], base: str, steps: int, batch_size: int, threads: int) -> list[str]:
    from luna_offline.distill import collate

    prompts = PromptManager()
    pool = [example(prompts, i) for i in range(3 * batch_size)]
    lines = [f"CPU threads: {threads}.", "",
             "| device | dtype | batch | optimizer step p50 (ms) | samples/s | tokens/s |", "|---|---|---|---|---|---|"]
    torch.set_num_threads(threads)
    for device in devices:
        torch.manual_seed(0)
        student = DualHeadStudent.from_base(StudentConfig(base_model=base, device=device), prompts)
        student.train()
        optimizer = torch.optim.AdamW(student.trainable_parameters(), lr=1e-4, weight_decay=0.0)
        pad = student.tokenizer.eos_token_id
        samples = []
        for j in range(batch_size):
            k = j % 4
            ids, commit, _ = student.encode_training_sample(prompts.decision_query(student_scene(j)),
                                                            pool[3 * j:3 * j + k], pool[j].answer)
            samples.append((ids, commit, np.full(10, 0.1)))
        batch = collate(samples, pad, student.device)
        tokens = sum(len(ids) for ids, _, _ in samples)

        def step(_: int) -> None:
            losses = student(**batch, alpha=1.0)
            losses["total"].backward()
            torch.nn.utils.clip_grad_norm_(student.trainable_parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()

        times, _ = timed(step, steps, device, f"distill {device}")
        p50 = statistics.median(times)
        lines.append(f"| {device} | {str(student.lm.dtype).replace('torch.', '')} | {batch_size} ({tokens} tokens) | "
                     f"{p50 * 1e3:.0f} | {batch_size / p50:.1f} | {tokens / p50:.0f} |")
        del student, optimizer
    return lines


def random_base(folder: Path, out: Path) -> str:
    """A base model of ``folder``'s architecture with random weights (seed 0), saved under ``out``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    return str(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when present")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the one-core figures of the issue)")
    ap.add_argument("--base", default="smollm2-135m-instruct", help="base model (packaged name or folder)")
    ap.add_argument("--random-base", type=Path, help="folder with config.json + tokenizer: random weights")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--train-threads", type=int, default=None, help="CPU threads of the distillation step "
                    "(default: --threads; training on a CPU would use them all)")
    ap.add_argument("--parts", nargs="+", default=["planner", "decision", "distill"],
                    choices=["planner", "decision", "distill"])
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    lines = ["Command: `python benchmarks/bench_gpu.py " + " ".join(sys.argv[1:]) + "`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, GPU {gpu}; torch {torch.__version__}, "
             f"{args.threads} CPU thread(s); medians of {args.cycles} planner cycles, {args.repeats} decisions, "
             f"{args.steps} optimizer steps, each after one warm-up call (three on a GPU).", ""]

    def report() -> None:
        text = "\n".join(lines)
        print(text, flush=True)
        if args.markdown:
            args.markdown.write_text(text + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        base = random_base(args.random_base, Path(tmp) / "base") if args.random_base else args.base
        if args.random_base:
            lines += [f"Base language model: the architecture of `{args.random_base}/config.json` with random "
                      "weights (same graph and cost as the trained weights).", ""]
        for part, make in (("planner", lambda: planner_rows(devices, args.cycles)),
                           ("decision", lambda: decision_rows(devices, base, args.repeats)),
                           ("distill", lambda: distill_rows(devices, base, args.steps, args.batch_size,
                                                             args.train_threads or args.threads))):
            if part not in args.parts:
                continue
            t0 = time.monotonic()
            try:
                lines += [f"### {part}", ""] + make() + ["", f"({time.monotonic() - t0:.0f} s)", ""]
            except Exception as exc:  # noqa: BLE001 - one failing part must not lose the others' figures
                import traceback
                traceback.print_exc()
                lines += [f"### {part}", "", f"FAILED: {type(exc).__name__}: {exc}", ""]
            report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
