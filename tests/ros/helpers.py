"""Helpers for tests over real DDS: isolated environment, and waiting on the graph, never sleeping.

Every test process (each pytest-xdist worker) gets its own ROS domain, discovery limited to localhost, and the
project's fast-discovery Fast DDS profile, so parallel test runs never cross-talk and a subscriber
in another process matches in ~0.1 s instead of ~2.5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
FASTDDS_PROFILE = REPO / "ros_ws/src/luna_bringup/config/fastdds_fast_discovery.xml"


def domain_id() -> int:
    # One domain per test process, so pytest-xdist's workers never share one: $LUNA_TEST_ROS_DOMAIN
    # pins the first (several checkouts testing side by side on one machine) and worker i takes
    # pinned + i; else 1..100 from the pid (away from 0, the default domain people run by hand), the
    # worker index as its residue so that concurrent workers differ.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    pinned = os.environ.get("LUNA_TEST_ROS_DOMAIN")
    if pinned:
        return int(pinned) + worker
    return 1 + (os.getpid() % (100 // workers)) * workers + worker


def ros_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ROS_DOMAIN_ID": str(domain_id()),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "FASTDDS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE),
        "PYTHONUNBUFFERED": "1",
        "RCUTILS_COLORIZED_OUTPUT": "0",
    })
    env.update(extra or {})
    return env


def apply_ros_env() -> None:
    """Put this process in the test domain (call before rclpy.init)."""
    os.environ.update({k: v for k, v in ros_env().items()
                       if k.startswith(("ROS_", "FASTDDS_", "RCUTILS_"))})


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, spin: Callable[[], None] | None = None,
             period: float = 0.02) -> None:
    """Poll ``predicate`` (spinning ``spin`` between polls) until true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if spin is not None:
            spin()
        else:
            time.sleep(period)
    raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")


def wait_for_subscribers(publisher, count: int = 1, timeout: float = 15.0) -> None:
    wait_for(lambda: publisher.get_subscription_count() >= count, timeout,
             f"{count} subscriber(s) on {publisher.topic_name}")


def wait_for_publishers(subscription, count: int = 1, timeout: float = 15.0) -> None:
    wait_for(lambda: subscription.get_publisher_count() >= count, timeout,
             f"{count} publisher(s) on {subscription.topic_name}")


def start_python(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``python args...`` from the project venv in its own session (so it can be killed whole)."""
    return subprocess.Popen([sys.executable, *args], env=env or ros_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def start_node(executable: str, node_name: str, params: dict, tmp_path: Path,
               extra_args: list[str] | None = None, standby: bool = False) -> subprocess.Popen:
    """Start a node executable of the venv with its parameters written to a YAML file; ``standby``: as
    luna up starts a warm standby (LUNA_STANDBY=1, promoted by a line on its stdin)."""
    import yaml

    params_file = tmp_path / f"{node_name}.params.yaml"
    params_file.write_text(yaml.safe_dump({node_name: {"ros__parameters": params}}))
    exe = str(Path(sys.executable).parent / executable)
    return subprocess.Popen([exe, "--ros-args", "--params-file", str(params_file), *(extra_args or [])],
                            env=ros_env({"LUNA_STANDBY": "1"} if standby else None), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.PIPE if standby else None)


def stop_process(popen: subprocess.Popen, timeout: float = 15.0) -> str:
    """SIGINT, wait, return everything it printed (killing it if it does not stop)."""
    import signal

    if popen.poll() is None:
        popen.send_signal(signal.SIGINT)
    try:
        out, _ = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        out, _ = popen.communicate()
        out += "\n[test] process did not stop on SIGINT and was killed"
    return out


class Probe:
    """A test-side node: publishers for inputs, collectors for outputs, spinning while waiting."""

    def __init__(self, context, name: str = "probe") -> None:
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node

        self.node = Node(name, context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)

    def publisher(self, msg_type, topic: str, profile):
        return self.node.create_publisher(msg_type, topic, profile)

    def collect(self, msg_type, topic: str, profile) -> list:
        box: list = []
        self.node.create_subscription(msg_type, topic, box.append, profile)
        return box

    def spin(self, seconds: float = 0.05) -> None:
        self.executor.spin_once(timeout_sec=seconds)

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.spin(0.02)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        wait_for(predicate, timeout, what, spin=self.spin)

    def diagnostics(self, node_name: str) -> list:
        """Collector of this node's DiagnosticStatus entries (from /diagnostics)."""
        from diagnostic_msgs.msg import DiagnosticArray

        from luna_msgs_py import qos

        box: list = []
        self.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: box.extend(s for s in m.status if s.name == f"luna: {node_name}"), qos.DIAGNOSTICS)
        return box

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


class StalledCarTraffic:
    """What the stack perceives, published as the stack would (for the reflection's hindsight): a straight
    two-lane road (map and route, latched), the ego in the right lane, a stalled car at x = 40 m in that
    lane and a car driving alongside the ego in the left lane at 8 m/s (odometry and objects at 10 Hz).
    ``ego_x(t)`` / ``ego_v(t)`` give the ego's motion, t in s since the first frame (default: 8 m/s from
    x = 0). Executing AK there stalls behind the stalled car and a lane change collides: in hindsight,
    braking is the revision."""

    def __init__(self, probe: Probe, ego_x=lambda t: 8.0 * t, ego_v=lambda t: 8.0) -> None:
        import luna_msgs.msg as lm
        from nav_msgs.msg import Odometry

        from luna_core import types as T
        from luna_core.lanes import make_lane
        from luna_msgs_py import convert as C
        from luna_msgs_py import qos

        self.probe, self.ego_x, self.ego_v = probe, ego_x, ego_v
        self.odom = probe.publisher(Odometry, "localization/kinematic_state", qos.STATE)
        self.objects = probe.publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
        lanes = probe.publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED)
        route = probe.publisher(lm.Route, "planning/route", qos.LATCHED)
        graph = T.LaneGraph()
        graph.add(make_lane("a0", [[-50, 0], [600, 0]], 3.5, 15.0, "A", left_neighbor="a1"))
        graph.add(make_lane("a1", [[-50, 3.5], [600, 3.5]], 3.5, 15.0, "A", right_neighbor="a0"))
        for p in (self.odom, self.objects, lanes, route):
            wait_for_subscribers(p, timeout=120.0)
        lanes.publish(C.lane_graph_to_msg(graph))
        route.publish(C.route_to_msg(T.Route(0.0, ["A"])))
        self.t0 = self.now()

    def now(self) -> float:
        return self.probe.node.get_clock().now().nanoseconds * 1e-9

    def frame(self) -> None:
        """Publish one frame at the node clock's now."""
        from luna_core import types as T
        from luna_msgs_py import convert as C

        now = self.now()
        t = now - self.t0
        self.odom.publish(C.ego_to_odometry(T.EgoState(now, self.ego_x(t), 0.0, 0.0, self.ego_v(t))))
        self.objects.publish(C.objects_to_msg(T.TrackedObjects(now, [
            T.TrackedObject("stalled", T.ObjectClass.VEHICLE, 40.0, 0.0, 0.0, 0.0, 0.0, 4.5, 1.9),
            T.TrackedObject("beside", T.ObjectClass.VEHICLE, 8.0 * t + 1.0, 3.5, 0.0, 8.0, 0.0, 4.5, 1.9)])))

    def drive(self, seconds: float, events=()) -> None:
        """Publish 10 Hz frames for ``seconds``; ``events`` are (time after t0, callable) run once each."""
        pending = sorted(events, key=lambda e: e[0])
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.frame()
            while pending and pending[0][0] <= self.now() - self.t0:
                pending.pop(0)[1]()
            self.probe.spin_for(0.1)


def answered(probe: Probe, send: Callable[[], Any], timeout: float, what: str, resend_after: float = 5.0):
    """The future of an idempotent service request, sent again each ``resend_after`` s until answered.

    A server that takes a request before it has discovered the client's response reader drops the
    answer (Fast DDS waits only briefly for it: ros2/rmw_fastrtps#390), although the client already
    sees the service as ready; under load (CI) that happens, and one resend is the remedy.
    """
    deadline = time.monotonic() + timeout
    while True:
        future = send()
        try:
            wait_for(future.done, min(resend_after, max(deadline - time.monotonic(), 0.0)), what, spin=probe.spin)
            return future
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what} "
                                   f"(request sent every {resend_after:.0f} s)") from None


def set_parameters(probe: Probe, node_name: str, timeout: float = 30.0, **values) -> list:
    """``set_parameters`` on a running node, one call per parameter; the SetParametersResult of each."""
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(probe.node, node_name)
    wait_for(lambda: client.services_are_ready(), timeout, f"the parameter services of {node_name}",
             spin=probe.spin)
    results = []
    for name, value in values.items():
        future = answered(probe, lambda: client.set_parameters([Parameter(name, value=value)]), timeout,
                          f"the answer to set_parameters({name}) from {node_name}")
        results.extend(future.result().results)
    return results


def get_parameters(probe: Probe, node_name: str, names: list[str], timeout: float = 30.0) -> dict:
    """The current values of ``names`` on a running node."""
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(probe.node, node_name)
    wait_for(lambda: client.services_are_ready(), timeout, f"the parameter services of {node_name}",
             spin=probe.spin)
    future = answered(probe, lambda: client.get_parameters(names), timeout,
                      f"the answer to get_parameters from {node_name}")
    return {n: parameter_value_to_python(v) for n, v in zip(names, future.result().values)}
