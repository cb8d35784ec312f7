"""ros2 launch luna_bringup luna.launch.py [only:=planner,decision] [use_sim_time:=true]

Built from the same config/topology.yaml that ``luna up`` runs, so both start the same processes with
the same parameter files and remappings, and both restart a process that dies on its own. launch's
respawn waits a fixed ``respawn_delay`` (the topology's first back-off step) and counts retries over
the whole run: a critical process is respawned without limit, a non-critical one ``limit`` times. It
cannot tell exit codes apart, so unlike ``luna up`` it also respawns a process whose parameters are
invalid (exit code 2): check a new parameter file with ``luna up`` first.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from luna_bringup.topology import config_dir, load_topology


def _nodes(context):
    topology = load_topology(LaunchConfiguration("topology").perform(context) or None)
    only = [n for n in LaunchConfiguration("only").perform(context).split(",") if n]
    if only:
        topology = topology.select(only)
    sim_time = LaunchConfiguration("use_sim_time").perform(context).lower() == "true"
    params_dir = config_dir()
    actions = []
    restart = topology.restart
    for p in topology.processes:
        params = [str(f) for f in p.params_files(params_dir) if f.exists()]
        actions.append(Node(package=p.package, executable=p.executable, name=None, output="screen",
                            parameters=params + [{"use_sim_time": sim_time}],
                            remappings=topology.remappings + p.remappings,
                            respawn=True, respawn_delay=restart.delay,
                            respawn_max_retries=-1 if p.critical else restart.limit))
    return actions


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("topology", default_value="", description="topology file (default: bundled)"),
        DeclareLaunchArgument("only", default_value="", description="comma-separated process/node names"),
        DeclareLaunchArgument("use_sim_time", default_value="false"),
        OpaqueFunction(function=_nodes),
    ])
