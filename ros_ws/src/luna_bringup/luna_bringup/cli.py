"""``luna``: run the LUNA-AD stack on machines without ``ros2 launch``.

    luna up                     start the whole topology (config/topology.yaml), restart what dies; Ctrl-C stops it
    luna up --only planner      start some processes (or the processes holding some nodes)
    luna topology               print the topology and the command line of each process
    luna demo                   the main job on the bundled defaults (see README)

Each command group lives in its own module with a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from luna_bags.signals import stop_on_signals
from luna_bringup.supervisor import Supervisor, run_until_stopped
from luna_bringup.topology import TopologyError, config_dir, load_topology


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", type=Path, help="topology file (default: luna_bringup/config/topology.yaml)")
    p.add_argument("--params-dir", type=Path, help="directory of <node>.yaml parameter files")
    p.add_argument("--only", default="", help="comma-separated process or node names to start")
    p.add_argument("--sim-time", action="store_true", help="set use_sim_time on every node (bridge /clock)")


def _load(args) -> tuple:
    topology = load_topology(args.topology)
    if args.only:
        topology = topology.select([n.strip() for n in args.only.split(",") if n.strip()])
    return topology, args.params_dir or config_dir()


def cmd_up(args) -> int:
    topology, params_dir = _load(args)
    stop = stop_on_signals()
    supervisor = Supervisor(topology, params_dir, args.sim_time, color=sys.stdout.isatty(),
                            standby=not args.no_standby)
    return run_until_stopped(supervisor, stop.is_set)


def cmd_topology(args) -> int:
    topology, params_dir = _load(args)
    supervisor = Supervisor(topology, params_dir, args.sim_time)
    r = topology.restart
    print(f"topology: {topology.source}")
    print(f"restart: after {r.delay:g} s, doubling to at most {r.max_delay:g} s; processes not critical are left "
          f"down after {r.limit} restarts within {r.window:g} s")
    print(f"standby: the processes marked (standby) get a warm standby {r.standby_delay:g} s after they start "
          f"(luna up; --no-standby: none)")
    for p in topology.processes:
        marks = [m for m, on in (("not critical", not p.critical), ("standby", p.standby)) if on]
        print(f"- {p.name}: nodes {', '.join(p.nodes)}{''.join(f' ({m})' for m in marks)}")
        try:
            print(f"    {' '.join(supervisor.argv(p))}")
        except TopologyError as exc:
            print(f"    (not runnable: {exc})")
    return 0


def _register_core(sub) -> None:
    p = sub.add_parser("up", help="start the stack's processes and supervise them")
    _topology_args(p)
    p.add_argument("--no-standby", action="store_true",
                   help="no warm standbys (they hold a second copy of the planner's and the student's models)")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("topology", help="show the processes, nodes and command lines")
    _topology_args(p)
    p.set_defaults(func=cmd_topology)


def _command_modules() -> list:
    """Command groups contributed by other modules (each has ``register(subparsers)``)."""
    import importlib

    modules = []
    for name in ("luna_bringup.demo", "luna_bringup.replay"):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="luna", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _register_core(sub)
    for module in _command_modules():
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TopologyError as exc:
        print(f"luna: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
