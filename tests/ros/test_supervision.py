"""`luna up` supervises like a vehicle's launcher (issue 17): kill -9 of any process of the full stack
leaves the others running, the process is restarted and back (its managed nodes active again), and
the planner never stops publishing while another process is down.

One stack (every process of config/topology.yaml, T_d = 2 s, the bundled models, a lane graph from a
map file, odometry and objects from this test) serves the whole module; each case kills one process.
The supervisor must respawn a killed process within its back-off (asserted tightly: that part is the
supervisor's), or, for the processes with a warm standby (planner, decision), promote that standby;
the process's own start is bounded loosely (3 x max(2 T_d, its cold start)) because the
machine's load stretches it. Each case starts once the planner publishes steadily again (a kill lands
on a stack in steady state, not in the previous case's restart). The measured restart times, against the 2 T_d goal, are in
docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor

import luna_msgs.msg as lm
from luna_bringup.topology import config_dir, load_topology
from luna_core import types as T
from luna_core.lane_graph_io import save_lane_graph
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.ros.helpers import apply_ros_env, ros_env

# realtime: a planner that keeps publishing while another process is down is a wall-clock bound, so
# `make test` runs this file after the parallel phase, alone on the machine.
pytestmark = [pytest.mark.slow, pytest.mark.realtime]

T_D = 2.0  # s, the decision period of this stack
LUNA = str(Path(sys.executable).parent / "luna")
#: The longest the planner may go without publishing while another process is down (s): 2 T_d, the decision
#: timeout, so that a planner that stops fails; the load of the stack's own restarts stretches its cycles (2.17 s
#: at load 6.2 in a fresh clone's run, session 51; 2.04 s on a CI runner), and the T_d goal is measured in
#: docs/benchmarks.md, as the restart times are.
PLANNER_GAP = 2 * T_D
#: The planner's replan period in this stack (s; config/planner.yaml).
REPLAN_PERIOD = 0.5
#: The longest from kill -9 to the new process's creation (s): the 0.2 s back-off plus the supervisor's poll.
SUPERVISOR_DELAY = 1.0
#: How much a loaded machine may stretch a process's start over max(2 T_d, its cold start).
START_SLACK = 3.0
STANDBY_STARTED = re.compile(r"started a standby for \S+ \(pid (\d+)\)")
STANDBY_PROMOTED = re.compile(r"its standby \(pid (\d+)\) takes over")


@dataclass
class Stack:
    up: subprocess.Popen
    log: list[str]
    started: float  # monotonic time luna up was started
    trajectories: list[float] = field(default_factory=list)  # monotonic arrival times
    diagnostics: dict[str, list[float]] = field(default_factory=dict)  # node -> monotonic arrival times
    cold_start: dict[str, float] = field(default_factory=dict)  # process -> s from luna up to heard from

    def heard_after(self, process: str, since: float) -> float | None:
        """When every node of ``process`` was first heard from after ``since`` (the planner: also a
        trajectory, i.e. active again); None if not yet."""
        spec = next(p for p in load_topology().processes if p.name == process)
        heard = [min((t for t in self.diagnostics.get(n, []) if t > since), default=None) for n in spec.nodes]
        if process == "planner":
            heard.append(min((t for t in self.trajectories if t > since), default=None))
        return None if None in heard else max(heard)

    def planner_steady(self, span: float = 2.0) -> bool:
        """Whether the planner published through the last ``span`` s with no gap over two replan periods:
        a case starts from a stack in steady state, not from the previous case's restart."""
        now = time.monotonic()
        recent = [t for t in self.trajectories if t >= now - span]
        stamps = [now - span, *recent, now]
        return len(recent) >= 2 and max(b - a for a, b in zip(stamps, stamps[1:])) <= 2 * REPLAN_PERIOD

    def standbys(self) -> set[int]:
        """Pids of the warm standbys still waiting (started, not yet promoted), from luna up's log."""
        started = {int(m.group(1)) for line in list(self.log) if (m := STANDBY_STARTED.search(line))}
        promoted = {int(m.group(1)) for line in list(self.log) if (m := STANDBY_PROMOTED.search(line))}
        return started - promoted

    def pids(self) -> dict[str, int]:
        """Process name -> pid of the live stack processes (by their executable; standbys left out)."""
        executables = {p.executable: p.name for p in load_topology().processes}
        waiting = self.standbys()
        out = {}
        for child in psutil.Process(self.up.pid).children():
            if child.pid in waiting:
                continue
            try:  # a console script runs as "python <bin>/planner --ros-args ..."
                names = [Path(arg).name for arg in child.cmdline()[:2]]
                alive = child.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                continue
            exe = next((n for n in names if n in executables), None)
            if exe is not None and alive:
                out[executables[exe]] = child.pid
        return out


def _params(tmp: Path) -> Path:
    params = tmp / "params"
    params.mkdir()
    for f in config_dir().glob("*.yaml"):
        if f.name != "topology.yaml":
            (params / f.name).write_text(f.read_text())
    map_file = tmp / "map.json"
    save_lane_graph(samples.lane_graph(), map_file)
    # Light settings (no retrieval, a small search): the 2 shared cores also run the restarts.
    overrides = {"map_server": {"map_file": str(map_file)},
                 "decision_inference": {"decision_period": T_D, "k": 0},
                 "planner": {"decision_period": T_D, "decision_timeout": 2 * T_D, "population": 16,
                             "time_budget": 0.1},
                 "progress_monitor": {"decision_period": T_D}}
    for node, values in overrides.items():
        path = params / f"{node}.yaml"
        data = yaml.safe_load(path.read_text())
        data[node]["ros__parameters"].update(values)
        path.write_text(yaml.safe_dump(data))
    return params


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    import rclpy
    from rclpy.node import Node

    tmp = tmp_path_factory.mktemp("supervision")
    apply_ros_env()
    context = rclpy.Context()
    rclpy.init(context=context)
    started = time.monotonic()
    up = subprocess.Popen([LUNA, "up", "--params-dir", str(_params(tmp))],
                          env=ros_env({"LUNA_DATA": str(tmp / "data")}), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    s = Stack(up, [], started)
    reader = threading.Thread(target=lambda: s.log.extend(up.stdout), daemon=True)
    reader.start()
    node = Node("supervision_probe", context=context)
    node.create_subscription(lm.Trajectory, "planning/trajectory", lambda _: s.trajectories.append(time.monotonic()),
                             qos.RELIABLE)

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            s.diagnostics.setdefault(status.name.removeprefix("luna: "), []).append(time.monotonic())
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, qos.DIAGNOSTICS)
    odom = node.create_publisher(Odometry, "localization/kinematic_state", qos.STATE)
    objects = node.create_publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
    route = node.create_publisher(lm.Route, "planning/route", qos.LATCHED)
    route.publish(C.route_to_msg(T.Route(0.0, ["r0", "j"])))
    lead = T.TrackedObject("lead", T.ObjectClass.VEHICLE, 60.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9)

    def inputs() -> None:  # 20 Hz: an ego standing on the map with a car ahead
        now = node.get_clock().now().nanoseconds * 1e-9
        odom.publish(C.ego_to_odometry(T.EgoState(now, 20.0, 0.0, 0.0, 0.0)))
        objects.publish(C.objects_to_msg(T.TrackedObjects(now, [lead])))
    node.create_timer(0.05, inputs)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    done = threading.Event()

    def spin() -> None:  # inputs at 20 Hz whatever the test is waiting for
        while not done.is_set():
            executor.spin_once(timeout_sec=0.05)
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        names = [p.name for p in load_topology().processes]
        _wait(lambda: all(s.heard_after(n, started) for n in names), 300.0,
              lambda: f"every node up and the planner publishing; diagnostics from {sorted(s.diagnostics)}")
        s.cold_start = {n: s.heard_after(n, started) - started for n in names}
        print(f"\ncold start (all processes at once): {', '.join(f'{n} {t:.1f} s' for n, t in s.cold_start.items())}")
        yield s
    finally:
        done.set()
        spinner.join()
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        reader.join(timeout=10.0)
    print("\n" + "\n".join(line.rstrip() for line in s.log if "stopped on SIG" in line))
    # A process that outlived SIGINT printed its threads' stacks (the supervisor's SIGUSR1): show them last.
    hung = next((i for i, line in enumerate(s.log) if "their threads' stacks follow" in line), len(s.log))
    assert up.returncode == 0, "\n".join(s.log[max(0, hung - 50):hung] + s.log[hung:][-400:])


def _wait(predicate, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(0.02)


def _uptime() -> float:
    """Seconds since boot (the clock of /proc/<pid>/stat's start times; psutil's create_time adds the
    boot time rounded to a second, too coarse here)."""
    return float(Path("/proc/uptime").read_text().split()[0])


def _started_uptime(pid: int) -> float:
    """When process ``pid`` was created, in seconds since boot."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5), counted after "pid (comm)"


@pytest.mark.parametrize("name", [p.name for p in load_topology().processes])
def test_kill_9_of_a_process_restarts_it_and_the_others_keep_running(stack, name):
    standby = next(p.standby for p in load_topology().processes if p.name == name)
    if standby:  # its standby starts 10 s after the process and then loads (the earlier cases ran meanwhile)
        _wait(lambda: any(line.startswith(f"[{name} standby]") and "standby: ready" in line for line in list(stack.log)),
              300.0, f"the standby of {name} ready")
    _wait(stack.planner_steady, 60.0, "the planner publishing steadily before the kill")
    waiting = stack.standbys()
    before = stack.pids()
    assert set(before) == {p.name for p in load_topology().processes}, f"processes before the kill: {before}"
    killed, killed_uptime = time.monotonic(), _uptime()
    os.kill(before[name], signal.SIGKILL)

    _wait(lambda: stack.heard_after(name, killed + 0.05) is not None, 120.0, f"{name} to come back")
    took = stack.heard_after(name, killed + 0.05) - killed
    after = stack.pids()
    if standby:  # the warm standby took over: the supervisor's part is its promotion
        assert after[name] in waiting, f"{name}: pid {after[name]} is not the standby that waited ({waiting}):\n" + \
            "\n".join(line for line in stack.log if line.startswith("[luna]"))
        assert any(f"its standby (pid {after[name]}) takes over" in line for line in stack.log)
        respawned = float("nan")
    else:
        respawned = _started_uptime(after[name]) - killed_uptime
    # The planner's publishing while the process was down (its own restart is the standby's promotion).
    window = [t for t in stack.trajectories if killed - 1.0 <= t <= killed + took + 1.0]
    gap = max((b - a for a, b in zip(window, window[1:])), default=0.0)
    print(f"\n{name}: {'standby promoted' if standby else f'respawned {respawned:.2f} s'} and back {took:.1f} s "
          f"after kill -9 (pid {before[name]} -> {after.get(name)}; cold start {stack.cold_start[name]:.1f} s; "
          f"load {os.getloadavg()[0]:.1f}; the planner's longest gap {gap:.2f} s)")
    assert stack.up.poll() is None, "luna up ended: " + "\n".join(stack.log[-30:])
    assert after[name] != before[name], "the killed process was not restarted"
    assert {n: p for n, p in after.items() if n != name} == {n: p for n, p in before.items() if n != name}, \
        "another process was stopped or restarted"
    assert any(f"process {name} exited with code -9; restarting it" in line for line in stack.log)
    nice = next(p.nice for p in load_topology().processes if p.name == name)  # nice -n adds to luna up's own
    assert psutil.Process(after[name]).nice() == min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    # The supervisor's own part of the restart: the back-off (0.2 s) and its poll period, whatever the load.
    assert standby or respawned <= SUPERVISOR_DELAY, f"{name} was respawned {respawned:.2f} s after the kill"
    # The rest is the process's own start, which the machine's load stretches (a shared CI runner once
    # took 5.0 s for the monitor that is back in 1.6 s on an idle machine): bounded here loosely, so that a
    # hanging restart fails; the 2 T_d goal is measured on a quiet machine in docs/benchmarks.md.
    limit = max(2 * T_D, stack.cold_start[name]) * START_SLACK
    assert took <= limit, f"{name} came back {took:.1f} s after the kill (limit {limit:.0f} s)"
    if name != "planner":
        assert window and gap <= PLANNER_GAP, f"the planner stopped publishing for {gap:.1f} s while {name} was down"
