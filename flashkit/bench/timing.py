"""Timing with CUDA events (warm-up, median of event pairs) and the peak memory a call allocates."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def time_cuda(fn: Callable[[int], Any], warmup: int, iters: int, event: Callable[[], Any],
              elapsed_ms: Callable[[Any, Any], float], sync: Callable[[], None]) -> float:
    """Median milliseconds of fn(i) (i selects the rotated inputs), one event pair per run."""
    for i in range(warmup):
        fn(i)
    sync()
    pairs = []
    for i in range(iters):
        start, end = event(), event()
        start.record()
        fn(warmup + i)
        end.record()
        pairs.append((start, end))
    sync()
    return float(np.median([elapsed_ms(a, b) for a, b in pairs]))


def time_cupy(fn: Callable[[int], Any], warmup: int, iters: int) -> float:
    import cupy
    return time_cuda(fn, warmup, iters, cupy.cuda.Event, cupy.cuda.get_elapsed_time,
                     cupy.cuda.runtime.deviceSynchronize)


class CupyPeak:
    """Peak bytes the CuPy memory pool hands out while active, beyond what it held at the start."""

    def __enter__(self) -> "CupyPeak":
        import cupy
        self._cupy, self._pool = cupy, cupy.get_default_memory_pool()
        self._base = self.peak = self._pool.used_bytes()
        cupy.cuda.set_allocator(self._malloc)
        return self

    def _malloc(self, size: int):
        mem = self._pool.malloc(size)
        self.peak = max(self.peak, self._pool.used_bytes())
        return mem

    def __exit__(self, *exc) -> None:
        self._cupy.cuda.set_allocator(self._pool.malloc)

    @property
    def extra(self) -> int:
        return self.peak - self._base
