"""The Python side of luna_msgs: conversions between luna_core types and the messages, and the QoS
profile of each interface. Shared by the nodes, the bridge, the bag tools and offline, so none of them
imports another to speak the stack's messages. rclpy and the message packages, no node code."""
