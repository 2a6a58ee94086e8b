#!/usr/bin/env python3
"""Host cost of a small call with the GPU idle: flashkit through the per-signature cache, through the full path
(cache off: validate, select, build look-up, parameter block every call), and PyTorch SDPA, in one run.

Per case: the median of perf_counter around each call (launches are asynchronous: a call returns once queued),
with a synchronize every SYNC_EVERY calls so the queue never fills; the median over batches of
(batch wall time - one call's GPU time, by CUDA events) / batch size; and the least thread CPU time per call of
any batch (the per-call timers included; steady where other processes share the cores). GPU time per call is
printed beside them: the GPU is idle when it is well below the host time.

--fake runs flashkit's rows on the CPU tier's faked H100 (tests/cpu/runtime/fake_device.py: fake addresses,
CuPy's real array construction, kernels that only count their launches): no GPU needed, for before/after
ratios of the Python work on one machine; its absolute numbers leave out the driver's launch cost.

    python3 scripts/bench_host.py [--calls 3000] [--json out.json] [--fake]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402

import flashkit  # noqa: E402
from flashkit.runtime import call_cache  # noqa: E402

SYNC_EVERY = 50
WARMUP_CALLS = 100


def gpu_us(fn, reps: int = 200) -> float:
    """GPU time of one call, by CUDA events around many (the host keeps ahead at these sizes)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    fn()
    cp.cuda.Device().synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / reps


def host_us(fn, calls: int, sync, gpu_time=gpu_us) -> dict:
    for _ in range(WARMUP_CALLS):
        fn()
    sync()
    gpu = gpu_time(fn)
    per_call, batches, cpu = [], [], []
    clock, cpu_clock = time.perf_counter, time.thread_time_ns
    for _ in range(calls // SYNC_EVERY):
        t_batch, c_batch = clock(), cpu_clock()
        for _ in range(SYNC_EVERY):
            t0 = clock()
            fn()
            per_call.append(clock() - t0)
        cpu.append((cpu_clock() - c_batch) / 1e3 / SYNC_EVERY)   # before the synchronize (which may spin)
        sync()
        batches.append((clock() - t_batch) * 1e6)
    return {"host_median_us": statistics.median(per_call) * 1e6,
            "host_batch_us": (statistics.median(batches) - gpu) / SYNC_EVERY,
            "host_cpu_us": min(cpu), "gpu_us": gpu}


def cases(calls: int) -> list[dict]:
    bf16 = ml_dtypes.bfloat16
    rng = cp.random.default_rng(0)
    randn = lambda *s: rng.standard_normal(s, dtype=cp.float32).astype(bf16)  # noqa: E731
    rows = flashkit_rows(calls, randn, cp.full((1,), 1024, dtype=cp.int32), cp.cuda.Device().synchronize, gpu_us)
    rows += torch_rows(calls)
    return rows


def fake_cases(calls: int) -> list[dict]:
    """flashkit's rows on the faked H100 (no GPU: no event times, nothing to synchronize)."""
    import numpy as np
    import pytest

    from tests.cpu.runtime.fake_device import Recorder, fake, installed
    with pytest.MonkeyPatch.context() as mp, installed(mp.setattr, pooled=True):
        Recorder.record = False
        try:
            return flashkit_rows(calls, lambda *s: fake(s), fake((1,), np.int32), lambda: None, lambda fn: 0.0,
                                 paths=("cached",), value_checks=False)
        finally:
            Recorder.record = True


def flashkit_rows(calls: int, array, lens, sync, gpu_time, paths=("cached", "full_path"),
                  value_checks: bool = True) -> list[dict]:
    """The cached and full-path host time of each flashkit case; array(*shape) makes a bf16 input."""
    q, k, v = array(1, 1, 1, 64), array(1, 1, 1, 64), array(1, 1, 1, 64)
    qd, kc, vc = array(1, 1, 8, 128), array(1, 1024, 8, 128), array(1, 1024, 8, 128)
    qp, kp, vp = array(1, 128, 2, 64), array(1, 128, 2, 64), array(1, 128, 2, 64)
    flashkit_calls = {
        "tiny 1x1x1x64: attention": lambda: flashkit.attention(q, k, v),
        "decode 1x8 heads x1024 keys: attention": lambda: flashkit.attention(qd, kc, vc),
        "decode 1x8x1024: attention_with_kvcache(check_indices=False)":
            lambda: flashkit.attention_with_kvcache(qd, kc, vc, cache_seqlens=lens, check_indices=False),
        "prefill 1x128x2x64: attention (tensor maps on Hopper)": lambda: flashkit.attention(qp, kp, vp),
    }
    if value_checks:   # a synchronizing read of the lengths: needs a device
        flashkit_calls["decode 1x8x1024: attention_with_kvcache (default, value checks)"] = \
            lambda: flashkit.attention_with_kvcache(qd, kc, vc, cache_seqlens=lens)
    rows = []
    for name, fn in flashkit_calls.items():
        fn()   # compile / load
        row = {"case": name, "cached": host_us(fn, calls, sync, gpu_time)}
        if "full_path" in paths:
            full_max = call_cache.CALLS.max_entries
            call_cache.CALLS.max_entries = 0      # every call takes the full path (the behaviour before the cache)
            call_cache.invalidate()
            try:
                row["full_path"] = host_us(fn, calls, sync, gpu_time)
            finally:
                call_cache.CALLS.max_entries = full_max
        rows.append(row)
    return rows


def torch_rows(calls: int) -> list[dict]:
    rows = []
    try:
        import torch
        import torch.nn.functional as F
        t = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        tq, tk, tv = t(1, 1, 1, 64), t(1, 1, 1, 64), t(1, 1, 1, 64)
        dq, dk, dv = t(1, 8, 1, 128), t(1, 8, 1024, 128), t(1, 8, 1024, 128)
        tsync = torch.cuda.synchronize
        with torch.no_grad():
            rows.append({"case": "tiny 1x1x1x64: torch SDPA",
                         "torch": host_us(lambda: F.scaled_dot_product_attention(tq, tk, tv), calls, tsync)})
            rows.append({"case": "decode 1x8x1024: torch SDPA",
                         "torch": host_us(lambda: F.scaled_dot_product_attention(dq, dk, dv), calls, tsync)})
        rows.append({"torch_version": torch.__version__})
    except ImportError as e:
        rows.append({"case": "torch SDPA", "skipped": str(e)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fake", action="store_true", help="flashkit's rows on the CPU tier's faked H100 (no GPU)")
    args = ap.parse_args()
    if args.fake:
        device = "faked H100 (tests/cpu/runtime/fake_device.py)"
        rows = fake_cases(args.calls)
    else:
        device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        rows = cases(args.calls)
    print(f"device: {device}  cupy {cp.__version__}  python {sys.version.split()[0]}")
    print(f"{'case':66s} {'path':10s} {'host med us':>11s} {'host batch us':>13s} {'host cpu us':>11s} "
          f"{'gpu us':>7s}")
    for r in rows:
        for path in ("cached", "full_path", "torch"):
            if path in r:
                m = r[path]
                print(f"{r['case']:66s} {path:10s} {m['host_median_us']:11.1f} {m['host_batch_us']:13.1f} "
                      f"{m['host_cpu_us']:11.1f} {m['gpu_us']:7.1f}")
        if "skipped" in r or "torch_version" in r:
            print(r)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "cupy": cp.__version__,
                                         "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
