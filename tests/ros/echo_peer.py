"""A node in its own process that echoes every luna_msgs type: /rt/in/<Type> -> /rt/out/<Type>."""

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

import luna_msgs.msg as lm
from luna_msgs_py import qos

TYPES = [getattr(lm, n) for n in sorted(dir(lm)) if not n.startswith("_") and isinstance(getattr(lm, n), type)]


def main() -> None:
    rclpy.init()
    node = Node("echo_peer")
    keep = []
    for t in TYPES:
        pub = node.create_publisher(t, f"/rt/out/{t.__name__}", qos.RELIABLE)
        keep.append(node.create_subscription(t, f"/rt/in/{t.__name__}", pub.publish, qos.RELIABLE))
    print("echo_peer ready", flush=True)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:  # noqa: BLE001
        # SIGINT shut the context down between spin's check and its wait set ("the given context is not
        # valid"; seen once in a fresh clone's make test): a clean stop, as luna_nodes.base.run treats it.
        if rclpy.ok():
            raise
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
