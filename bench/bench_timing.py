"""Timing helpers shared by the Python benches (python_client_bench.py, vllm_load_stall.py)."""

import statistics
import time


def median_s(fn, reps):
    """Median seconds of `reps` calls of fn(), after one call to warm up (page faults of the
    destination, leases, mappings)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
