"""QoS for recording and playback: adapt to what publishers offer, and replay what was recorded.

The rules follow rosbag2's: a recording subscription is reliable only if every publisher is reliable
(a reliable reader never matches a best-effort writer) and transient local only if every publisher is
(so latched map and route messages are caught); playback offers the recorded profile, so late-joining
subscribers of transient-local topics (map, route) still get the message.
rosbags' and rclpy's QoS enums share their numeric values (both mirror rmw's).
"""

from __future__ import annotations

from collections.abc import Sequence

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

#: Recording subscriptions keep a deep queue: the writer thread may lag a burst of messages.
RECORD_DEPTH = 1000
#: Depth offered on playback when the bag recorded no profile.
PLAY_DEFAULT_DEPTH = 10


def _qos_time(duration: object) -> QosTime:
    nanoseconds = int(getattr(duration, "nanoseconds", 0))
    return QosTime(nanoseconds // 1_000_000_000, nanoseconds % 1_000_000_000)


def to_bag_qos(profile: QoSProfile) -> Qos:
    """An rclpy profile (as a publisher offers it) in rosbags' form, for the bag's topic metadata."""
    return Qos(
        history=QosHistory(int(profile.history)),
        depth=int(profile.depth),
        reliability=QosReliability(int(profile.reliability)),
        durability=QosDurability(int(profile.durability)),
        deadline=_qos_time(profile.deadline),
        lifespan=_qos_time(profile.lifespan),
        liveliness=QosLiveliness(int(profile.liveliness)),
        liveliness_lease_duration=_qos_time(profile.liveliness_lease_duration),
        avoid_ros_namespace_conventions=bool(profile.avoid_ros_namespace_conventions),
    )


def recording_qos(offered: Sequence[QoSProfile]) -> QoSProfile:
    """The subscription profile that matches every publisher in ``offered``."""
    reliable = bool(offered) and all(p.reliability == ReliabilityPolicy.RELIABLE for p in offered)
    latched = bool(offered) and all(p.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in offered)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=RECORD_DEPTH,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE,
    )


def playback_qos(recorded: Sequence[Qos]) -> QoSProfile:
    """The publisher profile for playback: reliable, transient local if every recorded publisher was.

    A reliable writer also serves best-effort readers, so playback always offers reliable delivery.
    """
    latched = bool(recorded) and all(q.durability is QosDurability.TRANSIENT_LOCAL for q in recorded)
    depths = [q.depth for q in recorded if q.history is QosHistory.KEEP_LAST and q.depth > 0]
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=max(depths) if depths else PLAY_DEFAULT_DEPTH,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE,
    )
