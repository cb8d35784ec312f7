"""Progress-monitor check latency (``ProgressMonitor.check``, the ``progress_monitor`` node's T_d tick).

One check over a full window at the node's defaults (T_d = 2 s: 20 object frames at 10 Hz, odometry at
20 Hz, H = 3) with ``--objects`` tracked objects per frame (default 256, the node's
``max_tracked_objects`` cap), all in a band ahead of a 10 m/s ego, so that every one is checked for
collisions and, since the near-miss kind (session 30), projected for its time to collision. Prints the
median and the spread of ``--repeats`` checks (s). Run it with another checkout's ``PYTHONPATH`` for a
before/after pair on the same machine:

    .venv/bin/python benchmarks/bench_monitor.py --objects 256 --repeats 50
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from luna_core.monitor import MonitorParameters, ProgressMonitor
from luna_core.types import EgoState, ObjectClass, TrackedObject, TrackedObjects


def filled_monitor(objects: int) -> ProgressMonitor:
    """A monitor holding 4 s of a straight 10 m/s drive and ``objects`` vehicles ahead at 8 m/s per frame."""
    m = ProgressMonitor(MonitorParameters())
    for k in range(81):  # 4 s at 20 Hz
        t = k * 0.05
        m.update_ego(EgoState(t, 10.0 * t, 0.0, 0.0, 10.0))
    for k in range(41):  # 4 s at 10 Hz
        t = round(k * 0.1, 9)
        frame = [TrackedObject(f"v{i}", ObjectClass.VEHICLE, 20.0 + 8.0 * t + 6.0 * (i // 8),
                               -3.5 + (i % 8), 0.0, 8.0, 0.0, 4.5, 1.9) for i in range(objects)]
        m.update_objects(TrackedObjects(t, frame))
    return m


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=256, help="tracked objects per frame")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    m = filled_monitor(args.objects)
    m.check(4.0)  # warm-up
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        m.check(4.0)
        times.append(time.perf_counter() - started)
    times.sort()
    least = getattr(m.diagnostics, "min_time_to_collision", math.nan)  # NaN: a checkout before near misses
    print(f"check with {args.objects} objects x {m.diagnostics.frames_checked} frames: median "
          f"{statistics.median(times) * 1e3:.2f} ms (min {times[0] * 1e3:.2f}, max {times[-1] * 1e3:.2f}; "
          f"{args.repeats} checks); least TTC {least:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
