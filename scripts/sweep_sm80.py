"""Tile-shape sweep of an sm80 forward variant (fa2 by default) per head dim, on the benchmark convention.

Usage: python3 scripts/sweep_sm80.py [--variant fa2] [--seqlen 8192] [hd:block_m,block_n,warps ...]
(no configuration: the default grid). A head dim runs on its manifest class (80 on class 96, padded), so the
grid's head dims may be any the variant takes. Prints TFLOP/s (bf16, batch * seqlen = 16k tokens, heads =
2048 // head_dim, causal and not) of each configuration, and the manifest's own choice beside it.
"""

from __future__ import annotations

import argparse
import dataclasses

GRID = {32: [(128, 64, 4), (128, 128, 4), (64, 64, 4)],   # (128, 64, 4) at 96 and 160 spills: not swept
        64: [(128, 64, 4)],
        80: [(128, 128, 8), (128, 64, 8)],
        96: [(128, 128, 8), (128, 64, 8), (64, 64, 4)],
        128: [(128, 128, 8)],
        160: [(128, 64, 8), (128, 128, 8)],
        192: [(128, 64, 8), (128, 128, 8), (64, 64, 4)],
        256: [(128, 64, 8)]}
TOKENS, HIDDEN = 16384, 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="fa2")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("configs", nargs="*", help="hd:block_m,block_n,warps")
    args = parser.parse_args()

    import cupy as cp

    from flashkit.api import run
    from flashkit.bench.config import BenchShape, attention_flops, device_l2_bytes, rotation_copies
    from flashkit.bench.run import make_inputs
    from flashkit.bench.timing import time_cupy
    from flashkit.call.validate import Problem
    from flashkit.registry import discover_kernels
    from flashkit.runtime.device import device_info
    from flashkit.runtime.launch import LaunchInputs

    grid = GRID
    if args.configs:
        grid = {}
        for a in args.configs:
            hd, cfg = a.split(":")
            grid.setdefault(int(hd), []).append(tuple(int(x) for x in cfg.split(",")))
    base = discover_kernels().get(args.variant)
    cc = device_info().cc
    n = args.seqlen
    b = max(1, TOKENS // n)
    print(f"{args.variant} bf16 seqlen {n}: TFLOP/s per tile configuration (* = the manifest's)", flush=True)
    for hd, configs in grid.items():
        heads = HIDDEN // hd
        chosen = base.launch_config(cc, hd)
        chosen = (chosen["block_m"], chosen["block_n"], chosen["warps"])
        for causal in base.causal_options():
            shape = BenchShape(b, n, heads, hd, causal)
            inputs = make_inputs(shape, "bfloat16", rotation_copies(3 * b * n * heads * hd * 2, device_l2_bytes()), 0)
            flops = attention_flops(b, heads, n, n, hd, causal)
            out = cp.empty_like(inputs[0][0])
            problem = Problem(batch=b, seqlen_q=n, seqlen_k=n, heads=heads, kv_heads=heads, head_dim=hd,
                              dtype="bfloat16", softmax_scale=hd ** -0.5)
            for bm, bn, w in dict.fromkeys(configs + [chosen]):
                spec = dataclasses.replace(base, launch={**base.launch, "block_m": bm, "block_n": bn, "warps": w},
                                           overrides={})

                def call(i, spec=spec):
                    q, k, v = inputs[i % len(inputs)]
                    run(spec, problem, causal, LaunchInputs(q, k, v, out))
                try:
                    ms = time_cupy(call, 3, args.iters)
                    mark = "*" if (bm, bn, w) == chosen else " "
                    print(f"{shape.label:30s} {bm}x{bn}x{w:<3d}{mark} {flops / ms / 1e9:6.0f}", flush=True)
                except Exception as exc:
                    print(f"{shape.label:30s} {bm}x{bn}x{w:<3d}  {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            del inputs, out


if __name__ == "__main__":
    main()
