"""The ROS bridge: the built-in simulator driving a stack that runs as ROS nodes, in lock step.

``RosStackPlanner`` is a ``luna_core.types.Planner`` whose ``plan`` publishes the simulator's state
(``/clock``, odometry, acceleration, objects, traffic lights; the lane graph and route latched once)
and, at every replan instant, waits for the stack's ``planning/trajectory`` of that very instant.
``simulate`` calls it every step, so the stack sees 0.1 s steps of simulation time and the result is
the same as running the planner in process (``tests/closed_loop/test_ros_lockstep.py``; with decisions,
``luna`` and the default student: ``tests/closed_loop/test_parity.py``). A trajectory
that does not arrive within the timeout counts as a planner failure (the simulator then tracks a
comfortable stop).

Simulation time t maps to ROS time t + ``LockstepConfig.time_offset``: ROS treats time 0 as "unset", and the ego
history before the scenario start needs stamps too.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import rclpy
from geometry_msgs.msg import AccelWithCovarianceStamped
from nav_msgs.msg import Odometry
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rosgraph_msgs.msg import Clock

import luna_msgs.msg as lm
from luna_core.blas import limit_blas_for_good
from luna_core.types import DecisionDistribution, PlannerInput, Trajectory
from luna_msgs_py import convert, qos

from luna_bridge.scenario import SIM_DT, Scenario

TIME_OFFSET = 100.0  # s added to simulation time on the wire
HEARTBEAT = 0.5  # s of wall time between re-sends of the held /clock (every node handles each one)
LATCHED_SETTLE = 0.5  # s of wall time after the stack acknowledged a scenario's lane graph and route


class PlannerTimeout(RuntimeError):
    """The stack did not answer a replan in time (a planner failure for the simulator)."""


@dataclass(frozen=True)
class LockstepConfig:
    replan_period: float = 0.5  # s, the planner node's replan_period
    timeout: float = 10.0  # s of wall time to wait for a trajectory
    connect_timeout: float = 30.0  # s of wall time to wait for the stack's subscribers
    # Wait for a luna/decision publisher too (a full luna stack, as the demo drives): a bridge node new to a
    # running stack may know the planner before it has discovered the decision node, and then miss the
    # first decision of its scenario. Off for a stack without decisions (a planner node alone).
    expect_decisions: bool = False
    time_offset: float = TIME_OFFSET  # s; ROS time = simulation time + offset. Consecutive scenarios
    # against one running stack need increasing offsets: the stack's clock must never run backwards.


class RosStackPlanner:
    """Drives the stack over ROS; see the module docstring."""

    name = "ros-stack"

    def __init__(self, scenario: Scenario, config: LockstepConfig = LockstepConfig(),
                 context: rclpy.Context | None = None) -> None:
        self.scenario = scenario
        self.config = config
        # The bridge waits for the stack or the wall clock between steps: idle BLAS helper threads would spin
        # on the cores the stack needs (luna_core.blas).
        limit_blas_for_good()
        self.node = Node("luna_bridge", context=context)  # one per running stack: see drive_next
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        n = self.node
        self.clock_pub = n.create_publisher(Clock, "/clock", qos.RELIABLE)
        self.odom_pub = n.create_publisher(Odometry, "localization/kinematic_state", qos.STATE)
        self.accel_pub = n.create_publisher(AccelWithCovarianceStamped, "localization/acceleration", qos.STATE)
        self.steering_pub = n.create_publisher(lm.SteeringReport, "vehicle/status/steering_status", qos.STATE)
        self.objects_pub = n.create_publisher(lm.TrackedObjects, "perception/objects", qos.SENSOR)
        self.lights_pub = n.create_publisher(lm.TrafficLightStateArray, "perception/traffic_lights", qos.SENSOR)
        self.graph_pub = n.create_publisher(lm.LaneGraph, "map/lane_graph", qos.LATCHED)
        self.route_pub = n.create_publisher(lm.Route, "planning/route", qos.LATCHED)
        self.latest: Trajectory | None = None
        self.decisions: list[DecisionDistribution] = []
        self._outputs = (
            n.create_subscription(lm.Trajectory, "planning/trajectory", self._on_trajectory, qos.RELIABLE),
            n.create_subscription(lm.DecisionDistribution, "luna/decision", self._on_decision, qos.RELIABLE))
        self.current: Trajectory | None = None
        self.ego_sent_until: float | None = None  # stamp of the newest ego state on the wire

    # -- plumbing -----------------------------------------------------------------------------------

    def _on_trajectory(self, msg: lm.Trajectory) -> None:
        traj = convert.msg_to_trajectory(msg)
        traj.stamp -= self.config.time_offset
        self.latest = traj

    def _on_decision(self, msg: lm.DecisionDistribution) -> None:
        try:
            d = convert.msg_to_decision(msg)
        except ValueError:
            return  # the planner diagnoses bad decisions; the bridge only records good ones
        # Both of its times back to simulation time (the scene's too: the log and the reflection round
        # pair a decision with its scene by it, as in process).
        d.stamp -= self.config.time_offset
        d.scene_stamp -= self.config.time_offset
        self.decisions.append(d)

    def _spin_until(self, predicate, timeout: float, heartbeat=None) -> bool:
        """Spin until ``predicate``; ``heartbeat`` is called every ``HEARTBEAT`` s meanwhile."""
        deadline = time.monotonic() + timeout
        beat = time.monotonic() + HEARTBEAT
        while not predicate():
            now = time.monotonic()
            if now >= deadline:
                return False
            if heartbeat is not None and now >= beat:
                heartbeat()
                beat = now + HEARTBEAT
            self.executor.spin_once(timeout_sec=0.005)
        return True

    def connect(self) -> None:
        """Wait until the stack publishes trajectories and each input publisher has matched every
        subscriber the graph lists for its topic: a message published before a reader matched is lost
        to it, and in lock step that reader's instant would then wait for it in vain."""
        pubs = self._inputs_to_connect()

        def matched(pub) -> bool:
            return pub.get_subscription_count() >= max(1, self.node.count_subscribers(pub.topic_name))

        def heard(sub, at_least: int) -> bool:  # the stack's outputs: a decision published before the match is lost
            return sub.get_publisher_count() >= max(at_least, self.node.count_publishers(sub.topic_name))

        trajectories, decisions = self._outputs
        ok = self._spin_until(lambda: all(matched(p) for p in pubs) and heard(trajectories, 1) and
                              heard(decisions, int(self.config.expect_decisions)), self.config.connect_timeout)
        if not ok:
            wanted = "planning/trajectory" + (" and luna/decision" if self.config.expect_decisions else "")
            raise PlannerTimeout("no stack found: nothing subscribes to the simulator's topics or publishes "
                                 f"{wanted} (start it with `{self.stack_command}`)")

    stack_command = "luna up --sim-time"  # how to start a stack this bridge drives (for the error above)

    def _inputs_to_connect(self) -> tuple:
        return self.clock_pub, self.odom_pub, self.accel_pub, self.steering_pub, self.objects_pub, self.lights_pub

    def _publish_steering(self, angle: float, t: float) -> None:
        self.steering_pub.publish(convert.steering_to_msg(t + self.config.time_offset, angle))

    def _publish_ego(self, ego, t: float) -> None:
        if ego.steering_angle is not None:  # measured (the simulator's): the vehicle interface reports it
            self._publish_steering(ego.steering_angle, t)
        ego_msg = convert.ego_to_odometry(dataclasses.replace(ego, stamp=t + self.config.time_offset))
        self.odom_pub.publish(ego_msg)
        accel = AccelWithCovarianceStamped()
        accel.header = ego_msg.header
        accel.accel.accel.linear.x = float(ego.acceleration)
        self.accel_pub.publish(accel)

    def drive_next(self, scenario: Scenario, time_offset: float | None = None) -> None:
        """Drive ``scenario`` next on the same running stack, with this node and its publishers, at ROS
        times ``time_offset`` + t (None: the config's); later than every stamp sent before, for the stack's
        clock must never run backwards. A new bridge node per scenario would bring new writers, which the
        stack's readers match only once DDS discovery reaches them: a sample published before that is lost
        to them, and in lock step its instant then waits out input_sync_timeout (the second mission of
        ``tests/closed_loop/test_parity.py`` did, about one run in six: sessions 20-23)."""
        self.scenario = scenario
        if time_offset is not None:
            self.config = dataclasses.replace(self.config, time_offset=time_offset)

    # -- Planner protocol ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.latest = self.current = None
        self.ego_sent_until = None
        self.decisions.clear()
        graph = self.scenario.lane_graph
        graph.stamp = self.config.time_offset
        self.graph_pub.publish(convert.lane_graph_to_msg(graph))
        route = self.scenario.route
        route.stamp = self.config.time_offset
        self.route_pub.publish(convert.route_to_msg(route))
        self.connect()
        self._deliver_latched()

    def _deliver_latched(self) -> None:
        """Make sure the stack has this scenario's lane graph and route before its first instant: a
        stack that drove another scenario still holds that one's, and would plan on it."""
        latched = (self.graph_pub, self.route_pub)
        matched = self._spin_until(lambda: all(p.get_subscription_count() >= self.node.count_subscribers(p.topic_name)
                                               for p in latched), self.config.connect_timeout)
        acked = matched and all(p.wait_for_all_acked(Duration(seconds=self.config.connect_timeout)) for p in latched)
        if not acked:
            raise PlannerTimeout("the stack did not acknowledge the lane graph and route within "
                                 f"{self.config.connect_timeout:.0f} s")
        # Acknowledged is received, not yet handled: give the nodes' executors a moment (they are idle).
        self._spin_until(lambda: False, LATCHED_SETTLE)

    def plan(self, planner_input: PlannerInput) -> Trajectory:
        t = planner_input.time
        if self.ego_sent_until is None and planner_input.ego.steering_angle is not None:
            # Heard before the first cycle, so that in lock step the planner waits for each instant's angle
            # (as for the acceleration, which the history below makes heard).
            self._publish_steering(planner_input.ego.steering_angle, t)
        # Every state the stack has not seen, not only the one of this call: a vehicle's odometry comes at
        # 20-50 Hz.
        for past in planner_input.ego_history[:-1]:
            if self.ego_sent_until is None or past.stamp > self.ego_sent_until:
                self._publish_ego(past, past.stamp)
        self._publish_ego(planner_input.ego, t)
        self.ego_sent_until = t
        objects = planner_input.objects
        objects_msg = convert.objects_to_msg(objects)
        objects_msg.header.stamp = convert.to_time(t + self.config.time_offset)
        self.objects_pub.publish(objects_msg)
        lights_msg = convert.lights_to_msg(planner_input.traffic_lights)
        lights_msg.header.stamp = objects_msg.header.stamp
        self.lights_pub.publish(lights_msg)
        clock = Clock(clock=convert.to_time(t + self.config.time_offset))
        self.clock_pub.publish(clock)
        period = self.config.replan_period
        if self.current is None or abs(t / period - round(t / period)) < 1e-6:
            # The clock is re-sent while waiting: a node that joined late, or missed the message, still
            # sees this instant (its periodic callbacks fire once per instant, so repeats are harmless).
            arrived = self._spin_until(lambda: self.latest is not None and self.latest.stamp >= t - 1e-6,
                                       self.config.timeout, heartbeat=lambda: self.clock_pub.publish(clock))
            if not arrived:
                raise PlannerTimeout(f"no trajectory for t={t:.1f} s within {self.config.timeout:.1f} s")
            self.current = self.latest
        else:
            self.executor.spin_once(timeout_sec=0.0)
        return self.current

    def decide(self, planner_input: PlannerInput) -> DecisionDistribution | None:
        """As the simulator's decision source: the stack's latest decision (recorded in the log)."""
        return self.decisions[-1] if self.decisions else None

    def await_decisions(self, period: float, until: float, timeout: float = 10.0) -> bool:
        """Spin until this node has the stack's decision for every multiple of ``period`` up to ``until``
        (scenario time): the planner waited for each, but this node's copy may still be on the way."""
        instants = [k * period for k in range(int(until / period + 1e-9) + 1)]
        return self._spin_until(lambda: all(any(abs(d.stamp - t) < 1e-6 for d in self.decisions)
                                            for t in instants), timeout)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def lockstep_simulation_config(replan_period: float = 0.5):
    """Simulator settings for a lock-step run: the bridge is called every step, decisions every T_d."""
    from luna_bridge.sim.simulator import SimulationConfig
    return SimulationConfig(replan_every=1, decision_every=max(1, int(round(replan_period / SIM_DT))))


def in_process_config(replan_period: float = 0.5):
    """The in-process equivalent of a lock-step run with a planner replanning every ``replan_period``."""
    from luna_bridge.sim.simulator import SimulationConfig
    return SimulationConfig(replan_every=max(1, int(round(replan_period / SIM_DT))))
