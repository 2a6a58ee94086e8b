"""Development timing: flashkit variants vs torch SDPA flash on the paper's convention (one shape each)."""
import sys

import cupy as cp
import ml_dtypes
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashkit


def timeit(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return sorted(times)[len(times) // 2]


seqlen = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
for d in (64, 128, 256):
    h, b = 2048 // d, 16384 // seqlen
    q, k, v = (cp.random.standard_normal((b, seqlen, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
    tq, tk, tv = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v))
    for causal in (False, True):
        flops = 4 * b * h * seqlen * seqlen * d / (2 if causal else 1)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_ref = timeit(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal))
        row = [f"d{d} s{seqlen} causal={int(causal)} torch-flash {flops / t_ref / 1e9:.0f} TF"]
        for name in ("fa2", "causal", "fa1"):
            if name == "causal" and not causal:
                continue
            try:
                t = timeit(lambda: flashkit.attention(q, k, v, causal=causal, variant=name), reps=5 if name == "fa1" else 20)
                row.append(f"{name} {flops / t / 1e9:.0f} TF ({t_ref / t:.2f}x)")
            except Exception as e:
                row.append(f"{name} ERR {type(e).__name__}: {str(e)[:80]}")
        print("  ".join(row), flush=True)
