"""The stop event of a command-line process: set on SIGINT or SIGTERM, so the command ends cleanly."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set (installed for the whole process; call from the main thread)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
