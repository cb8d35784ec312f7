"""Benchmark of memory-bank retrieval (issue 4): p50/p99 latency of top-3 retrieval at 1k, 10k, 100k items.

A real bank on disk (journal, manifest) grows to each size; for each size it is opened with the exact
``flat`` index and the approximate ``hnsw`` one, and ``MemoryBank.retrieve(vector, k=3)`` is timed
per call. Item embeddings and queries are random unit 384-d vectors (the latency of a search does not
depend on what the vectors mean; random vectors are the hard case for HNSW recall). Also reported:
append throughput, open time (journal read + index build, and with a saved HNSW graph), HNSW recall@3
against flat, and the
latency of embedding one query text with all-MiniLM-L6-v2 (what ``retrieve(text)`` adds on top).

    .venv/bin/python benchmarks/bench_retrieval.py --markdown /tmp/retrieval.md \\
        --plot docs/figures/bench_retrieval.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import torch
from tqdm import tqdm

from luna_core.memory import MemoryBank, MiniLMEmbedder, SceneVectorEmbedder
from luna_core.types import MemoryItem

DIM = 384
SIZES = (1_000, 10_000, 100_000)
K = 3


def _items(rng: np.random.Generator, start: int, n: int) -> list[MemoryItem]:
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    p = np.full(10, 0.1)
    return [MemoryItem(id=f"i{start + j}", query=f"[Traffic state] bench scene {start + j}",
                       answer="bench rationale", distribution=p, embedding=v)
            for j, v in enumerate(vectors)]


def _latencies(bank: MemoryBank, queries: np.ndarray) -> tuple[np.ndarray, list[list[str]]]:
    bank.retrieve(queries[0], k=K)  # warm-up
    times = np.empty(len(queries))
    results = []
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        hits = bank.retrieve(q, k=K)
        times[i] = time.perf_counter() - t0
        results.append([item.id for item, _ in hits])
    return times, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--markdown")
    parser.add_argument("--plot")
    parser.add_argument("--no-minilm", action="store_true", help="skip the query-embedding latency")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (MiniLM)")
    parser.add_argument("--faiss-threads", type=int, default=1,
                        help="OpenMP threads of faiss (1 is fastest for single queries)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.faiss_threads)
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(args.queries, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    workdir = tempfile.mkdtemp(prefix="bench_retrieval_")
    path = os.path.join(workdir, "bank")
    embedder = SceneVectorEmbedder(DIM, layout="bench-random-unit-vectors")
    rows = []
    try:
        writer = MemoryBank.create(path, embedder)
        for size in tqdm(SIZES, desc="bank size"):
            t0 = time.perf_counter()
            for start in range(len(writer), size, 5_000):  # batches of 5k appends, one fsync each
                writer.append_many(_items(rng, start, min(5_000, size - start)))
            append_rate = (size - rows[-1]["size"] if rows else size) / (time.perf_counter() - t0)
            row = {"size": size, "append_per_s": append_rate,
                   "journal_mb": os.path.getsize(os.path.join(path, "items.jsonl")) / 1e6}
            exact = None
            for kind in ("flat", "hnsw"):
                t0 = time.perf_counter()
                bank = MemoryBank.open(path, embedder, index=kind)
                row[f"{kind}_open_s"] = time.perf_counter() - t0
                times, results = _latencies(bank, queries)
                row[f"{kind}_p50_ms"] = float(np.percentile(times, 50) * 1e3)
                row[f"{kind}_p99_ms"] = float(np.percentile(times, 99) * 1e3)
                if kind == "flat":
                    exact = results
                else:
                    row["hnsw_recall"] = float(np.mean([len(set(a) & set(b)) / K
                                                        for a, b in zip(exact, results)]))
                    bank.save_index()
                    t0 = time.perf_counter()
                    MemoryBank.open(path, embedder, index=kind).close()
                    row["hnsw_cached_open_s"] = time.perf_counter() - t0
                bank.close()
            rows.append(row)
        writer.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    minilm = None
    if not args.no_minilm:
        model = MiniLMEmbedder()
        texts = [f"Junction ahead in {d} m. Traffic light: Red. Ego speed {v:.1f} m/s, lead vehicle "
                 f"{d / 2:.0f} m ahead in the same lane." for d, v in zip(range(200), np.linspace(0, 15, 200))]
        model.embed_query(texts[0])
        times = []
        for text in texts:
            t0 = time.perf_counter()
            model.embed_query(text)
            times.append(time.perf_counter() - t0)
        minilm = (np.percentile(times, 50) * 1e3, np.percentile(times, 99) * 1e3)

    lines = [f"faiss {faiss.__version__}, {args.faiss_threads} faiss thread(s), CPU; {args.queries} queries per cell, "
             "top-3 by `MemoryBank.retrieve` (includes the Python wrapper). Random unit 384-d vectors "
             "for items and queries. HNSW: M = 32, efSearch = 64, efConstruction = 40. Shared 2-core "
             "machine: timings are noisy.", "",
             "| items | flat p50 ms | flat p99 ms | HNSW p50 ms | HNSW p99 ms | HNSW recall@3 | "
             "open flat s | open HNSW (build) s | open HNSW (saved graph) s | appends/s | journal MB |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['flat_p50_ms']:.3f} | {r['flat_p99_ms']:.3f} | "
                     f"{r['hnsw_p50_ms']:.3f} | {r['hnsw_p99_ms']:.3f} | {r['hnsw_recall']:.3f} | "
                     f"{r['flat_open_s']:.2f} | {r['hnsw_open_s']:.2f} | {r['hnsw_cached_open_s']:.2f} | "
                     f"{r['append_per_s']:,.0f} | "
                     f"{r['journal_mb']:.0f} |")
    if minilm is not None:
        lines += ["", f"Embedding one query text with all-MiniLM-L6-v2 on CPU, {args.threads} torch threads "
                      f"(what `retrieve(text)` adds): p50 {minilm[0]:.1f} ms, p99 {minilm[1]:.1f} ms "
                      "(200 texts)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.plot:
        plot(rows, args.plot)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sizes = [r["size"] for r in rows]
    for kind, label in (("flat", "flat (exact)"), ("hnsw", "HNSW")):
        ax.loglog(sizes, [r[f"{kind}_p50_ms"] for r in rows], marker="o", label=f"{label} p50")
        ax.loglog(sizes, [r[f"{kind}_p99_ms"] for r in rows], marker="x", linestyle="--",
                  label=f"{label} p99")
    ax.set_xlabel("items in the bank")
    ax.set_ylabel("top-3 retrieval latency (ms)")
    ax.set_title("Memory-bank retrieval, 384-d, CPU")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
