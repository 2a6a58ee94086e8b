"""Timing with CUDA events (warm-up, median of event pairs) and the peak memory a call allocates."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

# The GPU idles while NVRTC builds a kernel (seconds) and drops its clocks; a few short calls do not bring
# them back (the first causal row of a run read 0.5x its later value at 1k tokens). Warm-up therefore runs
# at least `warmup` calls and at least this long.
MIN_WARMUP_S = 0.3


def time_cuda(fn: Callable[[int], Any], warmup: int, iters: int, event: Callable[[], Any],
              elapsed_ms: Callable[[Any, Any], float], sync: Callable[[], None],
              min_warmup_s: float = MIN_WARMUP_S) -> float:
    """Median milliseconds of fn(i) (i selects the rotated inputs), one event pair per run, after a warm-up
    of at least `warmup` calls and `min_warmup_s` seconds of back-to-back calls."""
    return time_interleaved([fn], warmup, iters, event, elapsed_ms, sync, min_warmup_s)[0]


def time_interleaved(fns: list[Callable[[int], Any]], warmup: int, iters: int, event: Callable[[], Any],
                     elapsed_ms: Callable[[Any, Any], float], sync: Callable[[], None],
                     min_warmup_s: float = MIN_WARMUP_S) -> list[float]:
    """Median milliseconds of each fns[j](i), the calls interleaved (fns[0](i), fns[1](i), ... for each i) so that
    every function runs under the same clocks: the ratio of two short kernels timed apart moved by up to 10%
    from run to run on the H100 (GPU boost); timed interleaved, both see the same clock. Every call gets the next
    index of the input rotation (call c of the whole sequence: fn(c)), so that no function reads the input set
    the one before it has just left in the L2. Warm-up: rounds of every function, at least `warmup` of them and
    `min_warmup_s` seconds, synchronizing every `warmup` rounds so that the wall clock follows the GPU; the
    timed rounds continue the rotation after it."""
    start_s = time.perf_counter()
    sync_every = max(warmup, 1)
    rounds = 0
    while rounds < warmup or time.perf_counter() - start_s < min_warmup_s:
        for j, fn in enumerate(fns):
            fn(rounds * len(fns) + j)
        rounds += 1
        if rounds % sync_every == 0:
            sync()
    sync()
    pairs: list[list[tuple[Any, Any]]] = [[] for _ in fns]
    for i in range(iters):
        for j, (fn, fn_pairs) in enumerate(zip(fns, pairs)):
            start, end = event(), event()
            start.record()
            fn((rounds + i) * len(fns) + j)
            end.record()
            fn_pairs.append((start, end))
    sync()
    return [float(np.median([elapsed_ms(a, b) for a, b in fn_pairs])) for fn_pairs in pairs]


def time_cupy_interleaved(fns: list[Callable[[int], Any]], warmup: int, iters: int) -> list[float]:
    """time_interleaved with CuPy events on the current stream (PyTorch's default stream is the same legacy
    stream, so PyTorch calls time alongside)."""
    import cupy
    return time_interleaved(fns, warmup, iters, cupy.cuda.Event, cupy.cuda.get_elapsed_time,
                            cupy.cuda.runtime.deviceSynchronize)


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
