"""RViz / Foxglove markers of the planner's candidates: each candidate action's best trajectory,
coloured by its Eq. 22 score (green = chosen, red to yellow by score), labelled with the action."""

from __future__ import annotations

from builtin_interfaces.msg import Duration
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from luna_core.types import Trajectory


def _colour(score: float, chosen: bool) -> ColorRGBA:
    if chosen:
        return ColorRGBA(r=0.1, g=0.9, b=0.2, a=1.0)
    s = min(max(score, 0.0), 1.0)
    return ColorRGBA(r=1.0, g=0.2 + 0.7 * s, b=0.1, a=0.8)


def candidate_markers(planner, stamp_msg, frame_id: str = "map") -> MarkerArray:
    """Markers from ``planner.debug_candidates()`` -> [(action code, Trajectory, score, chosen)],
    when the planner offers it; an empty array (clearing old markers) otherwise, e.g. for ``None``
    when the cycle did not run the planner."""
    out = MarkerArray(markers=[Marker(action=Marker.DELETEALL, ns="candidates")])
    debug = getattr(planner, "debug_candidates", None)
    if not callable(debug):
        return out
    for i, (code, traj, score, chosen) in enumerate(debug()):
        traj: Trajectory
        line = Marker(ns="candidates", id=2 * i, type=Marker.LINE_STRIP, action=Marker.ADD,
                      lifetime=Duration(sec=1))
        line.header.frame_id = frame_id
        line.header.stamp = stamp_msg
        line.scale.x = 0.4 if chosen else 0.2
        line.color = _colour(score, chosen)
        line.points = [Point(x=float(x), y=float(y), z=0.1) for x, y in zip(traj.x, traj.y)]
        label = Marker(ns="candidates", id=2 * i + 1, type=Marker.TEXT_VIEW_FACING, action=Marker.ADD,
                       text=f"{code} {score:.2f}", lifetime=Duration(sec=1))
        label.header = line.header
        label.scale.z = 1.0
        label.color = line.color
        label.pose.position = Point(x=float(traj.x[-1]), y=float(traj.y[-1]), z=1.0)
        out.markers += [line, label]
    return out
