"""A node in its own process that echoes every luna_msgs type: /rt/in/<Type> -> /rt/out/<Type>."""

import sys

from rclpy.node import Node

import luna_msgs.msg as lm
from luna_msgs_py import qos
from luna_nodes.base import run

TYPES = [getattr(lm, n) for n in sorted(dir(lm)) if not n.startswith("_") and isinstance(getattr(lm, n), type)]


def echo_node() -> Node:
    node = Node("echo_peer")
    for t in TYPES:
        pub = node.create_publisher(t, f"/rt/out/{t.__name__}", qos.RELIABLE)
        node.create_subscription(t, f"/rt/in/{t.__name__}", pub.publish, qos.RELIABLE)
    print("echo_peer ready", flush=True)
    return node


if __name__ == "__main__":
    # The nodes' own runner: a SIGINT that shuts the context down inside spin (even in its wait-set
    # set-up, "the given context is not valid") is a clean stop, exit code 0.
    sys.exit(run([echo_node]))
