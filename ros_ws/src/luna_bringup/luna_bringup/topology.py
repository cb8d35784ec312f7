"""The stack topology: one declarative description feeding both launchers.

``config/topology.yaml`` lists the processes of the stack; each runs one executable of a package and
holds one or more nodes (nodes in one process share memory, e.g. one language-model instance for
``decision_inference`` and ``explainer``). Every process reads ``config/common.param.yaml`` (what the
nodes share: T_d, gamma_p), then ``config/<node>.yaml`` of each of its nodes. From this file,
``launch/luna.launch.py`` builds launch_ros ``Node`` actions on full ROS installs and ``luna up``
starts the same processes on pip-only machines. Both restart a process that dies on its own
(``restart``: back-off, and a limit for the processes marked ``critical: false``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PACKAGE = "luna_bringup"
#: The parameter file every process reads before its nodes' own (T_d, gamma_p and what derives from them).
COMMON_PARAMS = "common.param.yaml"


class TopologyError(ValueError):
    """The topology file is malformed or names something that does not exist."""


def package_dir() -> Path:
    """The luna_bringup share directory (installed) or source directory (editable install)."""
    source = Path(__file__).resolve().parents[1]
    if (source / "config").is_dir():
        return source
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory(PACKAGE))
    except Exception as exc:  # noqa: BLE001 - any failure here means "not installed"
        raise TopologyError(f"cannot find the {PACKAGE} config directory ({exc})") from None


def config_dir() -> Path:
    return package_dir() / "config"


def fast_discovery_profile() -> Path:
    """The Fast DDS profile the stack's processes and the bag commands start with (fast discovery)."""
    return config_dir() / "fastdds_fast_discovery.xml"


@dataclass(frozen=True)
class RestartPolicy:
    """How a process that died on its own is started again.

    The n-th restart within ``window`` s waits ``delay * 2**(n-1)`` s (at most ``max_delay``). A
    critical process is restarted for as long as the stack runs (the vehicle needs it); a non-critical
    one is left down, and reported, after ``limit`` restarts within ``window`` (a crash loop of e.g. the
    reflection client must not cost the planner its CPU). A process that exits with one of
    ``permanent_exit_codes`` is left down at once, critical or not.
    """

    delay: float = 0.2  # s
    max_delay: float = 8.0  # s
    limit: int = 5
    window: float = 60.0  # s
    #: s after a process (re)started before its standby (``ProcessSpec.standby``) starts: the two would
    #: otherwise load the same models at once, on the cores the starting process needs.
    standby_delay: float = 10.0
    #: Exit codes that say restarting cannot help: a node's invalid parameters (luna_nodes.base.run: 2).
    permanent_exit_codes: tuple[int, ...] = (2,)

    def backoff(self, restarts_in_window: int) -> float:
        """Delay before the next restart, given the restarts already made inside the window."""
        return min(self.max_delay, self.delay * 2.0 ** restarts_in_window)


@dataclass
class ProcessSpec:
    name: str
    package: str
    executable: str
    nodes: list[str]
    remappings: list[tuple[str, str]] = field(default_factory=list)
    critical: bool = True  # False: reflection, explanations; given up after the restart limit
    # A warm standby (luna up): a second process that has loaded the models and waits, off the ROS graph,
    # to replace this one when it dies, so the restart does not pay the process's start.
    standby: bool = False
    #: CPU niceness added to the launcher's own, 0..19 (higher yields more): a process the vehicle does not
    #: drive on (reflection) is niced so that its cold start or a burst of its work yields the cores to the
    #: planner. Only raising is allowed: lowering needs privileges a vehicle's launcher grants, not this file.
    nice: int = 0

    def command_prefix(self) -> list[str]:
        """What both launchers put before the executable (``nice`` execs it: the pid stays the process's)."""
        return ["nice", "-n", str(self.nice)] if self.nice else []

    def params_files(self, params_dir: Path) -> list[Path]:
        """The parameter files of this process, in the order they are read: the shared one first
        (``COMMON_PARAMS``: T_d, gamma_p), then each node's own, which may override it."""
        return [params_dir / COMMON_PARAMS] + [params_dir / f"{node}.yaml" for node in self.nodes]


@dataclass
class Topology:
    processes: list[ProcessSpec]
    remappings: list[tuple[str, str]] = field(default_factory=list)
    source: Path | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)

    def select(self, names: list[str]) -> "Topology":
        """Only the named processes (or processes holding the named nodes)."""
        chosen = [p for p in self.processes if p.name in names or set(p.nodes) & set(names)]
        unknown = set(names) - {p.name for p in chosen} - {n for p in chosen for n in p.nodes}
        if unknown:
            raise TopologyError(f"unknown process or node name(s): {', '.join(sorted(unknown))}")
        return Topology(chosen, self.remappings, self.source, self.restart)

    def ros_arguments(self, process: ProcessSpec, params_dir: Path, use_sim_time: bool = False) -> list[str]:
        """The ``--ros-args`` part of the command line that starts ``process``."""
        args = ["--ros-args"]
        for f in process.params_files(params_dir):
            if f.exists():
                args += ["--params-file", str(f)]
        if use_sim_time:
            args += ["-p", "use_sim_time:=true"]
        for src, dst in self.remappings + process.remappings:
            args += ["-r", f"{src}:={dst}"]
        return args


def _pairs(raw, where: str) -> list[tuple[str, str]]:
    try:
        return [(str(a), str(b)) for a, b in (raw or [])]
    except (TypeError, ValueError):
        raise TopologyError(f"{where}: remappings must be a list of [from, to] pairs") from None


def _restart_policy(raw, where: str) -> RestartPolicy:
    if raw is None:
        return RestartPolicy()
    if not isinstance(raw, dict) or set(raw) - {"delay", "max_delay", "limit", "window", "standby_delay"}:
        raise TopologyError(f"{where}: restart must be a mapping of delay, max_delay, limit, window, standby_delay")
    policy = RestartPolicy(**raw)
    numbers = (policy.delay, policy.max_delay, policy.window, policy.standby_delay)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in numbers) \
            or not isinstance(policy.limit, int) or isinstance(policy.limit, bool) or policy.limit < 0:
        raise TopologyError(f"{where}: restart delays and window must be numbers >= 0 s and limit an integer "
                            f">= 0, got {raw}")
    return policy


def load_topology(path: str | Path | None = None) -> Topology:
    path = Path(path) if path else config_dir() / "topology.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TopologyError(f"{path}: no such topology file") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("processes"), list):
        raise TopologyError(f"{path}: expected a mapping with a 'processes' list")
    processes, seen_nodes = [], set()
    for i, p in enumerate(data["processes"]):
        where = f"{path}: process #{i}"
        if not isinstance(p, dict) or not p.get("name") or not p.get("executable"):
            raise TopologyError(f"{where}: needs 'name' and 'executable'")
        nodes = p.get("nodes") or [p["name"]]
        dup = seen_nodes & set(nodes)
        if dup:
            raise TopologyError(f"{where}: node(s) {sorted(dup)} appear in more than one process")
        seen_nodes |= set(nodes)
        flags = {key: p.get(key, default) for key, default in (("critical", True), ("standby", False))}
        for key, value in flags.items():
            if not isinstance(value, bool):
                raise TopologyError(f"{where}: {key} must be true or false, got {value!r}")
        nice = p.get("nice", 0)
        if not isinstance(nice, int) or isinstance(nice, bool) or not 0 <= nice <= 19:
            raise TopologyError(f"{where}: nice must be an integer from 0 to 19, got {nice!r}")
        processes.append(ProcessSpec(str(p["name"]), str(p.get("package", "luna_nodes")), str(p["executable"]),
                                     [str(n) for n in nodes], _pairs(p.get("remappings"), where), **flags,
                                     nice=nice))
    if len({p.name for p in processes}) != len(processes):
        raise TopologyError(f"{path}: process names must be unique")
    return Topology(processes, _pairs(data.get("remappings"), str(path)), path,
                    _restart_policy(data.get("restart"), str(path)))


def executable_path(process: ProcessSpec) -> str:
    """Where a pip (editable) install puts the executable: the venv's bin directory beside python."""
    import sys
    candidate = Path(sys.executable).parent / process.executable
    if candidate.exists() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise TopologyError(f"executable '{process.executable}' of process '{process.name}' is not installed "
                        f"(expected {candidate}; run the bootstrap)")
