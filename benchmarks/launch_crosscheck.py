"""Cross-check ``ros2 launch luna_bringup luna.launch.py`` against ``luna up`` without starting a process.

Both launchers are built from ``config/topology.yaml``; this script checks that they turn it into the
same processes. The launch side is evaluated with the real launch / launch_ros machinery (the launch
file is loaded with ``get_launch_description_from_python_launch_file``, its entities are visited in a
``LaunchContext`` as ``ros2 launch`` would, and every launch_ros ``Node`` is expanded exactly as
``Node.execute`` does up to the point where the process would be spawned: its substitutions, its
parameter dictionaries written to launch's temporary files, its command line and environment). The
``luna up`` side is the command line ``luna_bringup.supervisor.Supervisor.command`` builds and the
environment ``stack_environment`` gives each process. Both command lines are read by one parser
(``--params-file``, ``-p``, ``-r`` with ``__node`` / ``__ns``), so a difference in how either side spells
an argument cannot hide or fake a difference.

Compared per process, for several launch-argument cases (defaults, simulation time, ``only``, a
topology file with remappings and a parameter directory of its own): the log name, package,
executable, node name and namespace overrides, parameter sources in order (files, and single values),
remappings, the environment variables the launcher adds, and the restart policy (the launch file maps
the topology's back-off to launch's ``respawn_delay`` = first back-off step and ``respawn_max_retries``
= unlimited for critical processes, ``limit`` for the others: launch can do neither back-off nor a
window).

Needs launch and launch_ros (a ROS 2 install, or see docs/launch.md for a throwaway install beside the
project venv); ``--help`` and the comparison functions work without them.

Prints Markdown tables (copied into docs/launch.md), then the verdict as the exit status: 0 when every
process agrees in every case, 1 with each difference listed, 2 on a usage error or when launch_ros
cannot be imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LAUNCH_FILE = REPO / "ros_ws/src/luna_bringup/launch/luna.launch.py"
EXIT_SAME, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
INSTALL_HINT = ("launch_ros is not importable: source a ROS 2 kilted install (/opt/ros/kilted/setup.bash), "
                "or install launch and launch_ros beside the project venv as docs/launch.md shows "
                "(PYTHONPATH=/tmp/launchenv/site:/tmp/launchenv/prefix/lib/python3.11/site-packages)")
#: Variables the launchers may set; removed from the environment the comparison starts from, so that
#: what each launcher adds is seen even where the caller's shell already sets them.
STACK_ENV_VARS = ("FASTDDS_DEFAULT_PROFILES_FILE", "PYTHONUNBUFFERED")


@dataclass(frozen=True)
class Param:
    """One parameter source on a node's command line, in order: a file, or one value."""

    file: str | None = None  # absolute path of a --params-file (not one launch wrote from a dict)
    name: str | None = None  # a single value: -p name:=value, or an entry of a launch dict file
    value: Any = None

    def __str__(self) -> str:
        if self.file is not None:
            return _short_path(self.file)
        return f"{self.name}={self.value!r}"


@dataclass(frozen=True)
class ProcessLaunch:
    """What one launcher starts for one process, in a form both launchers can be reduced to."""

    label: str  # log name: luna up's [name] prefix; launch's exec_name (else the executable's name)
    prefix: tuple[str, ...]  # what runs the executable (`nice -n 10`): luna up's command, launch's prefix
    package: str
    executable: str
    node_name: str | None  # a __node remapping (None: the nodes keep their own names)
    namespace: str | None  # a __ns remapping (None: the default namespace)
    parameters: tuple[Param, ...]
    remappings: tuple[tuple[str, str], ...]
    other_arguments: tuple[str, ...]  # anything else on the command line
    environment: tuple[tuple[str, str], ...]  # variables the launcher adds or changes, sorted
    restart: str  # respawn, its delay and retries, as the launch file promises for this process
    resolved: str = ""  # where the executable was found (information, not compared)


@dataclass(frozen=True)
class Difference:
    case: str
    process: str
    what: str
    luna: str
    launch: str


@dataclass(frozen=True)
class Case:
    """One way of starting the stack, spelt for each launcher."""

    name: str
    launch_arguments: dict[str, str] = field(default_factory=dict)  # ros2 launch ... key:=value
    topology: Path | None = None  # luna up --topology
    params_dir: Path | None = None  # luna up --params-dir
    only: str = ""  # luna up --only
    sim_time: bool = False  # luna up --sim-time

    def luna_command(self) -> str:
        parts = ["luna up"]
        if self.topology:
            parts.append(f"--topology {_short_path(str(self.topology))}")
        if self.params_dir:
            parts.append(f"--params-dir {_short_path(str(self.params_dir))}")
        if self.only:
            parts.append(f"--only {self.only}")
        if self.sim_time:
            parts.append("--sim-time")
        return " ".join(parts)

    def launch_command(self) -> str:
        args = " ".join(f"{k}:={_short_path(v)}" for k, v in self.launch_arguments.items())
        return f"ros2 launch luna_bringup luna.launch.py {args}".rstrip()


_TEMP_ROOTS: list[str] = []  # shown as $TMP in tables, so that the printed output is reproducible


def _short_path(text: str) -> str:
    for root in _TEMP_ROOTS:
        text = text.replace(root, "$TMP")
    return text.replace(str(REPO) + "/", "")


# --- one parser for both command lines --------------------------------------------------------------

def _is_launch_dict_file(path: str) -> bool:
    """launch_ros writes each parameter dict to a NamedTemporaryFile prefixed ``launch_params_``."""
    return Path(path).name.startswith("launch_params_") and Path(path).parent == Path(tempfile.gettempdir())


def _flatten(prefix: str, values: dict) -> list[tuple[str, Any]]:
    out = []
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out += _flatten(name, value) if isinstance(value, dict) else [(name, value)]
    return out


def _dict_file_params(path: str) -> list[Param]:
    """The single values of a launch dict file ({'/**' or node: {'ros__parameters': {...}}})."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    params = []
    for node, body in data.items():
        for name, value in _flatten("", (body or {}).get("ros__parameters", {})):
            # A dict for one fully named node is not the same as -p (which reaches every node).
            params.append(Param(name=name if node == "/**" else f"{node}:{name}", value=value))
    return params


def parse_ros_argv(argv: Iterable[str]) -> dict[str, Any]:
    """Split a node's command line (without the executable) into the fields of ``ProcessLaunch``."""
    out: dict[str, Any] = {"node_name": None, "namespace": None, "parameters": [], "remappings": [],
                           "other_arguments": []}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--ros-args" or token == "--":
            i += 1
            continue
        if token in ("--params-file", "-p", "-r", "--remap", "--param") and i + 1 < len(tokens):
            value = tokens[i + 1]
            i += 2
            if token == "--params-file":
                if _is_launch_dict_file(value):
                    out["parameters"] += _dict_file_params(value)
                else:
                    out["parameters"].append(Param(file=os.path.abspath(value)))
                continue
            name, sep, rhs = value.partition(":=")
            if not sep:
                out["other_arguments"] += [token, value]
            elif token in ("-p", "--param"):
                out["parameters"].append(Param(name=name, value=yaml.safe_load(rhs)))
            elif name == "__node":
                out["node_name"] = rhs
            elif name == "__ns":
                out["namespace"] = rhs
            else:
                out["remappings"].append((name, rhs))
            continue
        out["other_arguments"].append(token)
        i += 1
    return {k: tuple(v) if isinstance(v, list) else v for k, v in out.items()}


def _restart(respawn: bool, delay: float | None, max_retries: int) -> str:
    if not respawn:
        return "not restarted"
    times = "without limit" if max_retries < 0 else f"at most {max_retries} times"
    return f"restarted after {delay if delay is not None else 0:g} s, {times}"


def _env_delta(final: dict[str, str], base: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in final.items() if base.get(k) != v))


def base_environment() -> dict[str, str]:
    env = dict(os.environ)
    for name in STACK_ENV_VARS:
        env.pop(name, None)
    return env


# --- the luna up side -------------------------------------------------------------------------------

def luna_side(case: Case, base_env: dict[str, str]) -> list[ProcessLaunch]:
    """What ``luna up`` starts: ``Supervisor.command`` and ``stack_environment``, per process."""
    from luna_bringup.supervisor import Supervisor, stack_environment
    from luna_bringup.topology import TopologyError, config_dir, load_topology

    topology = load_topology(case.topology)
    if case.only:
        topology = topology.select([n.strip() for n in case.only.split(",") if n.strip()])
    supervisor = Supervisor(topology, case.params_dir or config_dir(), case.sim_time)
    env = _env_delta(stack_environment(dict(base_env)), base_env)
    r = topology.restart
    out = []
    for p in topology.processes:
        try:
            argv = supervisor.command(p)
            resolved = argv[0]
        except TopologyError as exc:  # executable not installed here: the arguments are still known
            argv = [p.executable, *topology.ros_arguments(p, supervisor.params_dir, case.sim_time)]
            resolved = f"not installed ({exc})"
        out.append(ProcessLaunch(label=p.name, prefix=tuple(p.command_prefix()), package=p.package, executable=p.executable,
                                 **parse_ros_argv(argv[1:]), environment=env,
                                 restart=_restart(True, r.delay, -1 if p.critical else r.limit),
                                 resolved=resolved))
    return out


# --- the launch side --------------------------------------------------------------------------------

def launch_available() -> bool:
    try:
        import launch  # noqa: F401
        import launch_ros  # noqa: F401
    except ImportError:
        return False
    return True


def _dry_node(node, context, base_env: dict[str, str]) -> ProcessLaunch:
    """``launch_ros.actions.Node.execute`` up to (not including) ``ExecuteProcess.execute``.

    Uses launch_ros's own ``_perform_substitutions`` and extension hooks (name-mangled members of
    launch 3.7 / launch_ros 0.28; checked against their source), so the command line is the one the
    process would get.
    """
    from launch.utilities import normalize_to_list_of_substitutions, perform_substitutions
    from launch.utilities.type_utils import perform_typed_substitution

    node._perform_substitutions(context)
    ros_specific: dict[str, Any] = {}
    if getattr(node, "_Node__node_name") is not None:
        ros_specific["name"] = f"__node:={getattr(node, '_Node__expanded_node_name')}"
    if node.expanded_node_namespace != "":
        ros_specific["ns"] = f"__ns:={node.expanded_node_namespace}"
    for extension in getattr(node, "_Node__extensions").values():
        cmd_extension, ros_specific = extension.prepare_for_execute(context, ros_specific, node)
        node.cmd.extend(cmd_extension)
    context.extend_locals({"ros_specific_arguments": ros_specific})
    argv = [perform_substitutions(context, part) for part in node.cmd[1:]]
    try:  # launch_ros.substitutions.ExecutableInPackage: needs the package in the ament index
        resolved = perform_substitutions(context, node.cmd[0])
    except Exception as exc:  # noqa: BLE001 - reported, not fatal: pip-only machines have no index
        resolved = f"not resolved here ({type(exc).__name__}: {exc})"

    description = node.process_description
    env = {} if description.env is not None else dict(context.environment)
    for key, value in list(description.env or []) + list(description.additional_env or []):
        env[perform_substitutions(context, key)] = perform_substitutions(context, value)
    def text(value) -> str:  # the constructor's raw argument: a string or substitutions
        return perform_substitutions(context, normalize_to_list_of_substitutions(value))

    package = text(node.node_package) if node.node_package is not None else ""
    executable = text(node.node_executable)
    label = perform_substitutions(context, description.name) if description.name else executable
    respawn = perform_typed_substitution(context, getattr(node, "_ExecuteLocal__respawn"), bool)
    restart = _restart(respawn, getattr(node, "_ExecuteLocal__respawn_delay"),
                       getattr(node, "_ExecuteLocal__respawn_max_retries"))
    # Executable.prepare: shlex.split of the substituted prefix ('' unless given or a launch-prefix is set)
    prefix = tuple(shlex.split(perform_substitutions(context, description.prefix)))
    return ProcessLaunch(label=label, prefix=prefix, package=package, executable=executable, **parse_ros_argv(argv),
                         environment=_env_delta(env, base_env), restart=restart, resolved=resolved)


def launch_side(launch_file: Path, case: Case, base_env: dict[str, str]) -> list[ProcessLaunch]:
    """What ``ros2 launch`` would start: the launch description visited without spawning processes."""
    from launch import LaunchContext
    from launch.actions import ExecuteLocal
    from launch.launch_description_sources import get_launch_description_from_python_launch_file
    from launch_ros.actions import Node

    saved = dict(os.environ)
    os.environ.clear()  # launch's context.environment *is* os.environ: SetEnvironmentVariable writes it
    os.environ.update(base_env)
    tmp_before = set(Path(tempfile.gettempdir()).glob("launch_params_*"))
    try:
        description = get_launch_description_from_python_launch_file(str(launch_file))
        context = LaunchContext(argv=[f"{k}:={v}" for k, v in case.launch_arguments.items()])
        # What `ros2 launch pkg file k:=v` does before including the file: one launch configuration each.
        context.launch_configurations.update(case.launch_arguments)
        processes: list[ProcessLaunch] = []

        def visit(entity) -> None:
            if isinstance(entity, Node):
                processes.append(_dry_node(entity, context, base_env))
                return
            if isinstance(entity, ExecuteLocal):  # a plain process: luna up has nothing like it
                raise SystemExit(f"{launch_file}: starts a process that is not a launch_ros Node: {entity.describe()}")
            for sub in entity.visit(context) or []:
                visit(sub)

        visit(description)
        return processes
    finally:
        # launch leaves its parameter dict files behind (delete=False); these were read already
        for path in set(Path(tempfile.gettempdir()).glob("launch_params_*")) - tmp_before:
            path.unlink(missing_ok=True)
        os.environ.clear()
        os.environ.update(saved)


# --- comparison and report --------------------------------------------------------------------------

COMPARED = ("label", "prefix", "package", "executable", "node_name", "namespace", "parameters", "remappings",
            "other_arguments", "environment", "restart")


def _show(value: Any, sep: str = ":=") -> str:
    """A field for a table cell: pairs as a<sep>b (":=" remappings, "=" environment)."""
    if value is None or value == ():
        return "-"
    if isinstance(value, tuple):
        if value and isinstance(value[0], tuple):
            return ", ".join(f"{a}{sep}{_short_path(b)}" for a, b in value)
        return ", ".join(str(v) for v in value)
    return _short_path(str(value))


def compare(case: str, luna: list[ProcessLaunch], launch: list[ProcessLaunch]) -> list[Difference]:
    """Every field that differs, process by process in topology order; a missing process is one too."""
    diffs = []
    for i in range(max(len(luna), len(launch))):
        ours = luna[i] if i < len(luna) else None
        theirs = launch[i] if i < len(launch) else None
        process = (ours or theirs).label
        if ours is None or theirs is None:
            diffs.append(Difference(case, process, "process", ours.label if ours else "(none)",
                                    theirs.label if theirs else "(none)"))
            continue
        for name in COMPARED:
            a, b = getattr(ours, name), getattr(theirs, name)
            if a != b:
                sep = "=" if name == "environment" else ":="
                diffs.append(Difference(case, process, name, _show(a, sep), _show(b, sep)))
    return diffs


def exit_status(diffs: list[Difference]) -> int:
    return EXIT_DIFFERENT if diffs else EXIT_SAME


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def case_table(case: Case, luna: list[ProcessLaunch], diffs: list[Difference]) -> list[str]:
    """One row per process (the luna up values), with the fields launch gives differently."""
    by_process: dict[str, list[str]] = {}
    for d in diffs:
        by_process.setdefault(d.process, []).append(d.what)
    lines = [f"#### {case.name}", "", f"`{case.luna_command()}` against `{case.launch_command()}`", "",
             "| process | package / executable (run by) | parameters | remappings | restart | launch differs in |",
             "|---|---|---|---|---|---|"]
    for p in luna:
        differs = ", ".join(by_process.get(p.label, [])) or "nothing"
        run_by = f" ({' '.join(p.prefix)})" if p.prefix else ""
        lines.append(f"| {p.label} | {p.package} / {p.executable}{run_by} | {_cell(_show(p.parameters))} | "
                     f"{_cell(_show(p.remappings))} | {p.restart} | {differs} |")
    extra = [d for d in diffs if d.process not in {p.label for p in luna}]
    lines += [f"| {d.process} | (launch only) | | | | process |" for d in extra]
    env = luna[0].environment if luna else ()
    lines += ["", f"Environment both add: {_show(env, '=')}." if not any(d.what == "environment" for d in diffs)
              else f"Environment luna up adds: {_show(env, '=')}.", ""]
    return lines


def default_cases(scratch: Path) -> list[Case]:
    """The launch arguments README documents, and a topology / parameter directory of our own."""
    topology = scratch / "topology.yaml"
    topology.write_text(yaml.safe_dump({
        "version": 1,
        "remappings": [["/clock", "/sim/clock"]],
        "restart": {"delay": 0.5, "max_delay": 4.0, "limit": 2, "window": 30.0},
        "processes": [
            {"name": "planning", "executable": "planner", "nodes": ["planner"],
             "remappings": [["route", "/mission/route"]]},
            {"name": "decision", "executable": "decision_stack", "nodes": ["decision_inference", "explainer"],
             "critical": False},
        ]}, sort_keys=False))
    params = scratch / "params"
    params.mkdir()
    from luna_bringup.topology import config_dir
    shutil.copy(config_dir() / "planner.yaml", params / "planner.yaml")  # decision_inference.yaml absent:
    shutil.copy(config_dir() / "explainer.yaml", params / "explainer.yaml")  # both launchers skip it
    return [
        Case("defaults"),
        Case("simulation time", {"use_sim_time": "true"}, sim_time=True),
        Case("some processes", {"only": "map_server,planner"}, only="map_server,planner"),
        Case("a node of a shared process", {"only": "explainer"}, only="explainer"),
        Case("own topology and parameter directory",
             {"topology": str(topology), "params_dir": str(params), "use_sim_time": "true"},
             topology=topology, params_dir=params, sim_time=True),
    ]


def run(launch_file: Path, cases: list[Case]) -> tuple[list[str], list[Difference]]:
    base_env = base_environment()
    lines, diffs = [], []
    resolved: dict[str, str] = {}
    for case in cases:
        luna = luna_side(case, base_env)
        launch = launch_side(launch_file, case, base_env)
        found = compare(case.name, luna, launch)
        diffs += found
        lines += case_table(case, luna, found)
        resolved.update({f"{p.package}/{p.executable}": p.resolved for p in launch})
    if resolved:
        lines += ["Where launch found the executables (not compared; `luna up` runs the venv's console scripts):",
                  ""] + [f"- {exe}: {_short_path(where)}" for exe, where in resolved.items()] + [""]
    if diffs:
        lines += ["#### Differences", "", "| case | process | field | luna up | launch |", "|---|---|---|---|---|"]
        lines += [f"| {d.case} | {d.process} | {d.what} | {_cell(d.luna)} | {_cell(d.launch)} |" for d in diffs]
        lines.append("")
    return lines, diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch-file", type=Path, default=DEFAULT_LAUNCH_FILE,
                        help="launch file to check (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.launch_file.is_file():
        print(f"launch_crosscheck: {args.launch_file}: no such launch file", file=sys.stderr)
        return EXIT_USAGE
    if not launch_available():
        print(f"launch_crosscheck: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    import launch
    import launch_ros
    from importlib.metadata import version

    with tempfile.TemporaryDirectory(prefix="luna-launch-check-") as scratch:
        _TEMP_ROOTS.append(scratch)
        lines, diffs = run(args.launch_file.resolve(), default_cases(Path(scratch)))
    print(f"launch {version('launch')} ({Path(launch.__file__).parent}), launch_ros {version('launch_ros')} "
          f"({Path(launch_ros.__file__).parent}); launch file {_short_path(str(args.launch_file.resolve()))}\n")
    print("\n".join(lines))
    if diffs:
        print(f"verdict: {len(diffs)} difference(s) between luna up and the launch file")
    else:
        print("verdict: the launch file starts what luna up starts, in every case")
    return exit_status(diffs)


if __name__ == "__main__":
    sys.exit(main())
