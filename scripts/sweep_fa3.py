"""Tile-shape sweep of the fa3 kernel against cuDNN in the same run (the benchmark convention).

Usage: python3 scripts/sweep_fa3.py [--seqlens 2048,8192]
                                   [hd:block_m,block_n,stages[,persistent[,defer[,pass[,free]]]] ...]
(no configuration: the default grid; persistent, defer (defer_pv_wait), pass (pass_unseen) and free (free_issue) 0 or
1, default the manifest's launch table's). Prints TFLOP/s of each configuration and of PyTorch's cuDNN backend, timed
interleaved call by call (both under the same clocks), their ratio, and the largest difference of the two outputs (a
configuration that computes something else shows there, not only in its time).
"""

from __future__ import annotations

import dataclasses
import sys

GRID = {64: [(128, 128, 2), (128, 128, 3), (192, 128, 2), (192, 64, 3)],
        128: [(128, 128, 2), (128, 128, 3), (128, 64, 3)],
        256: [(128, 64, 2)]}
SEQLENS = (2048, 8192)
FLAGS = ("persistent", "defer_pv_wait", "pass_unseen", "free_issue")   # a configuration's optional fields, in order
TOKENS, HIDDEN = 16384, 2048


def main(argv: list[str]) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashkit.api import run
    from flashkit.bench.config import BenchShape, attention_flops, device_l2_bytes, rotation_copies
    from flashkit.bench.run import make_inputs
    from flashkit.bench.timing import time_cupy_interleaved
    from flashkit.call.validate import Problem
    from flashkit.registry import discover_kernels
    from flashkit.runtime.launch import LaunchInputs
    import cupy as cp

    seqlens = SEQLENS
    if argv[:1] == ["--seqlens"]:
        seqlens, argv = tuple(int(x) for x in argv[1].split(",")), argv[2:]
    grid = GRID
    if argv:
        grid = {}
        for a in argv:
            hd, cfg = a.split(":")
            grid.setdefault(int(hd), []).append(tuple(int(x) for x in cfg.split(",")))
    base = discover_kernels().get("fa3")
    l2 = device_l2_bytes()
    print(f"{'shape':28s} {'config':14s} {'fa3':>6s} {'cudnn':>6s} ratio")
    for hd, configs in grid.items():
        heads = HIDDEN // hd
        for causal in (False, True):
            for n in seqlens:
                b = TOKENS // n
                shape = BenchShape(b, n, heads, hd, causal)
                inputs = make_inputs(shape, "bfloat16", rotation_copies(3 * b * n * heads * hd * 2, l2), 0)
                flops = attention_flops(b, heads, n, n, hd, causal)
                views = [tuple(torch.from_dlpack(x).transpose(1, 2) for x in qkv) for qkv in inputs]

                def cudnn(i):
                    q, k, v = views[i % len(views)]
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def cudnn_call(i):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return cudnn(i)
                out = cp.empty_like(inputs[0][0])
                problem = Problem(batch=b, seqlen_q=n, seqlen_k=n, heads=heads, kv_heads=heads, head_dim=hd,
                                  dtype="bfloat16", softmax_scale=hd ** -0.5)
                for bm, bn, st, *rest in configs:
                    flags = dict(zip(FLAGS, rest))   # the switches given, the others the launch table's
                    flags = {f: flags.get(f, base.launch.get(f, 0)) for f in FLAGS}
                    spec = dataclasses.replace(base, launch={"block_m": bm, "block_n": bn, "stages": st,
                                                             "warps": (bm // 64 + 1) * 4, **flags},
                                               overrides={})

                    q0, k0, v0 = inputs[0]
                    try:
                        prepared = run(spec, problem, causal, LaunchInputs(q0, k0, v0, out))
                    except Exception as exc:
                        print(f"d{hd} n{n} causal={causal} {bm}x{bn}x{st}: {type(exc).__name__}: {str(exc)[:200]}")
                        continue

                    out.view(cp.uint16).fill(0x7FFF)   # poisoned (a 16-bit NaN): a tile never written shows
                    prepared(q0, k0, v0, out)
                    err = float((torch.from_dlpack(out).float() - cudnn_call(0).transpose(1, 2).float()).abs().max())

                    def fa3(i):   # the prepared launch: the host's work per call is the pointers and the launch
                        q, k, v = inputs[i % len(inputs)]
                        prepared(q, k, v, out)
                    try:   # each configuration timed interleaved with cuDNN (bench/timing.time_interleaved)
                        t_cudnn, t = time_cupy_interleaved([cudnn_call, fa3], 5, 30)
                        tf, tc = flops / t / 1e9, flops / t_cudnn / 1e9
                        tag = "".join(letter for f, letter in zip(FLAGS, "pduf") if flags[f])
                        print(f"{shape.label:28.28s} {bm}x{bn}x{st}{tag:<6s} "
                              f"{tf:6.0f} {tc:6.0f} {tf / tc:.3f}  max|fa3 - cudnn| {err:.2e}", flush=True)
                    except Exception as exc:
                        print(f"d{hd} n{n} causal={causal} {bm}x{bn}x{st}: {type(exc).__name__}: {str(exc)[:200]}")
                del inputs, views


if __name__ == "__main__":
    main(sys.argv[1:])
