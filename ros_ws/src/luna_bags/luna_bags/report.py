"""The replay report: what the stack decided, planned, detected and explained over a bag.

Reads a bag holding the stack's inputs and outputs (``luna replay`` writes one; any recording of a
running stack works) with rosbags only, so it runs on any machine, and writes ``report.html`` and
``report.md`` with PNG plots (matplotlib, Agg backend: headless). Sections: overview, decision
distribution over time, candidate sets, trajectories over the recorded ego path, failure events,
explanations and reflections, latencies, diagnostics. A section whose topic is absent says so.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from luna_core.types import ACTION_CODES  # noqa: E402

from .msgtypes import MessageTypes, UnknownMessageType  # noqa: E402
from .reader import BagIssue, BagReader  # noqa: E402
from .topics import (DECISION, DIAGNOSTICS, EXPLANATION, FAILURE, INPUT_TOPICS, LANE_GRAPH, OBJECTS,  # noqa: E402
                     ODOMETRY, OUTPUT_TOPICS, REFLECTION, TRAJECTORY)

_REPORT_TOPICS = (ODOMETRY, OBJECTS, LANE_GRAPH, DECISION, FAILURE, EXPLANATION, REFLECTION, TRAJECTORY, DIAGNOSTICS)
_DIAG_LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}
_TEXT_LIMIT = 600  # characters of an explanation / reflection shown in the tables


def _stamp(msg: object) -> float:
    s = msg.header.stamp
    return s.sec + s.nanosec * 1e-9


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)  # file names relative to the report


@dataclass
class ReportData:
    """The decoded messages the report needs, in receive order (bag time, message)."""

    counts: dict[str, tuple[str, int]]  # topic -> (type, count)
    issues: list[BagIssue]
    first_ns: int
    messages: dict[str, list[tuple[float, object]]] = field(default_factory=dict)
    undecodable: Counter = field(default_factory=Counter)

    def get(self, topic: str) -> list[tuple[float, object]]:
        return self.messages.get(topic, [])


def load(bag: Path, types: MessageTypes | None = None) -> ReportData:
    """Decode the report's topics from ``bag`` (damaged parts are skipped and listed as issues)."""
    types = types or MessageTypes()
    with BagReader(bag) as reader:
        first, _ = reader.time_range()
        data = ReportData({t: (i.msgtype, i.count) for t, i in reader.topics.items()}, reader.issues, first)
        wanted = []
        for topic in _REPORT_TOPICS:
            info = reader.topics.get(topic)
            if info is None:
                continue
            try:
                types.ensure(info.msgtype)
            except UnknownMessageType:
                if not types.learn_from_bag(info.msgtype, info.msgdef):
                    continue
            wanted.append(topic)
        for msg in reader.messages(wanted):
            try:
                decoded = types.deserialize(msg.data, reader.topics[msg.topic].msgtype)
            except Exception:  # malformed CDR from a damaged bag: counted, not fatal
                data.undecodable[msg.topic] += 1
                continue
            data.messages.setdefault(msg.topic, []).append(((msg.timestamp - first) / 1e9, decoded))
    return data


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


def _absent(topic: str, producer: str) -> str:
    return f"No messages on `{topic}` in this bag: {producer} did not run or published nothing."


def overview(data: ReportData, title: str, notes: list[str]) -> Section:
    sec = Section("Overview")
    span = max((t for msgs in data.messages.values() for t, _ in msgs), default=0.0)
    sec.paragraphs.append(f"{title}: {sum(c for _, c in data.counts.values())} messages on "
                          f"{len(data.counts)} topics over {span:.1f} s. Times below are seconds from the "
                          "first message of the bag.")
    role = {**{t: "input" for t in INPUT_TOPICS}, **{t: "output" for t in OUTPUT_TOPICS}}
    rows = [[t, ty, str(c), role.get(t, "other")] for t, (ty, c) in sorted(data.counts.items())
            if c or t in role]
    sec.tables.append((["topic", "type", "messages", "role"], rows))
    silent = sorted(t for t, (_, c) in data.counts.items() if not c and t not in role)
    if silent:
        sec.paragraphs.append("Also on the graph, without messages: " + ", ".join(silent) + ".")
    problems = [str(i) for i in data.issues]
    problems += [f"{n} undecodable messages on {t} skipped" for t, n in sorted(data.undecodable.items())]
    sec.paragraphs.append("Bag problems: " + ("; ".join(problems) if problems else "none."))
    if notes:
        sec.paragraphs.append("Replay notes: " + "; ".join(notes) + ".")
    return sec


def decisions(data: ReportData, out: Path) -> Section:
    sec = Section("Decision distribution over time")
    msgs = data.get(DECISION)
    if not msgs:
        sec.paragraphs.append(_absent(DECISION, "decision_inference"))
        return sec
    # At their stamps (the instant each decides), not at receipt: a lock-step replay can receive a slow
    # decision after bag time moved on.
    msgs = sorted((((m.header.stamp.sec * 10**9 + m.header.stamp.nanosec - data.first_ns) / 1e9, m) for _, m in msgs),
                  key=lambda tm: tm[0])
    t = np.array([m[0] for m in msgs])
    probs = np.zeros((len(msgs), len(ACTION_CODES)))
    for i, (_, m) in enumerate(msgs):
        for code, p in zip(m.action_codes, m.probabilities):
            if code in ACTION_CODES:
                probs[i, ACTION_CODES.index(code)] = p
    top = [ACTION_CODES[int(np.argmax(p))] for p in probs]
    # Each decision holds until the next one: cell edges halfway between decisions.
    if len(t) > 1:
        edges = np.concatenate([[1.5 * t[0] - 0.5 * t[1]], (t[1:] + t[:-1]) / 2, [1.5 * t[-1] - 0.5 * t[-2]]])
    else:
        edges = np.array([t[0] - 0.05, t[0] + 0.05])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    mesh = ax.pcolormesh(edges, np.arange(len(ACTION_CODES) + 1) - 0.5, probs.T, cmap="magma_r", vmin=0, vmax=1)
    fig.colorbar(mesh, ax=ax, label="probability", pad=0.01)
    ax.plot(t, [ACTION_CODES.index(c) for c in top], "o", ms=3, mfc="none", mec="tab:cyan", label="top action")
    for ft, _ in data.get(FAILURE):
        ax.axvline(ft, color="tab:red", ls="--", lw=1.2)
    ax.set_yticks(range(len(ACTION_CODES)), ACTION_CODES)
    ax.set_ylabel("action")
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=8)
    _save(fig, out / "decisions.png")
    sec.images.append("decisions.png")
    share = Counter(top)
    sec.paragraphs.append(f"{len(msgs)} decisions stamped from {t[0]:.1f} s to {t[-1]:.1f} s: the probability of "
                          "each action (darker = likelier), circles on the most likely action; dashed lines mark "
                          "failure events (red).")
    sec.tables.append((["action", "top action (share)", "mean probability"],
                       [[c, f"{share[c] / len(top):.0%}", f"{probs[:, i].mean():.3f}"]
                        for i, c in enumerate(ACTION_CODES)]))
    return sec


def candidate_sets(data: ReportData, out: Path) -> Section:
    sec = Section("Candidate sets")
    msgs = data.get(DECISION)
    if not msgs:
        sec.paragraphs.append(_absent(DECISION, "decision_inference"))
        return sec
    t = [m[0] for m in msgs]
    sets = [tuple(m[1].candidate_set) for m in msgs]
    fig, ax = plt.subplots(figsize=(10, 2.5))
    ax.step(t, [len(s) for s in sets], where="post")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("|C_t|")
    ax.set_yticks(range(0, max(len(s) for s in sets) + 2))
    _save(fig, out / "candidate_sets.png")
    sec.images.append("candidate_sets.png")
    sec.paragraphs.append("Size of the candidate set C_t (actions with probability >= gamma_p, Eq. 19) over "
                          "time, and the sets seen most often.")
    sec.tables.append((["candidate set (most likely first)", "decisions", "share"],
                       [[" ".join(s) or "(empty)", str(n), f"{n / len(sets):.0%}"]
                        for s, n in Counter(sets).most_common(10)]))
    return sec


def trajectories(data: ReportData, out: Path, every: float = 1.0) -> Section:
    sec = Section("Trajectories over the recorded ego path")
    odom, plans = data.get(ODOMETRY), data.get(TRAJECTORY)
    if not odom and not plans:
        sec.paragraphs.append(_absent(ODOMETRY, "localization (an input)") + " " +
                              _absent(TRAJECTORY, "the planner"))
        return sec
    fig, ax = plt.subplots(figsize=(10, 7))
    for _, graph in data.get(LANE_GRAPH)[-1:]:
        for lane in graph.lanes:
            xy = np.array([[p.x, p.y] for p in lane.centerline])
            if len(xy):
                ax.plot(xy[:, 0], xy[:, 1], color="0.8", lw=0.8, zorder=1)
    tracks: dict[str, list[tuple[float, float]]] = {}
    for _, m in data.get(OBJECTS):
        for o in m.objects:
            tracks.setdefault(o.id, []).append((o.pose.position.x, o.pose.position.y))
    for i, track in enumerate(tracks.values()):
        xy = np.array(track)
        ax.plot(xy[:, 0], xy[:, 1], color="tab:blue", lw=0.8, alpha=0.35, zorder=2,
                label="perceived objects" if i == 0 else None)
    if odom:
        xy = np.array([[m.pose.pose.position.x, m.pose.pose.position.y] for _, m in odom])
        speed = np.array([m.twist.twist.linear.x for _, m in odom])
        points = ax.scatter(xy[:, 0], xy[:, 1], c=speed, s=6, cmap="viridis", zorder=3, label="recorded ego path")
        fig.colorbar(points, ax=ax, label="recorded speed (m/s)")
        for ft, _ in data.get(FAILURE):
            i = int(np.argmin([abs(t - ft) for t, _ in odom]))
            ax.plot(*xy[i], "rx", ms=12, mew=2, zorder=5)
    else:
        sec.paragraphs.append(_absent(ODOMETRY, "localization (an input)"))
    if plans:
        shown, last = 0, -math.inf
        for t, m in plans:
            if t - last < every or not m.points:
                continue
            pxy = np.array([[p.pose.position.x, p.pose.position.y] for p in m.points])
            ax.plot(pxy[:, 0], pxy[:, 1], color="tab:orange", lw=1, alpha=0.7, zorder=4,
                    label="planned trajectory" if shown == 0 else None)
            last, shown = t, shown + 1
        sec.paragraphs.append(f"{len(plans)} planned trajectories; one every {every:.0f} s is drawn (orange) "
                              "over the recorded ego path (coloured by speed) and the perceived objects' tracks (blue); red crosses "
                              "mark failures.")
    else:
        sec.paragraphs.append(_absent(TRAJECTORY, "the planner"))
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.legend(loc="best", fontsize=8)
    _save(fig, out / "trajectories.png")
    sec.images.append("trajectories.png")
    return sec


def failures(data: ReportData) -> Section:
    sec = Section("Failure events")
    msgs = data.get(FAILURE)
    if not msgs:
        sec.paragraphs.append(_absent(FAILURE, "progress_monitor") if FAILURE not in data.counts else
                              "The progress monitor ran and reported no failure.")
        return sec
    def collisions(m) -> str:
        # Bags recorded before FailureEvent had collision_kinds / blocked_by decode without them.
        kinds = list(getattr(m, "collision_kinds", [])) or [""] * len(m.colliding_ids)
        return " ".join(f"{i} ({k})" if k else i for i, k in zip(m.colliding_ids, kinds)) or "-"

    def near_misses(m) -> str:  # older bags have no near-miss fields
        return " ".join(f"{i} ({t:.1f} s)" for i, t in zip(getattr(m, "near_miss_ids", []),
                                                          getattr(m, "near_miss_ttc", []))) or "-"

    sec.tables.append((["time (s)", "issued decision", "collision with (nuPlan type)", "near miss with (TTC)",
                        "stall", "blocked by"],
                       [[f"{t:.2f}", m.issued_decision or "-", collisions(m), near_misses(m),
                         "yes" if m.stall else "no", getattr(m, "blocked_by", "") or "-"] for t, m in msgs]))
    return sec


def explanations(data: ReportData) -> Section:
    sec = Section("Explanations and reflections")
    expl, refl = data.get(EXPLANATION), data.get(REFLECTION)
    if expl:
        sec.tables.append((["time (s)", "candidate set", "explanation", "latency (s)"],
                           [[f"{t:.2f}", " ".join(m.candidate_set), _clip(m.text), f"{m.latency:.2f}"]
                            for t, m in expl]))
    else:
        sec.paragraphs.append(_absent(EXPLANATION, "the explainer (it speaks only after a failure)"))
    if refl:
        sec.tables.append((["time (s)", "normal", "revised answer", "memory item", "error"],
                           [[f"{t:.2f}", "yes" if m.normal else "no", _clip(m.revised_answer),
                             m.memory_item_id or "-", m.error or "-"] for t, m in refl]))
    else:
        sec.paragraphs.append(_absent(REFLECTION, "the reflection client (it answers explanations)"))
    return sec


def latencies(data: ReportData, out: Path) -> Section:
    sec = Section("Latencies")
    series: dict[str, tuple[list[float], list[float]]] = {}
    dec = data.get(DECISION)
    if dec:
        series["decision (retrieval + forward pass)"] = ([t for t, _ in dec], [m.latency for _, m in dec])
        lag = [(t, _stamp(m) - (m.scene_stamp.sec + m.scene_stamp.nanosec * 1e-9)) for t, m in dec
               if m.scene_stamp.sec or m.scene_stamp.nanosec]
        if lag:
            series["decision stamp - scene stamp"] = ([t for t, _ in lag], [v for _, v in lag])
    expl = data.get(EXPLANATION)
    if expl:
        series["explanation generation"] = ([t for t, _ in expl], [m.latency for _, m in expl])
    plans = data.get(TRAJECTORY)
    if len(plans) >= 2:
        stamps = [_stamp(m) for _, m in plans]
        series["planner: time between trajectories"] = ([t for t, _ in plans[1:]], list(np.diff(stamps)))
    if not series:
        sec.paragraphs.append(_absent(DECISION, "decision_inference") + " " + _absent(TRAJECTORY, "the planner"))
        return sec
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 2.2 * len(series)), squeeze=False)
    rows = []
    for ax, (name, (t, v)) in zip(axes[:, 0], series.items()):
        ax.plot(t, np.array(v) * 1e3, ".-", ms=3, lw=0.8)
        ax.set_ylabel("ms")
        ax.set_title(name, fontsize=9)
        arr = np.asarray(v) * 1e3
        rows.append([name, str(len(arr)), f"{np.median(arr):.1f}", f"{np.percentile(arr, 95):.1f}",
                     f"{arr.max():.1f}"])
    axes[-1, 0].set_xlabel("time (s)")
    _save(fig, out / "latencies.png")
    sec.images.append("latencies.png")
    sec.tables.append((["what", "n", "median (ms)", "p95 (ms)", "max (ms)"], rows))
    sec.paragraphs.append("Stamps are bag (simulated) time; latencies reported by the nodes are wall time "
                          "measured on the replay machine.")
    return sec


def diagnostics(data: ReportData) -> Section:
    sec = Section("Diagnostics")
    msgs = data.get(DIAGNOSTICS)
    if not msgs:
        sec.paragraphs.append(_absent(DIAGNOSTICS, "no node"))
        return sec
    levels: dict[str, Counter] = {}
    last_message: dict[str, str] = {}
    for _, m in msgs:
        for status in m.status:
            level = int(status.level[0]) if isinstance(status.level, (bytes, bytearray)) else int(status.level)
            levels.setdefault(status.name, Counter())[_DIAG_LEVELS.get(level, str(level))] += 1
            if level:
                last_message[status.name] = status.message
    sec.tables.append((["status", "OK", "WARN", "ERROR", "STALE", "last non-OK message"],
                       [[name, *(str(c[k]) for k in ("OK", "WARN", "ERROR", "STALE")),
                         _clip(last_message.get(name, "-"), 120)] for name, c in sorted(levels.items())]))
    return sec


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def _clip(text: str, limit: int = _TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _markdown(title: str, sections: list[Section]) -> str:
    lines = [f"# {title}", ""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for p in sec.paragraphs:
            lines += [p, ""]
        for image in sec.images:
            lines += [f"![{sec.title}]({image})", ""]
        for header, rows in sec.tables:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _html(title: str, sections: list[Section]) -> str:
    e = html.escape
    body = [f"<h1>{e(title)}</h1>"]
    for sec in sections:
        body.append(f"<h2>{e(sec.title)}</h2>")
        body += [f"<p>{e(p).replace('`', '')}</p>" for p in sec.paragraphs]
        body += [f'<img src="{e(i)}" alt="{e(sec.title)}">' for i in sec.images]
        for header, rows in sec.tables:
            body.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
            body.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
             "th{background:#f0f0f0}img{max-width:100%;display:block;margin:1em 0}h2{border-bottom:1px solid #ddd}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def write_report(bag: Path, out_dir: Path, title: str | None = None, notes: list[str] | None = None) -> Path:
    """Write ``report.html`` and ``report.md`` (+ PNGs) for ``bag`` into ``out_dir``; returns the HTML path.

    ``notes``: how the run went (e.g. nodes that were not ready), shown in the overview.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    data = load(bag)
    title = title or f"LUNA-AD replay report: {bag.name}"
    sections = [overview(data, str(bag), notes or []), decisions(data, out_dir), candidate_sets(data, out_dir),
                trajectories(data, out_dir), failures(data), explanations(data), latencies(data, out_dir),
                diagnostics(data)]
    (out_dir / "report.md").write_text(_markdown(title, sections), encoding="utf-8")
    path = out_dir / "report.html"
    path.write_text(_html(title, sections), encoding="utf-8")
    return path
