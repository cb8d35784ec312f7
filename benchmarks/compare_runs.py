"""Per-scenario CLS differences of one planner between two evaluation folders (the "largest moves",
"N of 166 runs scored the same" and per-run failing metrics of docs/benchmarks.md):

    .venv/bin/python benchmarks/compare_runs.py out/eval/before luna-k0 out/eval/standard luna-k0
    .venv/bin/python benchmarks/compare_runs.py out/eval/standard pdm out/eval/standard luna \
        --suite commonroad --min-diff 0.05

With ``--min-diff`` every run whose score differs by more is listed with the metrics that fail (score
below 1) on each side and the reflection items each side's decisions used; otherwise the six largest
moves each way. Where either side's runs retrieved reflection items (a bank grown by ``luna-bridge
reflect``), each suite's line also counts the decisions on each side and those that used one, and
``--items`` traces the moves to the items: per reflection item of the second side, the decisions that
used it and those of them where a lesson acted, the runs whose decisions used it, how many of them gained
or lost, and their summed score change (a run that used several items counts for each). Each suite's
line gives both sides' NR and R CLS on the runs compared and, where reflection lessons acted on a side's
decisions (``luna_core.lessons``), in how many decisions and in how many of them the lesson changed the
top action. Where the sides differ in how many decisions showed the student no retrieved example
(``decisions.examples_shown``: a retrieval floor, ``--min-similarity``, or K = 0), the suite's line counts
them, and each listed run names its own counts.

``--rerun-of-a``: the second folder holds only the runs that could move (e.g. those whose decisions used
a reflection item, rerun with a setting that acts only on them); every run it lacks is taken from the
first folder, unchanged, so the CLS lines are whole suites:

    .venv/bin/python benchmarks/compare_runs.py <round 0> luna <reruns> luna --rerun-of-a --items
"""
import argparse
import glob
import json
import os

SUITES = ["synthetic-hard", "synthetic-random", "commonroad"]


def failing(result: dict) -> list[str]:
    return sorted(k for k, m in result["metrics"].items() if m["score"] < 1.0)


def items_of(result: dict) -> dict[str, int]:
    """Reflection item id -> decisions of the run that used it (empty for files that predate the ids)."""
    return (result.get("decisions") or {}).get("reflection_items") or {}


def lesson_decisions(result: dict) -> list[dict]:
    """The run's timeline entries where a lesson acted (they carry the student's own top three)."""
    return [e for e in (result.get("decisions") or {}).get("timeline") or [] if e.get("student_top3")]


def acted_of(result: dict) -> dict[str, int]:
    """Reflection item id -> decisions of the run that used it and where a lesson acted (the timeline names
    a decision's reflection items, not which of them passed the cause check)."""
    acted: dict[str, int] = {}
    for entry in lesson_decisions(result):
        for item_id in entry.get("reflection_items") or []:
            acted[item_id] = acted.get(item_id, 0) + 1
    return acted


def without_examples(result: dict) -> int:
    """The run's decisions that showed the student no retrieved example (0 for files without the count)."""
    return int(((result.get("decisions") or {}).get("examples_shown") or {}).get("0", 0))


def examples_text(ra: dict, rb: dict) -> str:
    a, b = without_examples(ra), without_examples(rb)
    if a == b:
        return ""
    count = (rb.get("decisions") or {}).get("count", 0)
    return f"  no example: {a} -> {b} of {count} decisions"


def used_items(ra: dict, rb: dict) -> str:
    a, b = sorted(items_of(ra)), sorted(items_of(rb))
    return f"  items: {a} -> {b}" if a or b else ""


def print_items(rows: list) -> None:
    by_item: dict[str, list] = {}
    for r in rows:
        acted = acted_of(r[5])
        for item_id, n in items_of(r[5]).items():
            by_item.setdefault(item_id, []).append((r, n, acted.get(item_id, 0)))
    if not by_item:
        print("no run of the second side names a reflection item")
        return
    print("| reflection item | decisions | a lesson acted | runs | gained | lost | summed change |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for item_id, used in sorted(by_item.items(), key=lambda kv: -sum(u[0][0] for u in kv[1])):
        deltas = [r[0] for r, _, _ in used]
        gained, lost = sum(1 for d in deltas if d > 1e-9), sum(1 for d in deltas if d < -1e-9)
        print(f"| {item_id} | {sum(n for _, n, _ in used)} | {sum(a for _, _, a in used)} | {len(used)} | "
              f"{gained} | {lost} | {sum(deltas):+.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("planner_a")
    p.add_argument("b")
    p.add_argument("planner_b")
    p.add_argument("--suite", choices=SUITES, action="append", help="only these suites (repeatable)")
    p.add_argument("--min-diff", type=float, help="list every run that moved by more, with its failing metrics")
    p.add_argument("--items", action="store_true", help="per reflection item of the second side: the runs that "
                   "used it and their score changes")
    p.add_argument("--rerun-of-a", action="store_true", help="the second folder reruns some of the first's runs: "
                   "a run it lacks is the first's, unchanged")
    args = p.parse_args()
    rows = []
    for suite in args.suite or SUITES:
        same = n = 0
        # side -> [decisions, using reflection items, a lesson acted, a lesson changed the top action,
        #          no example shown]
        decisions = {"a": [0, 0, 0, 0, 0], "b": [0, 0, 0, 0, 0]}
        scores: dict[str, tuple[list[float], list[float]]] = {}  # mode -> (a's scores, b's scores)
        for mode in ["non_reactive", "reactive"]:
            for f in sorted(glob.glob(f"{args.a}/{suite}/scenarios/{args.planner_a}/{mode}/*.json")):
                g = f"{args.b}/{suite}/scenarios/{args.planner_b}/{mode}/{os.path.basename(f)}"
                if os.path.exists(g) or args.rerun_of_a:
                    ra = json.load(open(f))
                    rb = json.load(open(g)) if os.path.exists(g) else ra
                    d = rb["score"] - ra["score"]
                    scores.setdefault(mode, ([], []))[0].append(ra["score"])
                    scores[mode][1].append(rb["score"])
                    n += 1
                    same += abs(d) < 1e-9
                    rows.append((d, suite, mode[:1].upper(), os.path.basename(f)[:-5], ra, rb))
                    for side, result in (("a", ra), ("b", rb)):
                        counts = result.get("decisions") or {}
                        decisions[side][0] += counts.get("count", 0)
                        decisions[side][1] += counts.get("using_reflection_items", 0)
                        acted = lesson_decisions(result)
                        decisions[side][2] += len(acted)
                        decisions[side][3] += sum(e["student_top3"][0][0] != e["top3"][0][0] for e in acted)
                        decisions[side][4] += without_examples(result)
        line = f"{suite}: {n} runs compared, {same} identical"
        for mode, (a, b) in scores.items():
            label = "NR" if mode == "non_reactive" else "R"
            line += f"; {label} CLS {100 * sum(a) / len(a):.2f} -> {100 * sum(b) / len(b):.2f}"
        if decisions["a"][1] or decisions["b"][1]:
            line += (f"; decisions {decisions['a'][0]} / {decisions['b'][0]}, using reflection items "
                     f"{decisions['a'][1]} / {decisions['b'][1]}")
        if decisions["a"][2] or decisions["b"][2]:
            line += (f"; a lesson acted in {decisions['a'][2]} / {decisions['b'][2]} (top action changed in "
                     f"{decisions['a'][3]} / {decisions['b'][3]})")
        if decisions["a"][4] != decisions["b"][4]:
            line += (f"; decisions without an example {decisions['a'][4]} of {decisions['a'][0]} / "
                     f"{decisions['b'][4]} of {decisions['b'][0]}")
        print(line)
    rows.sort(key=lambda r: r[:4])
    print(f"all: {len(rows)} runs compared, {sum(1 for r in rows if abs(r[0]) < 1e-9)} identical")
    if args.items:
        print_items(rows)
    if args.min_diff is not None:
        for r in rows:
            if abs(r[0]) > args.min_diff:
                print(f"{r[0]:+.3f} {r[1]} {r[2]} {r[3]} {r[4]['score']:.3f} -> {r[5]['score']:.3f}  "
                      f"fails: {failing(r[4])} -> {failing(r[5])}" + used_items(r[4], r[5]) + examples_text(r[4], r[5]))
        return
    for r in rows[:6] + [None] + rows[-6:]:
        print("..." if r is None else f"{r[0]:+.3f} {r[1]} {r[2]} {r[3]} {r[4]['score']:.3f} -> {r[5]['score']:.3f}")


if __name__ == "__main__":
    main()
