"""rclpy set-up shared by the bag commands."""

from __future__ import annotations

import os

import rclpy
from rclpy.signals import SignalHandlerOptions


def init_ros() -> None:
    """Initialise rclpy for a bag command: the project's fast-discovery Fast DDS profile unless the
    user chose one (as ``luna up`` does for the stack, so this process and the stack find each other in
    ~0.1 s), and no rclpy signal handlers (the commands stop cleanly on SIGINT themselves)."""
    from luna_bringup.topology import config_dir

    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(config_dir() / "fastdds_fast_discovery.xml"))
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
