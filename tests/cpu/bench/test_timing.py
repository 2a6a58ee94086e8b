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
                         sync=lambda: None, min_warmup_s=0.0)
    assert calls == list(range(7))
    assert ms == 1.0


def test_warm_up_lasts_at_least_min_warmup_s(monkeypatch):
    """After a compile the GPU's clocks are low: warm-up runs on past `warmup` calls until the time is up,
    synchronizing every `warmup` calls, and the timed runs continue the input rotation after it."""
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    calls, syncs = [], []

    class Event:
        def record(self):
            self.t = now[0]

    def fn(i):
        calls.append(i)
        now[0] += 0.1

    timing.time_cuda(fn, warmup=2, iters=3, event=Event, elapsed_ms=lambda a, b: b.t - a.t,
                     sync=lambda: syncs.append(len(calls)), min_warmup_s=0.55)
    assert calls == list(range(9))          # 6 warm-up calls (0.6 s >= 0.55 s), then 3 timed ones
    assert syncs == [2, 4, 6, 6, 9]


def test_interleaved_timing_alternates_the_calls_and_takes_each_median():
    clock, order = [0], []

    class Event:
        def record(self):
            self.t = clock[0]

    def make(name, cost):
        def fn(i):
            order.append((name, i))
            clock[0] += cost + (50 if (name, i) == ("a", 6) else 0)   # one slow run of a
        return fn

    ms = timing.time_interleaved([make("a", 2), make("b", 3)], warmup=1, iters=3, event=Event,
                                 elapsed_ms=lambda x, y: float(y.t - x.t), sync=lambda: None, min_warmup_s=0.0)
    # each call the next rotation index: b never reads the input set a has just read
    assert order == [("a", 0), ("b", 1), ("a", 2), ("b", 3), ("a", 4), ("b", 5), ("a", 6), ("b", 7)]
    assert ms == [2.0, 3.0]
