"""NumPy's BLAS on one thread: for a block (the planners' small products) and for good (a node process)."""

import json
import subprocess
import sys

import numpy  # noqa: F401 - loads the BLAS that threadpoolctl reports
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from luna_core.blas import single_threaded_blas


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_single_threaded_blas_holds_for_its_block_and_is_restored() -> None:
    with threadpool_limits(2, user_api="blas"):
        if set(_blas_threads()) != {2}:
            pytest.skip(f"this machine's BLAS runs {_blas_threads()} thread(s) at most: nothing to limit")
        with single_threaded_blas():
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}


def test_limit_blas_for_good_leaves_one_blas_thread_for_the_rest_of_the_process() -> None:
    # In a child process started with two BLAS threads: the limit must not leak into this test process.
    code = ("import gc, json, numpy\nfrom threadpoolctl import threadpool_info, threadpool_limits\n"
            "from luna_core.blas import limit_blas_for_good\n"
            "threads = lambda: [p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas']\n"
            "threadpool_limits(2, user_api='blas')\n"
            "before = threads()\n"
            "limit_blas_for_good()\n"
            "gc.collect()  # the limiter object is gone: the limit stays\n"
            "print(json.dumps([before, threads()]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = json.loads(run.stdout)
    if set(before) != {2}:
        pytest.skip(f"this machine's BLAS runs {before} thread(s) at most: nothing to limit")
    assert set(after) == {1}
