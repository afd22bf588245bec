"""Linear time, checked in a way load cannot break: the same work at size n and at 8n, timed in one test.

A busy machine slows both sizes alike, so their ratio holds where an absolute budget does not: linear code
gives about 8, quadratic about 64. Each size is timed several times, interleaved, and the fastest run counts
(the one least disturbed), in CPU time with the cyclic GC paused so that a collection over what earlier tests
left on the heap is not billed to the call (collecting first would cost more than the calls themselves). Absolute timings are printed by scripts/bench_parser.py.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

FACTOR = 8
MAX_RATIO = 32  # linear: ~8 (up to 14 measured, cache effects at 8x); quadratic: ~64


def cpu_seconds(fn: Callable[[], object]) -> float:
    gc.disable()
    try:
        start = time.process_time()
        fn()
        return time.process_time() - start
    finally:
        gc.enable()


MIN_SMALL_S = 0.003  # the smaller size is grown until it takes this long, so clock granularity cannot matter


def growth(make: Callable[[int], Callable[[], object]], n: int, factor: int = FACTOR, repeats: int = 3,
           max_n: int = 1 << 20) -> float:
    """Best CPU time of `make(n * factor)()` over best CPU time of `make(n)()`, n doubled first while the
    smaller run is too quick to time (up to max_n)."""
    while n * 2 <= max_n and cpu_seconds(make(n)) < MIN_SMALL_S:
        n *= 2
    small, large = make(n), make(n * factor)
    best_small = best_large = float("inf")
    for _ in range(repeats):
        best_small = min(best_small, cpu_seconds(small))
        best_large = min(best_large, cpu_seconds(large))
    return best_large / max(best_small, 1e-4)


def assert_linear(make: Callable[[int], Callable[[], object]], n: int, what: str = "", **kwargs) -> None:
    ratio = growth(make, n, **kwargs)
    assert ratio < MAX_RATIO, f"{what}: {FACTOR}x the input took {ratio:.1f}x the CPU time (linear ~{FACTOR})"
