"""rclpy set-up shared by the bag commands."""

from __future__ import annotations

import os
from pathlib import Path

import rclpy
from rclpy.signals import SignalHandlerOptions


def init_ros(fastdds_profile: Path | None = None) -> None:
    """Initialise rclpy for a bag command: ``fastdds_profile`` (the stack's fast-discovery profile, which
    the ``luna`` command passes, as ``luna up`` gives it to the stack, so this process and the stack find
    each other in ~0.1 s) unless the user chose one, and no rclpy signal handlers (the commands stop
    cleanly on SIGINT themselves). The profile is handed in because it belongs to the bring-up's
    configuration, which this package does not import."""
    if fastdds_profile is not None:
        os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(fastdds_profile))
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
