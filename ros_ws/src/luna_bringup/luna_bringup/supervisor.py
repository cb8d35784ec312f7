"""Start the topology's processes, stream their logs with node names, restart the ones that die, stop
them cleanly.

The pip-only counterpart of ``ros2 launch``: each process runs in its own session (process group) so
a stop reaches its children too; stopping sends SIGINT (rclpy shuts down cleanly), then SIGTERM and
SIGKILL to stragglers. A process that dies on its own is reported and started again after the
topology's back-off (``RestartPolicy``) while the others keep running; a non-critical one is left down
after the restart limit, and any one that exits for invalid parameters at once (a restart would fail
the same way). Only an explicit stop ends the stack (or nothing being left to run). A managed node comes back active: it
configures and activates itself on start (``autostart``).

Warm standbys (``standby=True``, as ``luna up`` runs; processes marked ``standby`` in the topology): some
time after a process starts (``RestartPolicy.standby_delay``), a second copy of it starts that loads its
models (``luna_nodes.base.await_promotion``) and waits, off the ROS graph, on its stdin. When the process
dies, its restart promotes the standby (a line on that stdin) instead of starting a fresh process, so
the restart does not pay the interpreter, the imports and the model loads; a new standby follows. A
standby that exits on its own is reported and not replaced until the process restarts.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from luna_bringup.topology import ProcessSpec, Topology, config_dir, executable_path, fast_discovery_profile

#: The environment variable that makes a process a standby (luna_nodes.base.STANDBY_ENV; not imported:
#: luna_bringup does not depend on the nodes' package).
STANDBY_ENV = "LUNA_STANDBY"
#: s between two writes of an autogroup's nice that an unprivileged process may make (sched(7), the kernel's
#: rate limit of /proc/<pid>/autogroup).
AUTOGROUP_WRITE_INTERVAL = 0.1

_COLORS = [36, 33, 35, 32, 34, 31, 96, 93]


def stack_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for stack processes: unbuffered output and the fast-discovery DDS profile."""
    env = dict(os.environ if base is None else base)
    env.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(fast_discovery_profile()))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Child:
    """A started process and the thread that streams its output under ``label`` (a standby's label
    changes when it is promoted)."""

    popen: subprocess.Popen
    reader: threading.Thread
    label: list[str]  # one element, read by the reader on every line


@dataclass
class RunningProcess:
    spec: ProcessSpec
    index: int  # position in the topology (log colour)
    child: Child
    expected_exit: bool = False
    restarts: list[float] = field(default_factory=list)  # monotonic times of its restarts
    restart_at: float | None = None  # when the pending restart is due (None: none pending)
    given_up: bool = False  # a non-critical process left down after the restart limit
    standby: Child | None = None  # its warm standby, once started
    standby_due: float | None = None  # when the next standby starts (None: none planned)

    @property
    def popen(self) -> subprocess.Popen:
        return self.child.popen


@dataclass
class Supervisor:
    topology: Topology
    params_dir: Path = field(default_factory=config_dir)
    use_sim_time: bool = False
    env: dict[str, str] | None = None
    out: TextIO = sys.stdout
    color: bool = False
    extra_ros_args: list[str] = field(default_factory=list)
    poll_period: float = 0.1  # s between checks for dead processes
    standby: bool = False  # warm standbys for the processes marked `standby` (luna up)
    processes: list[RunningProcess] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # deaths, restarts, give-ups, for reports
    _print_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None

    def _emit(self, name: str, line: str, index: int) -> None:
        prefix = f"[{name}]"
        if self.color:
            prefix = f"\033[{_COLORS[index % len(_COLORS)]}m{prefix}\033[0m"
        with self._print_lock:
            self.out.write(f"{prefix} {line.rstrip()}\n")
            self.out.flush()

    def log(self, line: str) -> None:
        self._emit("luna", line, 7)

    def command(self, spec: ProcessSpec) -> list[str]:
        args = self.topology.ros_arguments(spec, self.params_dir, self.use_sim_time)
        return [executable_path(spec), *args, *self.extra_ros_args]

    def argv(self, spec: ProcessSpec) -> list[str]:
        """What is started: the command behind the process's prefix (its ``nice``)."""
        return [*spec.command_prefix(), *self.command(spec)]

    def _spawn(self, spec: ProcessSpec, index: int, standby: bool = False) -> Child:
        cmd = self.argv(spec)
        env = stack_environment(self.env)
        if standby:
            env[STANDBY_ENV] = "1"
        popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 start_new_session=True, stdin=subprocess.PIPE if standby else None)
        if spec.nice and (problem := nice_session(popen.pid, spec.nice)):
            self.log(f"{spec.name} runs at nice {spec.nice} only inside its own session: {problem}")
        label = [f"{spec.name} standby" if standby else spec.name]
        reader = threading.Thread(target=self._pump, args=(label, popen, index), daemon=True)
        reader.start()
        if standby:
            self.log(f"started a standby for {spec.name} (pid {popen.pid}): it loads the models and waits to take over")
        else:
            self.log(f"started {spec.name} (pid {popen.pid}): {' '.join(cmd)}")
        return Child(popen, reader, label)

    def _plan_standby(self, p: RunningProcess, now: float) -> None:
        if self.standby and p.spec.standby:
            p.standby_due = now + self.topology.restart.standby_delay

    def start(self) -> None:
        """Start every process, then watch them (restarts) on a thread until ``stop``."""
        now = time.monotonic()
        for i, spec in enumerate(self.topology.processes):
            self.processes.append(RunningProcess(spec, i, self._spawn(spec, i)))
            self._plan_standby(self.processes[-1], now)
        self._watcher = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._watcher.start()

    def _pump(self, label: list[str], popen: subprocess.Popen, index: int) -> None:
        for line in popen.stdout:
            self._emit(label[0], line, index)

    def _event(self, line: str) -> None:
        self.events.append(line)
        self.log(line)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_period):
            self.check()

    def check(self, now: float | None = None) -> None:
        """One supervision step: notice processes that died on their own, restart those that are due."""
        now = time.monotonic() if now is None else now
        policy = self.topology.restart
        for p in self.processes:
            if self._stopping.is_set():
                return
            if p.given_up or p.expected_exit:
                continue
            self._check_standby(p, now)
            if p.restart_at is None and p.popen.poll() is not None:
                self._kill_group(p)  # children of the dead process (model workers) go with it
                recent = [t for t in p.restarts if now - t < policy.window]
                code = p.popen.returncode
                if code in policy.permanent_exit_codes:
                    p.given_up = True
                    self._drop_standby(p)
                    self._event(f"process {p.spec.name} exited with code {code} (invalid parameters): not restarted, "
                                f"it would fail the same way; the others keep running")
                    continue
                if not p.spec.critical and len(recent) >= policy.limit:
                    p.given_up = True
                    self._drop_standby(p)
                    self._event(f"process {p.spec.name} exited with code {code}; {len(recent)} restarts within "
                                f"{policy.window:g} s: left down (not critical, the stack keeps running without it)")
                    continue
                delay = policy.backoff(len(recent))
                p.restart_at = now + delay
                self._event(f"process {p.spec.name} exited with code {code}; restarting it in {delay:.1f} s "
                            f"(restart {len(recent) + 1} within {policy.window:g} s), the others keep running")
            if p.restart_at is not None and now >= p.restart_at:
                p.child.reader.join(timeout=1.0)  # the old output is flushed before the new process writes
                p.child = self._promote(p) or self._spawn(p.spec, p.index)
                p.restart_at = None
                p.restarts.append(now)
                self._plan_standby(p, now)

    def _check_standby(self, p: RunningProcess, now: float) -> None:
        """Notice a standby that exited on its own; start the one that is due."""
        if p.standby is not None and p.standby.popen.poll() is not None:
            self._event(f"the standby of {p.spec.name} exited with code {p.standby.popen.returncode}; its next "
                        f"restart starts a fresh process")
            p.standby = None  # not replaced before that restart: a standby that cannot start must not loop
        if p.standby is None and p.standby_due is not None and now >= p.standby_due and p.popen.poll() is None:
            p.standby, p.standby_due = self._spawn(p.spec, p.index, standby=True), None

    def _promote(self, p: RunningProcess) -> Child | None:
        """The standby of ``p``, told to take over (None: no live standby to promote)."""
        standby, p.standby = p.standby, None
        if standby is None or standby.popen.poll() is not None:
            return None
        standby.label[0] = p.spec.name  # before it is told: its first line as the process is labelled so
        try:
            standby.popen.stdin.write("take over\n")
            standby.popen.stdin.flush()
        except OSError:  # it died just now
            return None
        self._event(f"process {p.spec.name}: its standby (pid {standby.popen.pid}) takes over")
        return standby

    def _drop_standby(self, p: RunningProcess) -> None:
        p.standby_due = None
        if p.standby is not None:
            _kill_group(p.standby.popen)
            p.standby.popen.wait()
            p.standby = None

    def _kill_group(self, p: RunningProcess) -> None:
        _kill_group(p.popen)

    def stop(self, timeout: float = 10.0) -> dict[str, int]:
        """Stop watching, SIGINT every process group, escalate to SIGTERM / SIGKILL; the exit codes by name."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        for p in self.processes:  # a waiting standby has nothing to shut down cleanly
            self._drop_standby(p)
        for sig, grace in ((signal.SIGINT, timeout), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            alive = [p for p in self.processes if p.popen.poll() is None]
            for p in self.processes:
                p.expected_exit = True
            if not alive:
                break
            if sig is signal.SIGTERM:
                self._show_stacks(alive, timeout)
            for p in alive:
                try:
                    os.killpg(p.popen.pid, sig)
                except ProcessLookupError:
                    pass
            if sig is not signal.SIGINT:
                self.log(f"sent {sig.name} to {', '.join(p.spec.name for p in alive)}")
            sent = time.monotonic()
            took: dict[str, float] = {}
            while len(took) < len(alive) and time.monotonic() < sent + grace:
                for p in alive:
                    if p.spec.name not in took and p.popen.poll() is not None:
                        took[p.spec.name] = time.monotonic() - sent
                time.sleep(0.02)
            if took:
                self.log(f"stopped on {sig.name} after: "
                         f"{', '.join(f'{name} {t:.1f} s' for name, t in sorted(took.items(), key=lambda x: x[1]))}")
        # Children of a process (e.g. model workers) share its group: make sure none survive.
        for p in self.processes:
            self._kill_group(p)
            p.child.reader.join(timeout=2.0)
        return {p.spec.name: p.popen.returncode for p in self.processes}

    def _show_stacks(self, alive: list[RunningProcess], timeout: float) -> None:
        """Have the processes that outlived SIGINT print their threads' stacks (SIGUSR1: luna_nodes.base.run
        registers faulthandler for it) into their output, so a stop that needs SIGTERM says where it hung."""
        self.log(f"{', '.join(p.spec.name for p in alive)}: still running {timeout:.1f} s after SIGINT; "
                 f"their threads' stacks follow")
        for p in alive:
            try:
                os.kill(p.popen.pid, signal.SIGUSR1)  # the process itself: its children may not handle SIGUSR1
            except ProcessLookupError:
                pass
        time.sleep(1.0)  # for the stacks to reach the output before SIGTERM

    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def nice_session(pid: int, nice: int) -> str | None:
    """Give the session of ``pid`` (a process ``luna up`` started in its own session) the niceness ``nice``;
    what went wrong, or None.

    With the kernel's autogroups (``/proc/sys/kernel/sched_autogroup_enabled``) every session shares the CPU
    as one group, and a process's own nice weighs only against the other processes of its session: a
    process alone in its session at ``nice -n 10`` still gets as much CPU as the planner's. The autogroup's
    own nice (``/proc/<pid>/autogroup``, sched(7)) is what weighs against the other sessions. Setting it to
    0..19 needs no privileges, but without CAP_SYS_ADMIN the kernel takes one such write per 0.1 s,
    machine-wide (EAGAIN), so two niced processes started together would leave the second un-niced: the
    write is retried. Without autogroups there is no such file, and ``nice -n`` alone does the job.
    """
    path = Path(f"/proc/{pid}/autogroup")
    if not path.exists():
        return None
    problem = None
    for _ in range(3):
        try:
            path.write_text(str(nice))
            return None
        except OSError as exc:
            problem = f"cannot set the nice of its autogroup ({exc})"
            if exc.errno != errno.EAGAIN:
                break
            time.sleep(AUTOGROUP_WRITE_INTERVAL)
    return problem


def _kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL the process group of ``popen`` (its session: the process and its children)."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_until_stopped(supervisor: Supervisor, should_stop: Callable[[], bool], poll: float = 0.2) -> int:
    """Supervise until ``should_stop()`` (the explicit stop: Ctrl-C, SIGTERM), or until every process is
    left down (nothing is left to supervise); the exit code for ``luna up``: 0 after a clean stop, 1 if a
    process was left down or did not stop cleanly."""
    supervisor.start()
    try:
        while not should_stop():
            if supervisor.processes and all(p.given_up for p in supervisor.processes):
                supervisor.log("every process is left down: nothing left to supervise")
                break
            time.sleep(poll)
    finally:
        codes = supervisor.stop()
    code = 0
    unclean = {n: c for n, c in codes.items() if c not in (0, -signal.SIGINT)}
    given_up = [p.spec.name for p in supervisor.processes if p.given_up]
    restarts = {p.spec.name: len(p.restarts) for p in supervisor.processes if p.restarts}
    if restarts:
        supervisor.log(f"restarts while running: {restarts}")
    if given_up:
        supervisor.log(f"left down after the restart limit: {', '.join(given_up)}")
        code = 1
    elif unclean:
        supervisor.log(f"unclean shutdown: {unclean}")
        code = 1
    supervisor.log("stopped" if code == 0 else f"exiting with code {code}")
    return code
