"""The figures `flashkit bench` does not sweep: BlockMask build time at 32k, the FP8 quantization pass
against the attention it feeds, and peak device memory at seqlen 32k. Prints JSON lines."""
import json
import time
from functools import partial

import cupy as cp
import ml_dtypes

import flashkit
from flashkit.bench.timing import CupyPeak
from flashkit.features.fp8 import quantize_fp8, quantize_qkv


def median_ms(fn, reps=10):
    fn()
    start, end, times = cp.cuda.Event(), cp.cuda.Event(), []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return sorted(times)[reps // 2]


def loop_ms(fn, reps=10):
    """Mean time a call over `reps` calls launched back to back (one event pair)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def loop_ratio(fn, base, rounds=5):
    """Median over alternating rounds of loop_ms(fn) / loop_ms(base) (clock drift hits both alike)."""
    fn(), base()
    return sorted(loop_ms(fn) / loop_ms(base) for _ in range(rounds))[rounds // 2]


def gpu_ms(fn, cover, reps=5, rounds=5):
    """GPU time of fn alone: its calls are queued behind `cover` (a long kernel), so the host has
    launched them all before the GPU reaches them and no launch gap is counted."""
    fn()
    start, end, times = cp.cuda.Event(), cp.cuda.Event(), []
    for _ in range(rounds):
        cover()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / reps)
    return sorted(times)[rounds // 2]


def host_ms(fn, reps=20):
    """Host (Python) time of a call: validation, allocation and launches (they are asynchronous)."""
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    cp.cuda.Device().synchronize()
    return sorted(times)[reps // 2]


def randn(shape, dtype=ml_dtypes.bfloat16):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(dtype)


S = 32768
for name, build in [("causal", lambda: flashkit.BlockMask.causal(S)),
                    ("sliding_window_4096", lambda: flashkit.BlockMask.sliding_window(S, width=4096)),
                    ("butterfly", lambda: flashkit.BlockMask.butterfly(S)),
                    ("random_16_heads_0.1", lambda: flashkit.BlockMask.random(1, 16, S, S, 0.1, seed=0))]:
    print(json.dumps({"mask_build": name, "seqlen": S, "ms": round(median_ms(build, 5), 3)}), flush=True)

b, s, h, d = 2, 8192, 16, 128
q, k, v = (randn((b, s, h, d)) for _ in range(3))
flops = 4 * b * h * s * s * d
(qd, qs), (kd, ks), (vd, vs) = quantize_qkv(q, k, v)
t_quant = median_ms(lambda: quantize_qkv(q, k, v))
t_quant_h = median_ms(lambda: quantize_qkv(q, k, v, hadamard=True))
t_fa2 = median_ms(lambda: flashkit.attention(q, k, v, variant="fa2"))
q_copy = cp.empty_like(q)
cover = partial(flashkit.attention, q, k, v, variant="fa2")   # 3 ms of GPU work
t_quant_gpu = gpu_ms(lambda: quantize_qkv(q, k, v), cover)
report = {"shape": [b, s, h, d], "quantize_ms": t_quant, "quantize_hadamard_ms": t_quant_h,
          "quantize_gpu_ms": t_quant_gpu,
          "quantize_hadamard_gpu_ms": gpu_ms(lambda: quantize_qkv(q, k, v, hadamard=True), cover),
          "quantize_host_ms": host_ms(lambda: quantize_qkv(q, k, v)), "fa2_ms": t_fa2,
          # one tensor, and a device copy of it, for the bandwidth (bf16 read + e4m3 written: 3 B an element)
          "quantize_one_gpu_ms": gpu_ms(lambda: quantize_fp8(q), cover),
          "quantize_one_hadamard_gpu_ms": gpu_ms(lambda: quantize_fp8(q, hadamard=True), cover),
          "copy_one_gpu_ms": gpu_ms(lambda: cp.copyto(q_copy, q), cover),
          "fa2_tflops": flops / t_fa2 / 1e9}
for variant in ("fp8", "fa3_fp8"):
    try:
        t = median_ms(lambda: flashkit.attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, variant=variant))
        t_gpu = gpu_ms(lambda: flashkit.attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, variant=variant),
                       cover, reps=2)
        report[variant] = {"ms": t, "gpu_ms": t_gpu, "tflops": flops / t / 1e9, "over_fa2": t_fa2 / t,
                           "quantize_over_it": t_quant / t, "quantize_gpu_over_it_gpu": t_quant_gpu / t_gpu}
        # Back to back (host work hidden, as in a training or serving loop): attention(fp8=True), which
        # quantizes q, k, v first, against the same attention on inputs quantized beforehand.
        pre = partial(flashkit.attention, qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, variant=variant)
        for label, options in (("fp8_true_over_prequantized", {}),
                               ("fp8_true_hadamard_over_prequantized", {"hadamard": True})):
            fused = partial(flashkit.attention, q, k, v, fp8=True, variant=variant, fp8_options=options)
            report[variant][label] = loop_ratio(fused, pre) - 1
    except flashkit.FlashkitError as e:   # fa3_fp8 needs compute capability 9.0
        report[variant] = f"unavailable: {e}"
elements = q.size
report["quantize_one_TBps"] = 3 * elements / report["quantize_one_gpu_ms"] / 1e9
report["copy_one_TBps"] = 4 * elements / report["copy_one_gpu_ms"] / 1e9
print(json.dumps({"fp8": report}), flush=True)
del q, k, v, qd, kd, vd, q_copy

b, s, h, d = 1, 32768, 8, 128
q, k, v = (randn((b, s, h, d)) for _ in range(3))
for variant in ("fa2", "causal", "fa1", "standard"):
    causal = variant == "causal"
    cp.get_default_memory_pool().free_all_blocks()
    try:
        with CupyPeak() as peak:
            flashkit.attention(q, k, v, variant=variant, causal=causal)
            cp.cuda.Device().synchronize()
        extra = peak.extra
    except Exception as e:  # standard's seqlen^2 scores may not fit
        extra = f"{type(e).__name__}: {str(e)[:100]}"
    print(json.dumps({"peak_memory": variant, "shape": [b, s, h, d], "extra_bytes": extra,
                      "scores_bytes_if_materialized": b * h * s * s * 4}), flush=True)
