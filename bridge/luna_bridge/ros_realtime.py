"""Real time over ROS: the built-in simulator drives the stack at wall-clock speed (issue 14, item 3).

``RealtimeStackPlanner`` is the lock-step bridge's sibling for a stack on system time (``luna up``
without ``--sim-time``): the simulator advances one 0.1 s step per 0.1 s of wall time (``rate`` = 1),
publishes the state stamped with the wall clock and tracks whatever trajectory the planner node
published last; after the first trajectory it never waits for one, as a vehicle would not. It keeps
what a real-time run has to show: every trajectory's and decision's delay from the instant it was
planned or decided for to its arrival here, how old the tracked trajectory was at each step, steps
the bridge itself was late for, and the nodes' own ``/diagnostics`` counters (the planner's
``missed_deadlines`` and cycle time, the decision node's latency and skipped cycles), and where the time
goes: each process's CPU over the run from its nodes' ``process_cpu_s``, beside the bridge's own.

Wire time is the wall clock: simulation time t is sent as t + offset, the offset taken when the first
trajectory has arrived (start-up, model loading, the first search) so that the run then starts on time.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray

import luna_msgs.msg as lm
from luna_core.types import PlannerInput, Trajectory
from luna_msgs_py import convert, qos

from luna_bridge.ros_bridge import LockstepConfig, PlannerTimeout, RosStackPlanner
from luna_bridge.scenario import SIM_DT, Scenario

#: Upper edges (s) of the latency histogram bins; the last bin holds everything above.
BINS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
#: /diagnostics values recorded per node (the last value each node reported is kept for counters).
DIAGNOSTIC_KEYS = ("cycle_time_s", "missed_deadlines", "cycles", "latency_s", "decisions", "skipped_cycles_busy",
                   "failed_decisions", "planner_failures", "rejected_inputs")


@dataclass(frozen=True)
class RealtimeConfig:
    replan_period: float = 0.5  # s, the planner node's replan_period (its deadline)
    decision_period: float = 2.0  # s, T_d: a decision is due every T_d
    rate: float = 1.0  # simulated seconds per wall second
    start_timeout: float = 120.0  # s of wall time for the stack's first trajectory (model loading)
    connect_timeout: float = 30.0  # s of wall time to find the stack's subscribers


@dataclass
class RealtimeRecord:
    """What one real-time run measured (wall seconds unless named otherwise)."""

    trajectory_delay: list[float] = field(default_factory=list)  # arrival - planning instant
    decision_delay: list[float] = field(default_factory=list)  # arrival - decision instant
    decision_gaps: list[float] = field(default_factory=list)  # between consecutive decision instants
    trajectory_age: list[float] = field(default_factory=list)  # per step: tracked trajectory's age
    late_steps: int = 0  # steps the bridge itself started later than one period after their time
    steps: int = 0
    diagnostics: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # node -> key -> values
    # node -> (wall stamp, pid, process CPU s) from /diagnostics, once the run has started
    cpu: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)
    # the bridge process's (wall monotonic s, CPU s, the machine's busy CPU s or None) at the start of the
    # run and at its latest step
    bridge_clock: list[tuple[float, float, float | None]] = field(default_factory=list)


class RealtimeStackPlanner(RosStackPlanner):
    """Drives a stack on system time at wall-clock speed; see the module docstring."""

    name = "ros-stack-realtime"

    def __init__(self, scenario: Scenario, config: RealtimeConfig = RealtimeConfig(), context=None) -> None:
        super().__init__(scenario, LockstepConfig(config.replan_period, config.start_timeout,
                                                  config.connect_timeout, time_offset=time.time()),
                         context=context)
        self.realtime = config
        self.record = RealtimeRecord()
        self.wall_zero: float | None = None  # monotonic wall time of simulation time 0
        self._last_decision_stamp: float | None = None
        self._wire_sent_until: float | None = None  # the newest odometry stamp sent, any scenario (wire time)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, qos.DIAGNOSTICS)

    # -- recording ----------------------------------------------------------------------------------

    def _on_trajectory(self, msg: lm.Trajectory) -> None:
        super()._on_trajectory(msg)
        if self.wall_zero is not None:
            self.record.trajectory_delay.append(time.time() - convert.from_time(msg.header.stamp))

    def _on_decision(self, msg: lm.DecisionDistribution) -> None:
        count = len(self.decisions)
        super()._on_decision(msg)
        if len(self.decisions) == count or self.wall_zero is None:
            return
        stamp = convert.from_time(msg.header.stamp)
        self.record.decision_delay.append(time.time() - stamp)
        if self._last_decision_stamp is not None:
            self.record.decision_gaps.append(stamp - self._last_decision_stamp)
        self._last_decision_stamp = stamp

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            node = status.name.removeprefix("luna: ")
            values = {kv.key: kv.value for kv in status.values}
            for key in DIAGNOSTIC_KEYS:
                try:
                    value = float(values[key])
                except (KeyError, ValueError):
                    continue
                self.record.diagnostics.setdefault(node, {}).setdefault(key, []).append(value)
            if self.wall_zero is None:
                continue  # start-up (model loading, the first search) is not the run's
            try:
                sample = (convert.from_time(msg.header.stamp), int(values["pid"]), float(values["process_cpu_s"]))
            except (KeyError, ValueError):
                continue  # a node that does not report its process
            self.record.cpu.setdefault(node, []).append(sample)

    # -- Planner protocol ---------------------------------------------------------------------------

    stack_command = "luna up"

    def _inputs_to_connect(self) -> tuple:
        return self.odom_pub, self.objects_pub  # a stack on system time does not listen to /clock

    def reset(self) -> None:
        super().reset()
        self.wall_zero = None
        self._last_decision_stamp = None
        self.record = RealtimeRecord()

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        t = planner_input.time
        if self.wall_zero is None:
            return self._start(planner_input)
        # Pace: this step's state goes out at its wall time, never earlier.
        due = self.wall_zero + t / self.realtime.rate
        while (left := due - time.monotonic()) > 0:
            self.executor.spin_once(timeout_sec=min(left, 0.01))
        if time.monotonic() - due > SIM_DT / self.realtime.rate:
            self.record.late_steps += 1
        self._publish_inputs(planner_input)
        self.executor.spin_once(timeout_sec=0.0)
        self.current = self.latest
        self.record.steps += 1
        self.record.trajectory_age.append(t - self.current.stamp)
        self._clock_bridge()
        return self.current

    def _clock_bridge(self) -> None:
        """The bridge's own CPU and the machine's: the run's first entry, then its latest step."""
        sample = (time.monotonic(), time.process_time(), machine_busy_cpu_s())
        if len(self.record.bridge_clock) < 2:
            self.record.bridge_clock.append(sample)
        else:
            self.record.bridge_clock[-1] = sample

    def _publish_ego(self, ego, t: float) -> None:
        super()._publish_ego(ego, t)
        wire = t + self.config.time_offset
        self._wire_sent_until = wire if self._wire_sent_until is None else max(self._wire_sent_until, wire)

    def _start(self, planner_input: PlannerInput) -> Trajectory:
        """The first step: publish the state (kept current on the wire) until the stack answers with a
        trajectory planned from it, then start the clock."""
        t = planner_input.time
        span = t - planner_input.ego_history[0].stamp
        if self._wire_sent_until is not None:
            # A scenario after another: its history goes out stamped up to `span` before now, and the stack
            # refuses odometry older than what it last heard. Wait until all of it is newer.
            self._spin_until(lambda: time.time() - span > self._wire_sent_until + 0.05, span + 1.0)
        anchored = [0.0]

        def anchor() -> None:
            # Wire time = wall time now; the history is sent again each time (a node that was still
            # loading missed it, and one that heard it accepts it once it is newer than before).
            self.config = dataclasses.replace(self.config, time_offset=time.time() - t / self.realtime.rate)
            anchored[0] = time.monotonic()
            for past in planner_input.ego_history[:-1]:
                self._publish_ego(past, past.stamp)
            self._publish_inputs(planner_input)

        def heartbeat() -> None:
            if time.monotonic() - anchored[0] > span + 0.5:  # keep the odometry fresh for the planner
                anchor()
            else:
                self._publish_inputs(planner_input)

        anchor()
        # Planned from this scenario's state: not a trajectory of the previous scenario still on its way.
        arrived = self._spin_until(lambda: self.latest is not None and self.latest.stamp >= t - 1e-6,
                                   self.realtime.start_timeout, heartbeat=heartbeat)
        if not arrived:
            raise PlannerTimeout(f"no trajectory within {self.realtime.start_timeout:.0f} s of the start "
                                 "(is `luna up` running on system time, without --sim-time?)")
        # From now on simulation time t is wall time: re-anchor the wire offset and the pacing.
        self.config = dataclasses.replace(self.config, time_offset=time.time() - t / self.realtime.rate)
        self.wall_zero = time.monotonic() - t / self.realtime.rate
        self.latest.stamp = t  # planned from this (only) state, whatever wire time it was sent at
        self.current = self.latest
        self.record.steps += 1
        self._clock_bridge()
        return self.current

    def _publish_inputs(self, planner_input: PlannerInput) -> None:
        t = planner_input.time
        self._publish_ego(planner_input.ego, t)
        stamp = convert.to_time(t + self.config.time_offset)
        objects = convert.objects_to_msg(planner_input.objects)
        objects.header.stamp = stamp
        self.objects_pub.publish(objects)
        lights = convert.lights_to_msg(planner_input.traffic_lights)
        lights.header.stamp = stamp
        self.lights_pub.publish(lights)


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def histogram(values: list[float]) -> list[int]:
    """Counts per bin of ``BINS`` (upper edges, inclusive) and one bin above the last edge."""
    counts = [0] * (len(BINS) + 1)
    for v in values:
        counts[next((k for k, edge in enumerate(BINS) if v <= edge), len(BINS))] += 1
    return counts


def summary(values: list[float]) -> dict[str, float | int | list[int]]:
    if not values:
        return {"count": 0}
    a = np.asarray(values, dtype=np.float64)
    return {"count": len(a), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "max": float(a.max()), "histogram": histogram(values)}


def machine_busy_cpu_s() -> float | None:
    """CPU seconds all cores of this machine have been busy since boot (Linux ``/proc/stat``: user, nice,
    system and interrupt time), or None where that cannot be read. Over a run it shows the time that no
    /diagnostics names: a process loading its models before its nodes spin, a standby, anything else."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = [int(v) for v in fields[1:]]
        # user, nice, system, irq, softirq (guest time is in user's; steal is the hypervisor's)
        return (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _cores(cpu_s: float, wall_s: float) -> dict[str, float]:
    """CPU and wall seconds and their ratio in cores (1.0 = one core busy the whole time)."""
    return {"cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3),
            "cores": round(cpu_s / wall_s, 3) if wall_s > 0 else 0.0}


def cpu_use(samples: list[tuple[float, int, float]]) -> dict[str, float | int]:
    """A process's CPU between its first and last sample (``_cores``) and its pid; a restarted process
    (new pid) starts a new span."""
    cpu = wall = 0.0
    for prev, cur in zip(samples, samples[1:]):
        if cur[1] == prev[1] and cur[0] > prev[0] and cur[2] >= prev[2]:
            cpu += cur[2] - prev[2]
            wall += cur[0] - prev[0]
    return {"pid": samples[-1][1], **_cores(cpu, wall)}


def report(scenario: str, record: RealtimeRecord, config: RealtimeConfig, cls: float) -> dict:
    """The run's figures: latency summaries and histograms, deadline counts, the nodes' counters, and
    each process's CPU use over the run."""
    nodes = {}
    for node, keys in sorted(record.diagnostics.items()):
        entry: dict[str, object] = {}
        for key, values in sorted(keys.items()):
            entry[key] = summary(values) if key.endswith("_s") else int(values[-1])
        nodes[node] = entry
    for node, samples in sorted(record.cpu.items()):
        nodes.setdefault(node, {})["process"] = cpu_use(samples)
    bridge, machine = {}, {}
    if len(record.bridge_clock) == 2:
        (w0, c0, m0), (w1, c1, m1) = record.bridge_clock
        bridge = {"pid": os.getpid(), **_cores(c1 - c0, w1 - w0)}
        if m0 is not None and m1 is not None:
            machine = _cores(m1 - m0, w1 - w0)
    missed = sum(int(n.get("missed_deadlines", 0)) for n in nodes.values())
    return {
        "scenario": scenario, "cls": cls, "rate": config.rate, "steps": record.steps,
        "replan_period_s": config.replan_period, "decision_period_s": config.decision_period,
        "bins_s": list(BINS),
        "trajectory_delay_s": summary(record.trajectory_delay),
        "trajectories_over_replan_period": sum(d > config.replan_period for d in record.trajectory_delay),
        "trajectory_age_s": summary(record.trajectory_age),
        "decision_delay_s": summary(record.decision_delay),
        "decisions_later_than_t_d": sum(d > config.decision_period for d in record.decision_delay),
        "decision_gap_s": summary(record.decision_gaps),
        "bridge_late_steps": record.late_steps,
        "missed_deadlines": missed,
        "nodes": nodes,
        "bridge_process": bridge,
        "machine": machine,
        "machine_cores": os.cpu_count(),
    }


def markdown(reports: list[dict]) -> str:
    """One table of deadlines per scenario, then the delay histograms."""
    lines = ["| scenario | CLS | steps | trajectory delay p50 / p95 / max (s) | over 0.5 s | decision delay p50 / "
             "max (s) | later than T_d | missed deadlines (/diagnostics) | bridge late steps |",
             "|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for r in reports:
        td, dd = r["trajectory_delay_s"], r["decision_delay_s"]
        fmt = (lambda s, keys: " / ".join(f"{s[k]:.2f}" for k in keys) if s["count"] else "-")
        lines.append(f"| {r['scenario']} | {r['cls']:.3f} | {r['steps']} | {fmt(td, ('p50', 'p95', 'max'))} | "
                     f"{r['trajectories_over_replan_period']} | {fmt(dd, ('p50', 'max'))} | "
                     f"{r['decisions_later_than_t_d']} | {r['missed_deadlines']} | {r['bridge_late_steps']} |")
    lines += ["", *time_per_process(reports)]
    edges = [f"<= {e:g}" for e in BINS] + [f"> {BINS[-1]:g}"]
    lines += ["", "Delay histograms (counts per bin, s):", "", "| scenario | delay | " + " | ".join(edges) + " |",
              "|---|---|" + "---:|" * len(edges)]
    for r in reports:
        for label, key in (("trajectory (planner)", "trajectory_delay_s"), ("decision", "decision_delay_s")):
            s = r[key]
            if s["count"]:
                lines.append(f"| {r['scenario']} | {label} | " + " | ".join(str(c) for c in s["histogram"]) + " |")
    return "\n".join(lines) + "\n"


#: The /diagnostics value that times a node's own work per cycle or decision.
OWN_TIME_KEYS = ("cycle_time_s", "latency_s")


def time_per_process(reports: list[dict]) -> list[str]:
    """Where the time goes: per scenario, each process of the stack (its nodes) and the bridge, the CPU
    it used over the run in cores, and its nodes' own time per cycle or decision; then the whole machine
    and what no /diagnostics accounts for (a process's span without reports is not counted for it)."""
    cores = next((r.get("machine_cores") for r in reports if r.get("machine_cores")), None)
    lines = [f"Where the time goes (CPU over the run, in cores: 1.00 = one core busy all the time; this machine "
             f"has {cores or '?'} cores; own time = the node's latest cycle time or decision latency, as reported each "
             "second):", "",
             "| scenario | process (its nodes) | CPU (cores) | CPU (s) | reported over (s) | own time p50 / max (s) |",
             "|---|---|---:|---:|---:|---|"]
    for r in reports:
        processes: dict[int, list[str]] = {}
        for node, entry in sorted(r["nodes"].items()):
            if "process" in entry:
                processes.setdefault(entry["process"]["pid"], []).append(node)
        rows = []
        for names in processes.values():
            use = r["nodes"][names[0]]["process"]
            own = [f"{n}: {s['p50']:.2f} / {s['max']:.2f}" for n in names for key in OWN_TIME_KEYS
                   if (s := r["nodes"][n].get(key)) and s.get("count")]
            rows.append((use["cores"], f"| {r['scenario']} | {' + '.join(names)} | {use['cores']:.2f} | "
                                       f"{use['cpu_s']:.1f} | {use['wall_s']:.1f} | {'; '.join(own) or '-'} |"))
        lines += [row for _, row in sorted(rows, reverse=True)]
        b, m = r.get("bridge_process"), r.get("machine")
        if b:
            lines.append(f"| {r['scenario']} | the bridge (simulator, this process) | {b['cores']:.2f} | "
                         f"{b['cpu_s']:.1f} | {b['wall_s']:.1f} | - |")
        if b and m:
            named = b["cpu_s"] + sum(r["nodes"][names[0]]["process"]["cpu_s"] for names in processes.values())
            rest = max(0.0, m["cpu_s"] - named)
            lines.append(f"| {r['scenario']} | not in /diagnostics (model loading, standbys, other processes) | "
                         f"{rest / m['wall_s']:.2f} | {rest:.1f} | {m['wall_s']:.1f} | - |")
            lines.append(f"| {r['scenario']} | **the whole machine** | **{m['cores']:.2f}** | {m['cpu_s']:.1f} | "
                         f"{m['wall_s']:.1f} | - |")
    return lines
