"""QoS profiles: part of each interface (DESIGN Sec. 5), shared by publishers and subscribers."""

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

#: Objects, traffic lights: only the newest matter; reliable so lock-step replay is exact.
SENSOR = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=5, reliability=ReliabilityPolicy.RELIABLE,
                    durability=DurabilityPolicy.VOLATILE)
#: Odometry and acceleration: every sample counts (the planner's ego history, the scene's differentiated
#: acceleration), and a lock-step simulator sends the 2 s history before its first instant at once.
STATE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=50, reliability=ReliabilityPolicy.RELIABLE,
                   durability=DurabilityPolicy.VOLATILE)
#: Map and route: published once (or on change); late joiners must get the last one.
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: Scene descriptors, decisions, trajectories, failures, explanations, reflections: every one counts.
RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)
#: /diagnostics, as diagnostic_aggregator expects.
DIAGNOSTICS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
#: /clock, as rclpy's time source subscribes to it.
CLOCK = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                   durability=DurabilityPolicy.VOLATILE)
