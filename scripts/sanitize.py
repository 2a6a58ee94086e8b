"""One small call of every variant this GPU runs, on odd shapes: the workload compute-sanitizer checks.

Usage: compute-sanitizer --tool memcheck|racecheck|synccheck --error-exitcode 1 python3 scripts/sanitize.py
"""

from __future__ import annotations

import cupy as cp

from flashkit import attention, attention_backward
from flashkit.api import variants
from flashkit.call.dtypes import BY_NAME
from flashkit.runtime.device import device_info

SHAPE = (2, 77, 4, 2)   # batch, seqlen (odd, crosses no tile evenly), heads, kv heads (GQA 2:1)


def inputs(head_dim: int, dtype: str, seed: int):
    rng = cp.random.default_rng(seed)
    b, s, h, hk = SHAPE
    storage = BY_NAME[dtype].storage
    return [rng.standard_normal(shape, dtype=cp.float32).astype(storage)
            for shape in ((b, s, h, head_dim), (b, s + 16, hk, head_dim), (b, s + 16, hk, head_dim))]


def main() -> None:
    cc = device_info().cc
    for spec in variants():
        if not spec.runs_on(cc) or spec.requires.get("block_sparse"):
            continue
        head_dim = 128 if 128 in spec.head_dims else spec.head_dims.examples()[0]
        for causal in spec.causal_options():
            if spec.requires.get("fp8"):
                q, k, v = inputs(head_dim, "bfloat16", 0)
                attention(q, k, v, causal=causal, fp8=True, variant=spec.name)
            elif spec.supports("backward"):
                q, k, v = inputs(head_dim, spec.dtypes[0], 1)
                out, lse = attention(q, k, v, causal=causal, return_lse=True)
                attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal, variant=spec.name)
            else:
                q, k, v = inputs(head_dim, spec.dtypes[0], 2)
                attention(q, k, v, causal=causal, variant=spec.name, return_lse=spec.supports("lse"))
            cp.cuda.runtime.deviceSynchronize()
            print(f"{spec.name} hd{head_dim} causal={causal}: ran", flush=True)


if __name__ == "__main__":
    main()
