"""Start the topology's processes, stream their logs with node names, stop them cleanly.

The pip-only counterpart of ``ros2 launch``: each process runs in its own session (process group) so
a stop reaches its children too; stopping sends SIGINT (rclpy shuts down cleanly), then SIGTERM and
SIGKILL to stragglers. If a process dies on its own, the supervisor reports it and stops the rest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from luna_bringup.topology import ProcessSpec, Topology, config_dir, executable_path

_COLORS = [36, 33, 35, 32, 34, 31, 96, 93]


def stack_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for stack processes: unbuffered output and the fast-discovery DDS profile."""
    env = dict(os.environ if base is None else base)
    env.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(config_dir() / "fastdds_fast_discovery.xml"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class RunningProcess:
    spec: ProcessSpec
    popen: subprocess.Popen
    reader: threading.Thread
    expected_exit: bool = False


@dataclass
class Supervisor:
    topology: Topology
    params_dir: Path = field(default_factory=config_dir)
    use_sim_time: bool = False
    env: dict[str, str] | None = None
    out: TextIO = sys.stdout
    color: bool = False
    extra_ros_args: list[str] = field(default_factory=list)
    processes: list[RunningProcess] = field(default_factory=list)
    _print_lock: threading.Lock = field(default_factory=threading.Lock)

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

    def start(self) -> None:
        env = stack_environment(self.env)
        for i, spec in enumerate(self.topology.processes):
            cmd = self.command(spec)
            popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, start_new_session=True)
            reader = threading.Thread(target=self._pump, args=(spec.name, popen, i), daemon=True)
            reader.start()
            self.processes.append(RunningProcess(spec, popen, reader))
            self.log(f"started {spec.name} (pid {popen.pid}): {' '.join(cmd)}")

    def _pump(self, name: str, popen: subprocess.Popen, index: int) -> None:
        for line in popen.stdout:
            self._emit(name, line, index)

    def dead(self) -> list[RunningProcess]:
        """Processes that exited although nobody asked them to."""
        return [p for p in self.processes if p.popen.poll() is not None and not p.expected_exit]

    def stop(self, timeout: float = 10.0) -> dict[str, int]:
        """SIGINT every process group, escalate to SIGTERM / SIGKILL; the exit codes by name."""
        for sig, grace in ((signal.SIGINT, timeout), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            alive = [p for p in self.processes if p.popen.poll() is None]
            if not alive:
                break
            for p in alive:
                p.expected_exit = True
                try:
                    os.killpg(p.popen.pid, sig)
                except ProcessLookupError:
                    pass
            if sig is not signal.SIGINT:
                self.log(f"sent {sig.name} to {', '.join(p.spec.name for p in alive)}")
            deadline = time.monotonic() + grace
            for p in alive:
                try:
                    p.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        # Children of a process (e.g. model workers) share its group: make sure none survive.
        for p in self.processes:
            try:
                os.killpg(p.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.reader.join(timeout=2.0)
        return {p.spec.name: p.popen.returncode for p in self.processes}

    def __enter__(self) -> "Supervisor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_until_stopped(supervisor: Supervisor, should_stop: Callable[[], bool], poll: float = 0.2) -> int:
    """Supervise until ``should_stop()`` or a process dies; returns the exit code for ``luna up``."""
    supervisor.start()
    code = 0
    try:
        while not should_stop():
            dead = supervisor.dead()
            if dead:
                for p in dead:
                    supervisor.log(f"process {p.spec.name} exited with code {p.popen.returncode}; "
                                   f"stopping the stack")
                code = next((p.popen.returncode for p in dead if p.popen.returncode), 1)
                break
            time.sleep(poll)
    finally:
        codes = supervisor.stop()
    if code == 0:
        unclean = {n: c for n, c in codes.items() if c not in (0, -signal.SIGINT)}
        if unclean:
            supervisor.log(f"unclean shutdown: {unclean}")
            code = 1
    supervisor.log("stopped" if code == 0 else f"exiting with code {code}")
    return code
