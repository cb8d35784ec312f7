"""Helpers for tests over real DDS: isolated environment, and waiting on the graph, never sleeping.

Every test process gets its own ROS domain (from its pid), discovery limited to localhost, and the
project's fast-discovery Fast DDS profile, so parallel test runs never cross-talk and a subscriber
in another process matches in ~0.1 s instead of ~2.5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
FASTDDS_PROFILE = REPO / "ros_ws/src/luna_bringup/config/fastdds_fast_discovery.xml"


def domain_id() -> int:
    # 1..100: away from 0 (the default domain people run by hand); one per test process.
    return 1 + os.getpid() % 100


def ros_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ROS_DOMAIN_ID": str(domain_id()),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "FASTDDS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE),
        "PYTHONUNBUFFERED": "1",
        "RCUTILS_COLORIZED_OUTPUT": "0",
    })
    env.update(extra or {})
    return env


def apply_ros_env() -> None:
    """Put this process in the test domain (call before rclpy.init)."""
    os.environ.update({k: v for k, v in ros_env().items()
                       if k.startswith(("ROS_", "FASTDDS_", "RCUTILS_"))})


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, spin: Callable[[], None] | None = None,
             period: float = 0.02) -> None:
    """Poll ``predicate`` (spinning ``spin`` between polls) until true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if spin is not None:
            spin()
        else:
            time.sleep(period)
    raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")


def wait_for_subscribers(publisher, count: int = 1, timeout: float = 15.0) -> None:
    wait_for(lambda: publisher.get_subscription_count() >= count, timeout,
             f"{count} subscriber(s) on {publisher.topic_name}")


def wait_for_publishers(subscription, count: int = 1, timeout: float = 15.0) -> None:
    wait_for(lambda: subscription.get_publisher_count() >= count, timeout,
             f"{count} publisher(s) on {subscription.topic_name}")


def start_python(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``python args...`` from the project venv in its own session (so it can be killed whole)."""
    return subprocess.Popen([sys.executable, *args], env=env or ros_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
