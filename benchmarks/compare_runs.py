"""Per-scenario CLS differences of one planner between two evaluation folders (the "largest moves" and
"N of 166 runs scored the same" of docs/benchmarks.md):

    .venv/bin/python benchmarks/compare_runs.py out/eval/before luna-k0 out/eval/standard luna-k0
"""
import json, glob, sys, os
a, pa, b, pb = sys.argv[1:5]
rows = []
for suite in ["synthetic-hard", "synthetic-random", "commonroad"]:
    for mode in ["non_reactive", "reactive"]:
        for f in glob.glob(f"{a}/{suite}/scenarios/{pa}/{mode}/*.json"):
            g = f"{b}/{suite}/scenarios/{pb}/{mode}/{os.path.basename(f)}"
            if os.path.exists(g):
                sa, sb = json.load(open(f))["score"], json.load(open(g))["score"]
                rows.append((sb - sa, suite, mode[:1].upper(), os.path.basename(f)[:-5], sa, sb))
rows.sort()
same = sum(1 for r in rows if abs(r[0]) < 1e-9)
print(f"{len(rows)} runs compared, {same} identical")
for r in rows[:6] + [None] + rows[-6:]:
    print("..." if r is None else f"{r[0]:+.3f} {r[1]} {r[2]} {r[3]} {r[4]:.3f} -> {r[5]:.3f}")
