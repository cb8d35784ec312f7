"""A flood of tracked objects against the planner and the scene descriptor (issue 17, finding 4).

Starts the ``planner`` and ``scene_descriptor`` executables (wall time, bundled prior, a reduced
population) and publishes, for ``--seconds``: odometry at 20 Hz (an ego at 8 m/s on a straight
two-lane road), a lane graph and a route, and every 1 / ``--rate`` s one ``perception/objects``
message of ``--objects`` objects (serialized once; only the stamp is rewritten). It reports what the
nodes did with it: trajectories published and the longest gap between them, the largest odometry age
either node reported as stale, and the ``objects`` condition they raised.

``--tree`` runs the nodes from another checkout's packages (e.g. main before issue 17), so before and
after are measured by the same script; ``--alternate`` runs that tree and this one in turn, twice.

    nice -n 10 flock /tmp/luna-heavy.lock .venv/bin/python benchmarks/oversized_objects.py \
        --objects 10000 --rate 2 --seconds 30 --tree /path/to/old/checkout --alternate
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ros_ws/src/luna_core", "ros_ws/src/luna_msgs_py", "ros_ws/src/luna_nodes", "ros_ws/src/luna_bags", "ros_ws/src/luna_bringup")
_STALE = re.compile(r"odometry is stale \(([\d.]+) s old\)")


def node_env(tree: Path, domain: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.pathsep.join(str(tree / p) for p in PACKAGES) + os.pathsep + str(tree),
                "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                "FASTDDS_DEFAULT_PROFILES_FILE": str(REPO / "ros_ws/src/luna_bringup/config/fastdds_fast_discovery.xml"),
                "PYTHONUNBUFFERED": "1", "RCUTILS_COLORIZED_OUTPUT": "0"})
    return env


def start(executable: str, params: dict, tmp: Path, env: dict) -> subprocess.Popen:
    path = tmp / f"{executable}.yaml"
    path.write_text(yaml.safe_dump({executable: {"ros__parameters": params}}))
    exe = str(Path(sys.executable).parent / executable)
    return subprocess.Popen([exe, "--ros-args", "--params-file", str(path)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def run_once(tree: Path, n_objects: int, rate: float, seconds: float, domain: int) -> dict:
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from nav_msgs.msg import Odometry
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.serialization import serialize_message

    import luna_msgs.msg as lm
    from luna_core import types as T
    from luna_msgs_py import convert as C
    from luna_msgs_py import qos

    env = node_env(tree, domain)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("ROS_", "FASTDDS_"))})
    with tempfile.TemporaryDirectory() as tmp:
        procs = [start("planner", {"population": 32, "time_budget": 0.2}, Path(tmp), env),
                 start("scene_descriptor", {}, Path(tmp), env)]
        context = rclpy.Context()
        rclpy.init(context=context)
        node = Node("oversized_objects_bench", context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        trajectories: list[float] = []
        stale: list[float] = []
        conditions: dict[str, str] = {}
        node.create_subscription(lm.Trajectory, "planning/trajectory", lambda _: trajectories.append(time.monotonic()),
                                 qos.RELIABLE)

        def on_diag(msg) -> None:
            for s in msg.status:
                stale.extend(float(a) for a in _STALE.findall(s.message))
                found = re.search(r"objects: ([^;]+)", s.message)
                if found:
                    conditions[s.name] = found.group(1)
        node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, qos.DIAGNOSTICS)
        odom = node.create_publisher(Odometry, "localization/kinematic_state", qos.SENSOR)
        objects = node.create_publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
        graph = node.create_publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED)
        route = node.create_publisher(lm.Route, "planning/route", qos.LATCHED)
        lanes = T.LaneGraph()
        from luna_core.lanes import make_lane
        lanes.add(make_lane("a0", [[0, 3.5], [2000, 3.5]], 3.5, 15.0, "a", right_neighbor="a1"))
        lanes.add(make_lane("a1", [[0, 0], [2000, 0]], 3.5, 15.0, "a", left_neighbor="a0"))
        graph.publish(C.lane_graph_to_msg(lanes))
        route.publish(C.route_to_msg(T.Route(0.0, ["a"])))
        rng = np.random.default_rng(0)
        flood = [T.TrackedObject(f"o{i}", T.ObjectClass.VEHICLE, float(x), float(y), 0.0, 5.0, 0.0, 4.5, 1.9)
                 for i, (x, y) in enumerate(zip(rng.uniform(0, 2000, n_objects), rng.uniform(-200, 200, n_objects)))]
        payload = bytearray(serialize_message(C.objects_to_msg(T.TrackedObjects(0.0, flood))))
        done = threading.Event()

        def spin() -> None:
            while not done.is_set():
                executor.spin_once(timeout_sec=0.02)
        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
        deadline = time.monotonic() + 120.0  # the planner loads torch and the prior first
        x = 50.0
        while not trajectories and time.monotonic() < deadline:
            now = node.get_clock().now().nanoseconds * 1e-9
            odom.publish(C.ego_to_odometry(T.EgoState(now, x, 0.0, 0.0, 8.0)))
            time.sleep(0.05)
        started = time.monotonic()
        trajectories.clear()
        stale.clear()
        next_objects = started
        while time.monotonic() - started < seconds:
            now = node.get_clock().now().nanoseconds * 1e-9
            x += 8.0 * 0.05
            odom.publish(C.ego_to_odometry(T.EgoState(now, x, 0.0, 0.0, 8.0)))
            if time.monotonic() >= next_objects:
                struct.pack_into("<iI", payload, 4, int(now), int((now % 1.0) * 1e9))  # the header stamp
                objects.publish(bytes(payload))
                next_objects += 1.0 / rate
            time.sleep(0.05)
        window = [t for t in trajectories if t >= started]
        gaps = np.diff([started, *window, time.monotonic()])
        done.set()
        spinner.join()
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        for p in procs:
            p.send_signal(2)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return {"tree": str(tree), "trajectories": len(window), "max_gap_s": float(gaps.max()),
            "max_stale_odometry_s": max(stale, default=0.0), "objects_condition": conditions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0, help="objects messages per second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--tree", type=Path, default=REPO, help="checkout whose packages the nodes run")
    ap.add_argument("--alternate", action="store_true", help="run --tree and this checkout in turn, twice")
    ap.add_argument("--domain", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "42")))
    args = ap.parse_args()
    trees = [args.tree, REPO] * 2 if args.alternate else [args.tree]
    for tree in trees:
        result = run_once(tree.resolve(), args.objects, args.rate, args.seconds, args.domain)
        print(result, flush=True)
    print(f"load average (1 min): {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
