"""``luna bag from-scenario``: a bridge scenario (synthetic or CommonRoad) -> a bag of the stack's inputs.

The expert log plays the ego: every 0.1 s step of the expert track gives ``/clock``,
``/localization/kinematic_state`` (nav_msgs/Odometry at the rear axle, body-frame twist),
``/perception/objects`` (the logged agents present at that step) and ``/perception/traffic_lights``;
``/map/lane_graph`` and ``/planning/route`` are written once at the start with transient-local QoS, as
the map server and the route planner publish them. Messages are built by ``luna_msgs_py.convert``
(the same conversion the nodes use) and serialized without a ROS graph; stamps and receive times are
``--start-time`` + scenario time (never near 0, which ROS reads as "clock not set").
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rclpy.qos import QoSProfile
from rclpy.serialization import serialize_message
from rosgraph_msgs.msg import Clock
from tqdm import tqdm

from luna_core.types import EgoState, wrap_angle
from luna_msgs_py import convert as C
from luna_msgs_py import qos as Q

from .qos import to_bag_qos
from .topics import CLOCK, LANE_GRAPH, OBJECTS, ODOMETRY, ROUTE, TRAFFIC_LIGHTS
from .writer import BagExistsError, BagWriter, resolve_output

#: Stack input topics with their types and QoS (DESIGN Sec. 5).
INPUT_TOPICS: dict[str, tuple[str, QoSProfile]] = {
    CLOCK: ("rosgraph_msgs/msg/Clock", Q.RELIABLE),
    ODOMETRY: ("nav_msgs/msg/Odometry", Q.STATE),
    OBJECTS: ("luna_msgs/msg/TrackedObjects", Q.SENSOR),
    TRAFFIC_LIGHTS: ("luna_msgs/msg/TrafficLightStateArray", Q.SENSOR),
    ROUTE: ("luna_msgs/msg/Route", Q.LATCHED),
    LANE_GRAPH: ("luna_msgs/msg/LaneGraph", Q.LATCHED),
}
#: Default offset of scenario time 0 on the bag's clock (s): 2023-11-14, arbitrary but far from 0.
DEFAULT_START_TIME = 1_700_000_000.0


class ScenarioSourceError(ValueError):
    """The scenario named on the command line cannot be loaded (says which and why)."""


@dataclass
class ConversionSummary:
    path: Path
    scenario: str
    steps: int
    counts: dict[str, int]
    duration: float  # s of scenario time covered


def expert_states(scenario, start_time: float) -> list[EgoState]:
    """The expert (logged ego) track as rear-axle EgoStates with velocity, acceleration and yaw rate.

    Speed is the velocity projected on the heading (signed, as the controller reports it);
    acceleration and yaw rate are finite differences over the 0.1 s steps. Absent rows are dropped.
    """
    track = scenario.expert
    ok = np.isfinite(track.x) & np.isfinite(track.y) & np.isfinite(track.heading)
    t = track.t[ok]
    heading = np.unwrap(track.heading[ok])
    speed = track.vx[ok] * np.cos(heading) + track.vy[ok] * np.sin(heading)
    lateral = -track.vx[ok] * np.sin(heading) + track.vy[ok] * np.cos(heading)
    if len(t) >= 2:
        acceleration = np.gradient(speed, t)
        yaw_rate = np.gradient(heading, t)
    else:
        acceleration = yaw_rate = np.zeros(len(t))
    return [EgoState(stamp=start_time + float(t[i]), x=float(track.x[ok][i]), y=float(track.y[ok][i]),
                     heading=float(wrap_angle(heading[i])), velocity=float(speed[i]),
                     acceleration=float(acceleration[i]), yaw_rate=float(yaw_rate[i]),
                     lateral_velocity=float(lateral[i]))
            for i in range(len(t))]


def scenario_to_bag(scenario, output: Path, storage: str = "mcap", start_time: float = DEFAULT_START_TIME,
                    progress: bool = True) -> ConversionSummary:
    """Write the stack inputs of ``scenario`` (a ``luna_bridge.scenario.Scenario``) into a new bag."""
    if not math.isfinite(start_time) or start_time < 10.0:
        raise ValueError(f"--start-time {start_time} s is too close to 0 (ROS reads 0 as 'clock not set')")
    states = expert_states(scenario, start_time)
    if not states:
        raise ScenarioSourceError(f"scenario {scenario.name}: the expert track has no valid pose")
    with BagWriter(output, storage) as bag:
        for topic, (msgtype, profile) in INPUT_TOPICS.items():
            bag.add_topic(topic, msgtype, [to_bag_qos(profile)])

        def put(topic: str, stamp: float, msg: object) -> None:
            bag.write(topic, int(round(stamp * 1e9)), serialize_message(msg))

        t0 = states[0].stamp
        put(CLOCK, t0, Clock(clock=C.to_time(t0)))
        put(LANE_GRAPH, t0, C.lane_graph_to_msg(replace(scenario.lane_graph, stamp=t0)))
        put(ROUTE, t0, C.route_to_msg(replace(scenario.route, stamp=t0)))
        for ego in tqdm(states, desc=f"converting {scenario.name}", unit="step", disable=not progress,
                        file=sys.stderr):
            t = ego.stamp - start_time  # scenario time
            if ego.stamp > t0:
                put(CLOCK, ego.stamp, Clock(clock=C.to_time(ego.stamp)))
            put(ODOMETRY, ego.stamp, C.ego_to_odometry(ego))
            objects = scenario.objects_at(t)
            objects.stamp = ego.stamp
            put(OBJECTS, ego.stamp, C.objects_to_msg(objects))
            lights = scenario.lights_at(t)
            lights.stamp = ego.stamp
            put(TRAFFIC_LIGHTS, ego.stamp, C.lights_to_msg(lights))
        counts = dict(bag.counts)
    return ConversionSummary(output, scenario.name, len(states), counts, states[-1].stamp - states[0].stamp)


def load_scenario_source(source: str, suite: str | None = None):
    """A scenario from a file (.json / .json.gz scenario file, CommonRoad .xml) or ``--suite`` + name."""
    try:
        from luna_bridge.scenarios import load_commonroad, load_scenario
        from luna_bridge.scenarios.registry import load_entry, suite_refs
    except ImportError as err:
        raise ScenarioSourceError(f"the bridge's scenario sources are not available here: {err}") from err
    try:
        if suite:
            refs = {name: (src, loader) for name, src, loader in suite_refs(suite)}
            if source not in refs:
                names = ", ".join(sorted(refs)[:12]) + (", ..." if len(refs) > 12 else "")
                raise ScenarioSourceError(f"suite {suite!r} has no scenario {source!r}; it has: {names}")
            return load_entry(*refs[source])
        path = Path(source)
        if not path.is_file():
            raise ScenarioSourceError(f"{source}: no such scenario file (or give --suite NAME and a scenario name)")
        return load_commonroad(str(path)) if path.suffix == ".xml" else load_scenario(path)
    except ScenarioSourceError:
        raise
    except (KeyError, OSError, ValueError, ImportError) as err:  # unknown suite, missing folder or loader, bad file
        raise ScenarioSourceError(f"cannot load scenario {source!r}: {err}") from err


def run(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario_source(args.scenario, args.suite)
        path, storage = resolve_output(args.output or f"{scenario.name}_inputs", args.storage)
        summary = scenario_to_bag(scenario, path, storage, args.start_time, progress=not args.quiet)
    except (ScenarioSourceError, BagExistsError, ValueError) as err:
        print(f"luna bag from-scenario: {err}", file=sys.stderr)
        return 2
    print(f"{summary.path}: scenario {summary.scenario}, {summary.steps} steps, {summary.duration:.1f} s",
          file=sys.stderr)
    for topic, count in sorted(summary.counts.items()):
        print(f"  {topic:40s} {count:8d}", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario file (.json, .json.gz, CommonRoad .xml), or a scenario "
                        "name with --suite")
    parser.add_argument("--suite", help="take the scenario from this bridge suite (luna_bridge load_suite)")
    parser.add_argument("-o", "--output", help="bag directory (default <scenario>_inputs)")
    parser.add_argument("-s", "--storage", choices=["mcap", "sqlite3"], default=None)
    parser.add_argument("--start-time", type=float, default=DEFAULT_START_TIME,
                        help="bag time (s since the epoch) of scenario time 0")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
