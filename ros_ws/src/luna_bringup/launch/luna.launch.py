"""ros2 launch luna_bringup luna.launch.py [only:=planner,decision] [use_sim_time:=true] [params_dir:=DIR]
    [topology:=FILE]

Built from the same config/topology.yaml that ``luna up`` runs, so both start the same processes (with
the same log names) with the same parameter files (``common.param.yaml`` first, then each node's;
``ProcessSpec.params_files``), remappings and environment (the fast-discovery DDS
profile unless FASTDDS_DEFAULT_PROFILES_FILE is set; unbuffered Python output), and both restart a
process that dies on its own. benchmarks/launch_crosscheck.py checks this with launch itself
(docs/launch.md).

launch's respawn waits a fixed ``respawn_delay`` (the topology's first back-off step) and counts retries over
the whole run: a critical process is respawned without limit, a non-critical one ``limit`` times. It
cannot tell exit codes apart, so unlike ``luna up`` it also respawns a process whose parameters are
invalid (exit code 2): check a new parameter file with ``luna up`` first.
"""

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from luna_bringup.supervisor import stack_environment
from luna_bringup.topology import config_dir, load_topology


def _nodes(context):
    topology = load_topology(LaunchConfiguration("topology").perform(context) or None)
    only = [n for n in LaunchConfiguration("only").perform(context).split(",") if n]
    if only:
        topology = topology.select(only)
    sim_time = LaunchConfiguration("use_sim_time").perform(context).lower() == "true"
    params_dir = Path(LaunchConfiguration("params_dir").perform(context) or config_dir())
    # What luna up adds to each process's environment, computed by the same function.
    base = dict(context.environment)
    env = {k: v for k, v in stack_environment(base).items() if base.get(k) != v}
    actions = []
    restart = topology.restart
    for p in topology.processes:
        params = [str(f) for f in p.params_files(params_dir) if f.exists()]
        # use_sim_time only when asked (luna up: -p use_sim_time:=true): an explicit false would
        # override a parameter file that sets it.
        if sim_time:
            params.append({"use_sim_time": True})
        # name=None: a __node remap would rename every node of a process holding several;
        # exec_name: the log prefix luna up uses (the process name, not the executable's).
        actions.append(Node(package=p.package, executable=p.executable, name=None, exec_name=p.name,
                            output="screen", parameters=params, additional_env=env,
                            remappings=topology.remappings + p.remappings,
                            respawn=True, respawn_delay=restart.delay,
                            respawn_max_retries=-1 if p.critical else restart.limit,
                            prefix=" ".join(p.command_prefix()) or None))
    return actions


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("topology", default_value="", description="topology file (default: bundled)"),
        DeclareLaunchArgument("only", default_value="", description="comma-separated process/node names"),
        DeclareLaunchArgument("use_sim_time", default_value="false"),
        DeclareLaunchArgument("params_dir", default_value="",
                              description="directory of <node>.yaml parameter files (default: bundled)"),
        OpaqueFunction(function=_nodes),
    ])
