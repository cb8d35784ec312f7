"""Every luna_msgs type crosses a process boundary over real DDS and comes back field-for-field equal."""

import signal
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.equality import assert_same
from tests.ros.echo_peer import TYPES
from tests.ros.helpers import start_python, wait_for, wait_for_publishers, wait_for_subscribers

# luna_core value -> message for each type (the types only used inside others are covered through them).
SOURCES = {
    "TrackedObjects": (samples.objects, C.objects_to_msg, C.msg_to_objects),
    "TrafficLightStateArray": (samples.lights, C.lights_to_msg, C.msg_to_lights),
    "LaneGraph": (samples.lane_graph, C.lane_graph_to_msg, C.msg_to_lane_graph),
    "Route": (samples.route, C.route_to_msg, C.msg_to_route),
    "SceneDescriptor": (samples.scene, C.scene_to_msg, C.msg_to_scene),
    "DecisionDistribution": (samples.decision, C.decision_to_msg, C.msg_to_decision),
    "FailureEvent": (samples.failure, C.failure_to_msg, C.msg_to_failure),
    "DecisionExplanation": (samples.explanation, C.explanation_to_msg, C.msg_to_explanation),
    "ReflectionResult": (samples.reflection, C.reflection_to_msg, C.msg_to_reflection),
    "Trajectory": (samples.trajectory, C.trajectory_to_msg, C.msg_to_trajectory),
    "SteeringReport": (lambda: (12.345, -0.1234567890123457), lambda v: C.steering_to_msg(*v), C.msg_to_steering),
}


def _standalone(name: str):
    """A message for the element types (Lane, TrackedObject, ...) taken from a container sample."""
    containers = {"Lane": ("LaneGraph", "lanes"), "TrackedObject": ("TrackedObjects", "objects"),
                  "TrafficLightState": ("TrafficLightStateArray", "lights"),
                  "ObjectDescription": ("SceneDescriptor", "objects"), "TrajectoryPoint": ("Trajectory", "points")}
    container, field = containers[name]
    make, to_msg, _ = SOURCES[container]
    return getattr(to_msg(make()), field)[0]


def test_every_custom_message_type_round_trips_between_processes(ros_context):
    peer = start_python(["-m", "tests.ros.echo_peer"])
    node = Node("roundtrip_test", context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    received = {}
    try:
        pubs = {}
        for t in TYPES:
            pubs[t.__name__] = node.create_publisher(t, f"/rt/in/{t.__name__}", qos.RELIABLE)
            sub = node.create_subscription(t, f"/rt/out/{t.__name__}",
                                           lambda m, n=t.__name__: received.setdefault(n, m), qos.RELIABLE)
            wait_for_subscribers(pubs[t.__name__])
            wait_for_publishers(sub)
        sent = {}
        for t in TYPES:
            name = t.__name__
            sent[name] = SOURCES[name][1](SOURCES[name][0]()) if name in SOURCES else _standalone(name)
        # Matched as seen from this process is not matched on both sides (discovery reaches the two
        # participants at different times; docs/architecture.md, the parity note): an echo the peer writes
        # before its writer has matched this reader is lost, as a fresh clone's two-worker run showed
        # once. So each type not yet echoed is sent again every second: a round trip is what is tested,
        # not the first sample's delivery.
        last_send = [-1.0]

        def send_missing() -> None:
            if time.monotonic() - last_send[0] >= 1.0:
                for name, msg in sent.items():
                    if name not in received:
                        pubs[name].publish(msg)
                last_send[0] = time.monotonic()
            executor.spin_once(timeout_sec=0.05)

        send_missing()
        wait_for(lambda: len(received) == len(TYPES), 20.0, f"echoes of {len(TYPES)} message types",
                 spin=send_missing)
        assert sorted(received) == sorted(t.__name__ for t in TYPES)
        for name, msg in sent.items():
            assert received[name] == msg, f"{name} changed on the way"
            if name in SOURCES:
                make, _, from_msg = SOURCES[name]
                assert_same(make(), from_msg(received[name]), name)
    finally:
        peer.send_signal(signal.SIGINT)
        peer.wait(timeout=10)
        executor.shutdown()
        node.destroy_node()
    assert peer.returncode == 0, peer.stdout.read()
