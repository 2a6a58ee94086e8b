"""Two variants A/B in one process, each call interleaved with PyTorch's cuDNN backend on the same inputs.

Usage: python3 scripts/ab_variants.py OLD NEW HEAD_DIMS SEQLENS [DENSITIES]
  e.g. FLASHKIT_KERNEL_PATH=/tmp/ab python3 scripts/ab_variants.py fa3 fa3_defer 96,192 2048,8192,16384
where /tmp/ab holds a copy of a variant's .cu under another name with one manifest field changed (a launch flag, a
tile shape): the way to measure a change against the code it replaces, under the same clocks. fp8 variants run on
pre-quantized inputs (bench/fp8.py), block-sparse ones on random masks of the given densities. The benchmark
convention: 16k tokens, hidden 2048, bf16; TFLOP/s, then old / cuDNN, new / cuDNN and new / old (time ratios).
"""

from __future__ import annotations

import itertools
import sys


def main(argv: list[str]) -> None:
    import flashkit
    from flashkit.bench.block_sparse import random_mask
    from flashkit.bench.config import BenchConfig, BenchShape, attention_flops, device_l2_bytes, rotation_copies
    from flashkit.bench.fp8 import fp8_call
    from flashkit.bench.run import make_inputs
    from flashkit.bench.timing import time_cupy_interleaved
    from flashkit.bench.torch_baselines import sdpa_call, torch_views

    old, new = argv[0], argv[1]
    head_dims = [int(x) for x in argv[2].split(",")]
    seqlens = [int(x) for x in argv[3].split(",")]
    densities = [float(x) for x in argv[4].split(",")] if len(argv) > 4 else [None]
    l2 = device_l2_bytes()
    print(f"{old} (old) vs {new} (new)\n{'shape':34s} {'old':>6s} {'new':>6s} {'cudnn':>6s} old/cud new/cud new/old")
    for hd, causal, n, density in itertools.product(head_dims, (False, True), seqlens, densities):
        b, heads = 16384 // n, 2048 // hd
        shape = BenchShape(b, n, heads, hd, causal, density=density)
        inputs = make_inputs(shape, "bfloat16", rotation_copies(3 * b * n * heads * hd * 2, l2), 0)
        flops = attention_flops(b, heads, n, n, hd, causal)
        mask = None
        if density is not None:
            mask, flops = random_mask(shape, BenchConfig())
        calls = [sdpa_call("cudnn", causal, torch_views(inputs))]
        for variant in (old, new):
            call = fp8_call(variant, shape, inputs)
            if call is None:
                def call(i, variant=variant, inputs=inputs, causal=causal, mask=mask):
                    q, k, v = inputs[i % len(inputs)]
                    return flashkit.attention(q, k, v, causal=causal, variant=variant, block_mask=mask)
            call(0)   # compile and load outside the timing
            calls.append(call)
        t_cudnn, t_old, t_new = time_cupy_interleaved(calls, 5, 30)
        tf = lambda t: flops / t / 1e9   # noqa: E731 (ms -> TFLOP/s)
        print(f"{shape.label:34.34s} {tf(t_old):6.0f} {tf(t_new):6.0f} {tf(t_cudnn):6.0f} "
              f"{t_cudnn / t_old:7.3f} {t_cudnn / t_new:7.3f} {t_old / t_new:7.3f}", flush=True)
        del inputs, calls

if __name__ == "__main__":
    main(sys.argv[1:])
