"""Benchmark of memory-bank retrieval (issue 4): p50/p99 latency of top-3 retrieval at 1k, 10k, 100k items.

A real bank on disk (journal, manifest) grows to each size; for each size it is opened with the exact
``flat`` index and the approximate ``hnsw`` one, and ``MemoryBank.retrieve(vector, k=3)`` is timed
per call. Item embeddings and queries are random unit 384-d vectors (the latency of a search does not
depend on what the vectors mean; random vectors are the hard case for HNSW recall). Also reported:
append throughput, open time (journal read + index build, and with a saved HNSW graph; since issue
14.4 the ``save_index()`` of one size also writes the embeddings side file, so the next size's opens
read the smaller sizes' items from it and parse only the rest), HNSW recall@3 against flat, and the
latency of embedding one query text with all-MiniLM-L6-v2 (what ``retrieve(text)`` adds on top).

    .venv/bin/python benchmarks/bench_retrieval.py --markdown /tmp/retrieval.md \\
        --plot docs/figures/bench_retrieval.png

``--real FRAMES...`` (issue 14.4) measures instead on real scene embeddings: the scene vectors
(``luna_core.scene.scene_vector``, what ``SceneVectorEmbedder`` stores) of the frames that
``luna-offline frames`` wrote for the scenario suites, mapped into 384-d by a fixed orthonormal map (an
isometry: every cosine, hence every neighbour and every recall, is that of the 97-d vectors, while the
search costs what a 384-d MiniLM bank's does). Queries are the frames of held-out scenarios (by a hash
of the scenario name), never items. It reports the open time without and with the embeddings side
file, and top-3 latency with recall@3 against exact search for flat and HNSW at several efSearch.
"""

from __future__ import annotations

import argparse
import hashlib
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


def _emit(text: str, markdown: str | None) -> None:
    """Print a result table and write it to ``--markdown`` if given."""
    print(text)
    if markdown:
        with open(markdown, "w", encoding="utf-8") as f:
            f.write(text)

def _items(rng: np.random.Generator, start: int, n: int) -> list[MemoryItem]:
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    p = np.full(10, 0.1)
    return [MemoryItem(id=f"i{start + j}", query=f"[Traffic state] bench scene {start + j}",
                       answer="bench rationale", distribution=p, embedding=v)
            for j, v in enumerate(vectors)]


def _latencies(bank: MemoryBank, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """Wall time and CPU time (process; robust to other processes taking the cores) per call."""
    bank.retrieve(queries[0], k=K)  # warm-up
    wall = np.empty(len(queries))
    cpu = np.empty(len(queries))
    results = []
    for i, q in enumerate(queries):
        t0, c0 = time.perf_counter(), time.process_time()
        hits = bank.retrieve(q, k=K)
        wall[i], cpu[i] = time.perf_counter() - t0, time.process_time() - c0
        results.append([item.id for item, _ in hits])
    return wall, cpu, results


def _recall(exact: list[list[str]], approx: list[list[str]]) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(exact, approx)]))


def _held_out(scenario: str, fraction: float) -> bool:
    return int.from_bytes(hashlib.sha256(scenario.encode()).digest()[:8], "big") / 2.0 ** 64 < fraction


def _timed_open(path: str, embedder: SceneVectorEmbedder, **kw: object) -> tuple[MemoryBank, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    bank = MemoryBank.open(path, embedder, **kw)
    return bank, time.perf_counter() - t0, time.process_time() - c0


def _tie_aware_recall(exact_scores: np.ndarray, got: list[list[float]]) -> np.ndarray:
    """Per query, the share of the k results whose cosine reaches the exact k-th best (minus float
    rounding). Real frames repeat (a car standing still gives the same scene vector for seconds), so
    with ties the exact top-3 *ids* are arbitrary; their scores are not."""
    return np.array([sum(s >= e[-1] - 1e-5 for s in g) / K for e, g in zip(exact_scores, got)])


def minilm_check(args: argparse.Namespace, texts: list[str], scenarios: list[str], held: np.ndarray) -> None:
    """IVF recall@3 on real MiniLM embeddings of ``--minilm-check`` frames' traffic-state texts spread
    over the files (too slow to embed 100k here), with the bank's IVF settings, against exact search
    and against random vectors of the same sizes."""
    import faiss

    from luna_core.memory.bank import IVF_POINTS_PER_LIST, IVF_TRAIN_ITERATIONS
    from luna_core.prompts.manager import traffic_state_text

    torch.set_num_threads(1)
    pick = np.linspace(0, len(texts) - 1, args.minilm_check).astype(int)
    chosen = [traffic_state_text(texts[i]) for i in pick]
    t0, c0 = time.perf_counter(), time.process_time()
    vectors = np.concatenate([MiniLMEmbedder(batch_size=32).embed_texts(chosen[i:i + 256])
                              for i in range(0, len(chosen), 256)])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    is_query = held[pick]
    items, queries = vectors[~is_query], vectors[is_query]
    rng = np.random.default_rng(0)
    random_items = rng.normal(size=items.shape).astype(np.float32)
    random_queries = rng.normal(size=queries.shape).astype(np.float32)
    random_items /= np.linalg.norm(random_items, axis=1, keepdims=True)
    random_queries /= np.linalg.norm(random_queries, axis=1, keepdims=True)
    nlist = int(2 ** round(np.log2(1.6 * np.sqrt(len(items)))))
    lines = [f"MiniLM check: {len(pick)} frames spread over {', '.join(os.path.basename(a) for a in args.real)}, "
             f"{len(set(chosen))} distinct traffic-state texts, embedded in {wall:.0f} s wall / {cpu:.0f} s CPU "
             f"(1 torch thread); {len(items)} items, {len(queries)} queries from held-out scenarios; IVF-Flat "
             f"with {nlist} lists as the bank trains it.", "",
             "| nprobe | lists scanned | recall@3, MiniLM | recall@3, random vectors |", "|---:|---:|---:|---:|"]
    recalls = {}
    for name, (x, q) in {"minilm": (items, queries), "random": (random_items, random_queries)}.items():
        exact = faiss.IndexFlatIP(x.shape[1])
        exact.add(x)
        best, _ = exact.search(q, K)
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(x.shape[1]), x.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.max_points_per_centroid, ivf.cp.niter = IVF_POINTS_PER_LIST, IVF_TRAIN_ITERATIONS
        ivf.train(x)
        ivf.add(x)
        for nprobe in (2, 4, 8, 16, 32):
            ivf.nprobe = nprobe
            scores, _ = ivf.search(q, K)
            recalls[name, nprobe] = _tie_aware_recall(best, scores.tolist()).mean()
    for nprobe in (2, 4, 8, 16, 32):
        lines.append(f"| {nprobe} | {nprobe / nlist:.1%} | {recalls['minilm', nprobe]:.4f} | "
                     f"{recalls['random', nprobe]:.4f} |")
    text = "\n".join(lines) + "\n"
    _emit(text, args.markdown)


def real(args: argparse.Namespace) -> None:
    """Open times and retrieval on real scene embeddings (see the module docstring)."""
    import faiss

    from luna_core.prompts.manager import PromptManager
    from luna_core.scene import scene_vector
    from luna_offline.frames import read_frames

    vectors, scenarios, texts = [], [], []
    prompts = PromptManager()
    for path in args.real:
        for frame in read_frames(path):
            vectors.append(scene_vector(frame.scene))
            scenarios.append(frame.scenario)
            texts.append(prompts.decision_query(frame.scene))  # real Q_md: the journal's real size
    raw = np.stack(vectors)
    held = np.array([_held_out(s, args.holdout) for s in scenarios])
    if args.minilm_check:
        minilm_check(args, texts, scenarios, held)
        return
    item_rows = np.flatnonzero(~held)[:args.real_items]
    rng = np.random.default_rng(0)
    query_rows = rng.choice(np.flatnonzero(held), min(args.queries, int(held.sum())), replace=False)
    facts = {"frames": len(raw), "scenarios": len(set(scenarios)),
             "held_out_scenarios": len({s for s, h in zip(scenarios, held) if h}),
             "items": len(item_rows), "distinct_items": len(np.unique(raw[item_rows], axis=0)),
             "queries": len(query_rows), "distinct_queries": len(np.unique(raw[query_rows], axis=0)),
             "item_scenarios": len({scenarios[i] for i in item_rows})}
    print(facts, flush=True)
    dim = args.real_dim or raw.shape[1]
    lift = np.eye(raw.shape[1], dtype=np.float32)
    if dim != raw.shape[1]:  # orthonormal columns: inner products, and so neighbours, unchanged
        lift = np.linalg.qr(np.random.default_rng(1).normal(size=(dim, raw.shape[1])))[0].astype(np.float32)
    items_v, queries = raw[item_rows] @ lift.T, raw[query_rows] @ lift.T
    embedder = SceneVectorEmbedder(dim, layout=f"bench-scene-vector-isometry-{dim}")
    workdir = tempfile.mkdtemp(prefix="bench_retrieval_real_")
    path = os.path.join(workdir, "bank")
    out: dict[str, object] = dict(facts, dim=dim, faiss=faiss.__version__)
    try:
        p = np.full(10, 0.1)
        t0 = time.perf_counter()
        with MemoryBank.create(path, embedder) as writer:  # closing writes the side file
            for start in tqdm(range(0, len(item_rows), 5_000), desc="appending"):
                rows = range(start, min(start + 5_000, len(item_rows)))
                writer.append_many([MemoryItem(id=f"{scenarios[item_rows[j]]}#{j}", query=texts[item_rows[j]],
                                               answer="bench rationale", distribution=p,
                                               scene_vector=items_v[j]) for j in rows])
        out["build_s"] = time.perf_counter() - t0
        out["journal_mb"] = os.path.getsize(os.path.join(path, "items.jsonl")) / 1e6
        side = [f for f in os.listdir(path) if f.startswith("embeddings-")]
        out["side_mb"] = sum(os.path.getsize(os.path.join(path, f)) for f in side) / 1e6
        hidden = os.path.join(workdir, "hidden")
        os.makedirs(hidden)
        for f in side:
            os.replace(os.path.join(path, f), os.path.join(hidden, f))
        bank, *out["open_journal_only"] = _timed_open(path, embedder, index="flat")
        bank.close()
        for f in side:
            os.replace(os.path.join(hidden, f), os.path.join(path, f))
        bank, *out["open_side"] = _timed_open(path, embedder, index="flat")
        assert bank._side_rows == len(item_rows), "the side file was not used"
        wall, cpu, _ = _latencies(bank, queries)
        exact = [[s for _, s in bank.retrieve(q, k=K)] for q in queries]
        out["flat"] = (wall, cpu, np.ones(len(queries)))
        bank.close()
        writer_bank, *out["open_writer_side"] = _timed_open(path, embedder, writable=True, index="flat")
        writer_bank.close()
        t0, c0 = time.perf_counter(), time.process_time()
        hnsw = MemoryBank.open(path, embedder, index="hnsw")  # builds the graph (once)
        out["hnsw_build"] = (time.perf_counter() - t0, time.process_time() - c0)
        hnsw.save_index()
        hnsw.close()
        runs = [(f"ivf{p}", {"index": "ivf", "ivf_nprobe": p}) for p in args.nprobe]
        runs += [(f"hnsw{ef}", {"index": "hnsw", "hnsw_ef_search": ef}) for ef in args.ef_search]
        for key, options in runs:
            bank, *opened = _timed_open(path, embedder, **options)
            out[f"open_{options['index']}"] = opened
            out[f"{key}_index"] = bank.index_description
            bank.retrieve(queries[0], k=K)
            wall, cpu = np.empty(len(queries)), np.empty(len(queries))
            got = []
            for i, q in enumerate(queries):
                t0, c0 = time.perf_counter(), time.process_time()
                hits = bank.retrieve(q, k=K)
                wall[i], cpu[i] = time.perf_counter() - t0, time.process_time() - c0
                got.append([s for _, s in hits])
            out[key] = (wall, cpu, _tie_aware_recall(np.array(exact), got))
            bank.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [f"Real scene embeddings: {out['items']:,} items ({out['distinct_items']:,} distinct vectors) from "
             f"{out['frames']:,} frames of {out['scenarios']} scenarios ({', '.join(os.path.basename(a) for a in args.real)}); "
             f"{out['queries']} queries ({out['distinct_queries']} distinct) from the {out['held_out_scenarios']} "
             f"held-out scenarios. {out['dim']}-d, faiss {out['faiss']}, 1 faiss thread; journal "
             f"{out['journal_mb']:.0f} MB, side file {out['side_mb']:.0f} MB; 1-min load average "
             f"{os.getloadavg()[0]:.1f} at the end.", "",
             "| open (100k-class bank) | wall s | CPU s |", "|---|---:|---:|"]
    for key, label in (("open_journal_only", "reader, journal only (no side file)"),
                       ("open_side", "reader, side file"), ("open_writer_side", "writer, side file"),
                       ("open_ivf", "reader, IVF (the default index): side file + training the lists"),
                       ("hnsw_build", "reader, HNSW, building the graph"),
                       ("open_hnsw", "reader, HNSW, side file + saved graph")):
        lines.append(f"| {label} | {out[key][0]:.2f} | {out[key][1]:.2f} |")
    lines += ["", "| index | p50 / p99 ms wall | p50 / p99 ms CPU | recall@3 (mean) | queries with recall < 1 |",
              "|---|---:|---:|---:|---:|"]
    for key in ["flat"] + [k for k, _ in runs]:
        wall, cpu, rec = out[key]
        name = "flat (exact)" if key == "flat" else out[f"{key}_index"]
        lines.append(f"| {name} | {np.percentile(wall, 50) * 1e3:.3f} / {np.percentile(wall, 99) * 1e3:.2f} | "
                     f"{np.percentile(cpu, 50) * 1e3:.3f} / {np.percentile(cpu, 99) * 1e3:.2f} | {rec.mean():.4f} | "
                     f"{int((rec < 1).sum())} |")
    text = "\n".join(lines) + "\n"
    _emit(text, args.markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--markdown")
    parser.add_argument("--plot")
    parser.add_argument("--no-minilm", action="store_true", help="skip the query-embedding latency")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (MiniLM)")
    parser.add_argument("--faiss-threads", type=int, default=1,
                        help="OpenMP threads of faiss (1 is fastest for single queries)")
    parser.add_argument("--real", nargs="+", metavar="FRAMES",
                        help="frames files of `luna-offline frames`: measure on their real scene vectors")
    parser.add_argument("--real-items", type=int, default=100_000)
    parser.add_argument("--real-dim", type=int, default=384, help="isometric lift (0: the native 97-d)")
    parser.add_argument("--holdout", type=float, default=0.08, help="share of scenarios held out as queries")
    parser.add_argument("--ef-search", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--nprobe", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--minilm-check", type=int, default=0, metavar="N",
                        help="with --real: only IVF recall on MiniLM embeddings of N frames' texts")
    args = parser.parse_args()
    if args.real:
        import faiss

        faiss.omp_set_num_threads(args.faiss_threads)
        real(args)
        return
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
        for size in tqdm(args.sizes, desc="bank size"):
            t0 = time.perf_counter()
            for start in range(len(writer), size, 5_000):  # batches of 5k appends, one fsync each
                writer.append_many(_items(rng, start, min(5_000, size - start)))
            append_rate = (size - rows[-1]["size"] if rows else size) / (time.perf_counter() - t0)
            row = {"size": size, "append_per_s": append_rate,
                   "journal_mb": os.path.getsize(os.path.join(path, "items.jsonl")) / 1e6}
            t0 = time.perf_counter()
            flat = MemoryBank.open(path, embedder, index="flat")
            row["flat_open_s"] = time.perf_counter() - t0
            wall, cpu, exact = _latencies(flat, queries)
            row.update(flat_p50_ms=np.percentile(wall, 50) * 1e3, flat_p99_ms=np.percentile(wall, 99) * 1e3,
                       flat_cpu_ms=np.percentile(cpu, 50) * 1e3)
            flat.close()
            t0 = time.perf_counter()
            hnsw = MemoryBank.open(path, embedder, index="hnsw")  # builds the graph
            row["hnsw_open_s"] = time.perf_counter() - t0
            wall, cpu, approx = _latencies(hnsw, queries)
            row.update(hnsw_p50_ms=np.percentile(wall, 50) * 1e3, hnsw_p99_ms=np.percentile(wall, 99) * 1e3,
                       hnsw_cpu_ms=np.percentile(cpu, 50) * 1e3, hnsw_recall=_recall(exact, approx))
            hnsw.save_index()
            hnsw.close()
            t0 = time.perf_counter()
            wide = MemoryBank.open(path, embedder, index="hnsw", hnsw_ef_search=256)  # saved graph
            row["hnsw_cached_open_s"] = time.perf_counter() - t0
            wall, cpu, approx = _latencies(wide, queries)
            row.update(hnsw256_p50_ms=np.percentile(wall, 50) * 1e3,
                       hnsw256_p99_ms=np.percentile(wall, 99) * 1e3,
                       hnsw256_cpu_ms=np.percentile(cpu, 50) * 1e3, hnsw256_recall=_recall(exact, approx))
            wide.close()
            rows.append(row)
        writer.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    minilm = None
    if not args.no_minilm:
        model = MiniLMEmbedder()
        texts = [f"Junction ahead in {d} m. Traffic light: Red. Ego speed {v:.1f} m/s, lead vehicle "
                 f"{d / 2:.0f} m ahead in the same lane." for d, v in zip(range(50), np.linspace(0, 15, 50))]
        model.embed_query(texts[0])
        wall, cpu = [], []
        for text in texts:
            t0, c0 = time.perf_counter(), time.process_time()
            model.embed_query(text)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        minilm = (np.percentile(wall, 50) * 1e3, np.percentile(wall, 99) * 1e3, np.percentile(cpu, 50) * 1e3)

    lines = [f"faiss {faiss.__version__}, {args.faiss_threads} faiss thread(s), CPU; {args.queries} queries "
             "per cell, top-3 by `MemoryBank.retrieve` (includes the Python wrapper). Random unit 384-d "
             "vectors for items and queries (the hard case for HNSW recall; real scene embeddings cluster). "
             "HNSW: M = 32, efConstruction = 40, efSearch 64 (default) or 256. Wall-clock p50/p99 and the "
             "p50 of process CPU time per call (CPU time does not count waiting for a core, so it shows "
             "the work itself on this shared, overloaded 2-core machine; wall times are inflated by "
             f"the load: 1-min load average {os.getloadavg()[0]:.1f} at the end of the run).", "",
             "| items | flat p50 / p99 ms | flat CPU ms | HNSW-64 p50 / p99 ms | HNSW-64 CPU ms | "
             "HNSW-64 recall@3 | HNSW-256 p50 / p99 ms | HNSW-256 CPU ms | HNSW-256 recall@3 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['flat_p50_ms']:.3f} / {r['flat_p99_ms']:.2f} | {r['flat_cpu_ms']:.3f} | "
                     f"{r['hnsw_p50_ms']:.3f} / {r['hnsw_p99_ms']:.2f} | {r['hnsw_cpu_ms']:.3f} | "
                     f"{r['hnsw_recall']:.3f} | {r['hnsw256_p50_ms']:.3f} / {r['hnsw256_p99_ms']:.2f} | "
                     f"{r['hnsw256_cpu_ms']:.3f} | {r['hnsw256_recall']:.3f} |")
    lines += ["", "| items | open flat s | open HNSW, building the graph s | open HNSW, saved graph s | "
                  "appends/s (batches of 5k) | journal MB |",
              "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['flat_open_s']:.2f} | {r['hnsw_open_s']:.2f} | "
                     f"{r['hnsw_cached_open_s']:.2f} | {r['append_per_s']:,.0f} | {r['journal_mb']:.0f} |")
    if minilm is not None:
        lines += ["", f"Embedding one query text with all-MiniLM-L6-v2 on CPU, {args.threads} torch threads "
                      f"(what `retrieve(text)` adds): p50 {minilm[0]:.1f} ms, p99 {minilm[1]:.1f} ms wall, "
                      f"p50 {minilm[2]:.1f} ms CPU (summed over threads; 50 texts)."]
    text = "\n".join(lines) + "\n"
    _emit(text, args.markdown)
    if args.plot:
        plot(rows, args.plot)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sizes = [r["size"] for r in rows]
    for kind, label in (("flat", "flat (exact)"), ("hnsw", "HNSW-64"), ("hnsw256", "HNSW-256")):
        ax.loglog(sizes, [r[f"{kind}_p50_ms"] for r in rows], marker="o", label=f"{label} p50")
        ax.loglog(sizes, [r[f"{kind}_cpu_ms"] for r in rows], marker="x", linestyle="--",
                  label=f"{label} CPU p50")
    ax.set_xlabel("items in the bank")
    ax.set_ylabel("top-3 retrieval time per query (ms)")
    ax.set_title("Memory-bank retrieval, 384-d, CPU")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
