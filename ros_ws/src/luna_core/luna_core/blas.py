"""One BLAS thread for the small matrix products on the planners' hot paths.

NumPy's OpenBLAS splits even a (384 x 41) @ (41 x 41) product (the scorer's Savitzky-Golay
derivatives, the tracker's least-squares fits) over every core. On the shared cores the helper
threads wait for a core: that product took 19 ms with 2 threads under load and 0.3 ms with one
(docs/benchmarks.md, "Planner cycle"). OpenBLAS splits the output among its threads, each element is
computed by the same kernel either way, so the results are bit-identical with one thread.

A process that works in short periodic bursts (a node, the ROS bridge) limits BLAS for good
(``limit_blas_for_good``): after each call OpenBLAS's helper threads busy-wait for the next one, and at
2-10 Hz they never stop. In the real-time bridge one such thread kept a core busy: the bridge took
0.56-0.61 cores, and 0.07 with one thread (docs/benchmarks.md, "Real time over ROS").
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import lru_cache

from threadpoolctl import ThreadpoolController


@lru_cache(maxsize=1)
def _blas_pools():
    # Built once (about 1 ms: it inspects the loaded libraries); entering a limit costs ~50 us.
    return ThreadpoolController().select(user_api="blas")


def single_threaded_blas() -> AbstractContextManager:
    """Context in which NumPy's BLAS runs on the calling thread only (restored on exit)."""
    return _blas_pools().limit(limits=1)


def limit_blas_for_good() -> None:
    """NumPy's BLAS on the calling thread only, for the rest of the process (no helper threads to spin)."""
    _blas_pools().limit(limits=1)  # the limit holds until restored, and nothing restores it
