"""nuPlan's time to collision (``time_to_collision_within_bound``), shared by the metric and the monitor.

At one instant the ego box and each relevant track are projected at constant speed along their
headings every 0.1 s; a track's TTC is the first projected step where the two boxes overlap (inf if
none within the horizon). Relevant tracks are ahead of the ego (within 30 deg of its heading, seen
from the rear axle) or, where the ego is in a junction or not within its lanes, anywhere except behind
(more than 150 deg off). Nothing is projected while the ego stands (speed <= 0.005 m/s). nuPlan fails
the run when the least TTC is not above 0.95 s.

``luna_bridge.metrics.ttc`` scores a run with it (3 s horizon, the map deciding the junction and lane
rules); the progress monitor reports a near miss with it (``luna_core.monitor``: the scene descriptor
says junction and lane, and only the steps below the bound are projected).
"""

from __future__ import annotations

import numpy as np

from luna_core.collision_kinds import BEHIND_ANGLE
from luna_core.geometry import proposals_vs_objects
from luna_core.types import box_corners, wrap_angle

TTC_STEP = 0.1  # s
TTC_HORIZON = 3.0  # s
LEAST_MIN_TTC = 0.95  # s: nuPlan's bound; a TTC at or below it fails the metric
AHEAD_ANGLE = float(np.deg2rad(30.0))
TTC_STOPPED_SPEED = 0.005  # m/s


def projection_steps(horizon: float = TTC_HORIZON) -> np.ndarray:
    """The projection times (s): 0.1, 0.2, ... below ``horizon``, as nuPlan's ``arange``."""
    return np.arange(TTC_STEP, horizon - 1e-9, TTC_STEP)


def relevant_tracks(rear_axle: np.ndarray, heading: float, track_xy: np.ndarray, wide: bool) -> np.ndarray:
    """(R,) mask of the tracks whose centre (``track_xy`` (R, 2), m) is ahead of the ego (within 30 deg
    of ``heading``, rad, seen from ``rear_axle``); with ``wide`` (the ego in a junction or not within
    its lanes) every track that is not behind it."""
    rel = np.asarray(track_xy, dtype=float).reshape(-1, 2) - np.asarray(rear_axle, dtype=float)
    angle = np.abs(wrap_angle(np.arctan2(rel[:, 1], rel[:, 0]) - heading))
    return (angle < AHEAD_ANGLE) | (wide & (angle <= BEHIND_ANGLE))


def projected_ttc(ego_center: np.ndarray, heading: float, speed: float, ego_length: float, ego_width: float,
                  track_pose: np.ndarray, track_speed: np.ndarray, track_size: np.ndarray,
                  steps: np.ndarray) -> np.ndarray:
    """(R,) each track's TTC (s; inf without a projected overlap at ``steps``).

    ``track_pose`` (R, 3): centre x, y (m) and heading (rad); ``track_speed`` (R,) m/s along the
    heading (0 for static objects); ``track_size`` (R, 2): length, width (m); the ego moves at
    ``speed`` (m/s) along ``heading`` from its box centre ``ego_center``.
    """
    pose = np.asarray(track_pose, dtype=float).reshape(-1, 3)
    ttc = np.full(len(pose), np.inf)
    if len(pose) == 0 or len(steps) == 0:
        return ttc
    direction = np.array([np.cos(heading), np.sin(heading)])
    ego_c = np.asarray(ego_center, dtype=float) + speed * steps[:, None] * direction
    ego_boxes = box_corners(ego_c[:, 0], ego_c[:, 1], heading, ego_length, ego_width)
    dxy = np.asarray(track_speed, dtype=float)[:, None] * np.column_stack([np.cos(pose[:, 2]), np.sin(pose[:, 2])])
    tc = pose[None, :, :2] + steps[:, None, None] * dxy[None]  # (S, R, 2)
    size = np.asarray(track_size, dtype=float).reshape(-1, 2)
    track_boxes = box_corners(tc[..., 0].T, tc[..., 1].T, pose[:, 2:3], size[:, 0:1], size[:, 1:2])
    hit = proposals_vs_objects(ego_boxes[None], track_boxes, backend="numpy")[0]  # (R, S)
    first = hit.any(axis=1)
    ttc[first] = steps[np.argmax(hit[first], axis=1)]
    return ttc
