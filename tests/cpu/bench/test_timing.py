"""flashkit.bench without a GPU: CUDA-event timing arithmetic (bench/timing.py)."""

from __future__ import annotations

from flashkit.bench import timing


def test_time_cuda_takes_the_median_of_event_pairs():
    clock = [0]
    calls = []

    class Event:
        def record(self):
            self.t = clock[0]

    def fn(i):
        calls.append(i)
        clock[0] += 10 if i == 4 else 1     # one slow run: the median ignores it

    ms = timing.time_cuda(fn, warmup=2, iters=5, event=Event, elapsed_ms=lambda a, b: float(b.t - a.t),
                         sync=lambda: None)
    assert calls == list(range(7))
    assert ms == 1.0
