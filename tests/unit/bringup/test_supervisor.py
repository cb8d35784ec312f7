"""The supervisor's restart policy on real processes (short Python scripts standing in for nodes): a
process that dies is restarted with back-off while the others keep running; a non-critical one is left
down after the limit, a critical one never; only an explicit stop ends the stack (issue 17)."""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from luna_bringup.supervisor import Supervisor, nice_session, run_until_stopped
from luna_bringup.topology import ProcessSpec, RestartPolicy, Topology, TopologyError, load_topology

CRASH = "import sys; print('up', flush=True); sys.exit(3)"
SERVE = "import time; print('up', flush=True); time.sleep(600)"


@dataclass
class ScriptSupervisor(Supervisor):
    """Runs a Python one-liner per process instead of a node executable."""

    scripts: dict[str, str] = field(default_factory=dict)

    def command(self, spec: ProcessSpec) -> list[str]:
        return [sys.executable, "-c", self.scripts[spec.name]]


def supervisor(scripts: dict[str, str], critical: dict[str, bool], policy: RestartPolicy,
               standby: tuple[str, ...] = (), nice: dict[str, int] | None = None) -> ScriptSupervisor:
    specs = [ProcessSpec(name, "none", name, [name], critical=critical.get(name, True), standby=name in standby,
                         nice=(nice or {}).get(name, 0)) for name in scripts]
    return ScriptSupervisor(Topology(specs, restart=policy), out=io.StringIO(), poll_period=0.02, scripts=scripts,
                            standby=bool(standby))


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_dying_non_critical_process_is_restarted_with_backoff_then_left_down_the_others_untouched():
    sup = supervisor({"planner": SERVE, "reflection_client": CRASH}, {"reflection_client": False},
                     RestartPolicy(delay=0.1, max_delay=0.4, limit=3, window=60.0))
    with sup:
        planner_pid = sup.processes[0].popen.pid
        reflection = sup.processes[1]
        wait_until(lambda: reflection.given_up)
        assert len(reflection.restarts) == 3
        # Each gap is the process's own run time plus the back-off (0.1 s, 0.2 s, 0.4 s): the run time
        # varies with the machine's load, so the gaps are checked against the delays, not each other.
        gaps = [b - a for a, b in zip(reflection.restarts, reflection.restarts[1:])]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4, f"the delay grows with each restart: {gaps}"
        assert sup.processes[0].popen.poll() is None and sup.processes[0].popen.pid == planner_pid
        assert sup.processes[0].restarts == []
    log = sup.out.getvalue()
    for k, delay in enumerate(("0.1", "0.2", "0.4"), start=1):
        assert f"process reflection_client exited with code 3; restarting it in {delay} s (restart {k} within 60 s), " \
               "the others keep running" in log
    assert "3 restarts within 60 s: left down (not critical, the stack keeps running without it)" in log


def test_a_critical_process_is_restarted_beyond_the_limit_with_the_delay_capped():
    sup = supervisor({"planner": CRASH}, {}, RestartPolicy(delay=0.05, max_delay=0.1, limit=1, window=60.0))
    with sup:
        wait_until(lambda: len(sup.processes[0].restarts) >= 4)
        assert not sup.processes[0].given_up
    assert "restarting it in 0.1 s (restart 4 within 60 s)" in sup.out.getvalue()


def test_restarts_outside_the_window_do_not_count():
    policy = RestartPolicy(delay=1.0, max_delay=8.0, limit=2, window=60.0)
    assert [policy.backoff(n) for n in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    sup = supervisor({"reflection_client": CRASH}, {"reflection_client": False}, policy)
    sup.poll_period = 3600.0  # the watcher stays idle: check() is driven by hand, with made-up times
    with sup:
        p = sup.processes[0]
        p.popen.wait()
        p.restarts = [0.0, 1.0]  # two restarts, long ago: the limit of 2 is not reached
        sup.check(now=100.0)
        assert not p.given_up and p.restart_at == pytest.approx(101.0)
        p.restarts = [50.0, 60.0]
        p.restart_at = None
        sup.check(now=100.0)
        assert p.given_up


def test_only_an_explicit_stop_ends_the_stack_and_a_process_left_down_sets_the_exit_code():
    sup = supervisor({"planner": SERVE, "reflection_client": CRASH}, {"reflection_client": False},
                     RestartPolicy(delay=0.05, max_delay=0.05, limit=2, window=60.0))
    started = time.monotonic()
    code = run_until_stopped(sup, lambda: sup.processes and sup.processes[1].given_up
                             and time.monotonic() - started > 1.0, poll=0.05)
    assert code == 1
    log = sup.out.getvalue()
    assert "left down after the restart limit: reflection_client" in log
    assert "restarts while running: {'reflection_client': 2}" in log
    assert all(p.popen.poll() is not None for p in sup.processes), "stop leaves nothing running"


def test_restart_policy_and_criticality_are_read_from_the_topology(tmp_path):
    topology = load_topology()
    assert {p.name: p.critical for p in topology.processes}["reflection_client"] is False
    assert {p.name: p.critical for p in topology.processes}["planner"] is True
    assert topology.restart == RestartPolicy(delay=0.2, max_delay=8.0, limit=5, window=60.0, standby_delay=10.0)
    assert {p.name for p in topology.processes if p.standby} == {"planner", "decision"}
    assert topology.select(["planner"]).restart == topology.restart
    bad = tmp_path / "bad.yaml"
    bad.write_text("processes: [{name: a, executable: a}]\nrestart: {delay: -1}\n")
    with pytest.raises(TopologyError, match="restart delays and window must be numbers >= 0"):
        load_topology(bad)
    bad.write_text("processes: [{name: a, executable: a, critical: maybe}]\n")
    with pytest.raises(TopologyError, match="critical must be true or false"):
        load_topology(bad)
    bad.write_text("processes: [{name: a, executable: a, standby: 1}]\n")
    with pytest.raises(TopologyError, match="standby must be true or false"):
        load_topology(bad)
    assert {p.name: p.nice for p in topology.processes} == {"map_server": 0, "scene_descriptor": 0,
                                                            "progress_monitor": 0, "planner": 0, "decision": 0,
                                                            "reflection_client": 10}
    for nice in ("-5", "20", "high"):  # below 0 needs privileges; 19 is the kernel's highest
        bad.write_text(f"processes: [{{name: a, executable: a, nice: {nice}}}]\n")
        with pytest.raises(TopologyError, match=r"process #0: nice must be an integer from 0 to 19"):
            load_topology(bad)


def test_a_niced_process_runs_and_restarts_at_its_niceness_and_the_others_at_the_supervisors():
    # `nice -n 10` adds to the launcher's own niceness (the kernel's ceiling is 19).
    sup = supervisor({"planner": SERVE, "reflection_client": SERVE}, {}, RestartPolicy(delay=0.05),
                     nice={"reflection_client": 10})
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with sup:
        wait_until(lambda: sup.out.getvalue().count("] up") == 2)  # both executed their command
        planner, reflection = sup.processes
        first = reflection.popen.pid
        assert os.getpriority(os.PRIO_PROCESS, first) == min(19, own + 10)
        assert os.getpriority(os.PRIO_PROCESS, planner.popen.pid) == own
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: sup.out.getvalue().count("] up") == 3)
        assert reflection.popen.pid != first
        assert os.getpriority(os.PRIO_PROCESS, reflection.popen.pid) == min(19, own + 10), "its restart too"
        # With autogroups, each process's session (luna up starts each in its own) is niced too: a process's
        # own nice would weigh only inside its session.
        if Path("/proc/self/autogroup").exists():
            assert Path(f"/proc/{reflection.popen.pid}/autogroup").read_text().split()[-1] == "10"
            assert Path(f"/proc/{planner.popen.pid}/autogroup").read_text().split()[-1] == "0"
        else:
            print("no /proc/self/autogroup (kernel without autogroups): only the process's nice was checked")


def test_a_process_with_invalid_parameters_is_not_restarted_and_an_empty_stack_ends():
    # Exit code 2 is a node's "invalid parameter" (luna_nodes.base.run): a restart would fail the same way.
    sup = supervisor({"map_server": "import sys; sys.exit(2)"}, {}, RestartPolicy(delay=0.05, limit=5))
    code = run_until_stopped(sup, lambda: False, poll=0.05)
    assert code == 1
    assert sup.processes[0].restarts == [] and sup.processes[0].given_up
    log = sup.out.getvalue()
    assert "process map_server exited with code 2 (invalid parameters): not restarted" in log
    assert "every process is left down: nothing left to supervise" in log


# A process as luna_nodes.base.run behaves: as a standby it "loads", says so and waits for a line on stdin.
NODE = """
import os, sys, time
if os.environ.pop("LUNA_STANDBY", "") == "1":
    print("loaded, waiting", flush=True)
    if not sys.stdin.readline():
        sys.exit(0)
    print("promoted", flush=True)
print("serving", os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_dead_process_is_replaced_by_its_warm_standby_and_a_new_standby_follows():
    sup = supervisor({"planner": NODE, "map_server": SERVE}, {}, RestartPolicy(delay=0.05, standby_delay=0.3),
                     standby=("planner",))
    with sup:
        planner, map_server = sup.processes
        assert map_server.standby is None and map_server.standby_due is None, "only processes marked standby"
        # The standby's own line (the log also echoes the script, which contains the words).
        wait_until(lambda: planner.standby is not None and "[planner standby] loaded, waiting" in sup.out.getvalue())
        standby_pid, primary_pid = planner.standby.popen.pid, planner.popen.pid
        planner.popen.kill()
        wait_until(lambda: planner.restarts)
        assert planner.popen.pid == standby_pid, "the restart promoted the standby instead of starting a process"
        wait_until(lambda: f"[planner] serving {standby_pid}" in sup.out.getvalue())
        wait_until(lambda: planner.standby is not None)  # the next one, standby_delay later
        assert planner.standby.popen.pid not in (standby_pid, primary_pid)
        assert map_server.restarts == []
        second = planner.standby.popen
    log = sup.out.getvalue()
    assert f"process planner: its standby (pid {standby_pid}) takes over" in log
    assert "[planner standby] loaded, waiting" in log and "[planner] promoted" in log
    assert second.poll() is not None and all(p.popen.poll() is not None for p in sup.processes), \
        "stop leaves no standby running"


def test_a_standby_that_dies_is_reported_and_the_restart_starts_a_fresh_process():
    crashing_standby = NODE.replace('print("loaded, waiting", flush=True)', "sys.exit(5)")
    sup = supervisor({"planner": crashing_standby}, {}, RestartPolicy(delay=0.05, standby_delay=0.1),
                     standby=("planner",))
    with sup:
        planner = sup.processes[0]
        wait_until(lambda: "the standby of planner exited with code 5" in sup.out.getvalue())
        time.sleep(0.3)
        assert planner.standby is None, "a standby that cannot start is not started again in a loop"
        primary = planner.popen.pid
        planner.popen.kill()
        wait_until(lambda: planner.restarts)
        assert planner.popen.pid != primary
        wait_until(lambda: "[planner] serving" in sup.out.getvalue().split("restarting it")[-1])
    assert "its standby" not in sup.out.getvalue().replace("the standby of planner exited", "")


def test_nice_session_retries_the_kernels_rate_limit_with_a_faked_eagain(monkeypatch):
    # Faked: root (as the tests run) is exempt from the kernel's one autogroup write per 0.1 s, so the
    # EAGAIN an unprivileged `luna up` meets when two niced processes start together is raised here.
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no /proc/self/autogroup (kernel without autogroups): nothing to rate-limit")
    writes: list[str] = []

    failures = [errno.EAGAIN]  # the errors the next writes raise, in order

    def write_text(self, text, *args, **kwargs):
        writes.append(text)
        if failures:
            code = failures.pop(0)
            raise OSError(code, os.strerror(code))
        return len(text)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert nice_session(os.getpid(), 10) is None and writes == ["10", "10"]
    writes.clear()
    failures[:] = [errno.EACCES, errno.EACCES]
    assert "Permission denied" in nice_session(os.getpid(), 10)
    assert writes == ["10"], "an error other than the rate limit is reported at once, not retried"


def test_a_process_that_outlives_sigint_prints_its_threads_stacks_before_sigterm():
    # Stands in for a node whose shutdown hangs: it ignores SIGINT and prints its stacks on SIGUSR1, as
    # luna_nodes.base.run registers faulthandler.
    stuck = ("import faulthandler, signal, sys, time; faulthandler.register(signal.SIGUSR1, all_threads=True); "
             "signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True)\n"
             "def hung_shutdown():\n    time.sleep(600)\nhung_shutdown()")
    sup = supervisor({"planner": stuck, "map_server": SERVE}, {}, RestartPolicy())
    with sup:
        wait_until(lambda: sup.out.getvalue().count("] up") == 2)
    codes = {p.spec.name: p.popen.returncode for p in sup.processes}
    log = sup.out.getvalue()
    assert codes == {"planner": -signal.SIGTERM, "map_server": -signal.SIGINT}, (codes, log)
    assert "planner: still running 10.0 s after SIGINT; their threads' stacks follow" in log, log
    assert "in hung_shutdown" in log and "sent SIGTERM to planner" in log, log
    assert log.index("in hung_shutdown") < log.index("sent SIGTERM to planner"), "the stacks come before SIGTERM"
    # How long each process took to stop, per signal.
    assert re.search(r"stopped on SIGINT after: map_server \d+\.\d s\n", log), log
    assert re.search(r"stopped on SIGTERM after: planner \d+\.\d s\n", log), log
