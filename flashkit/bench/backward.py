"""Backward-pass benchmark: flashkit.attention_backward against PyTorch SDPA's flash (FlashAttention-2)
and cuDNN backward, in the same run, by the benchmark convention (batch x seqlen = 16k tokens, hidden
2048, bf16; backward FLOPs = 2.5 x forward = 2.5 x 4 B H Sq Sk D, halved when causal).

Each timing: CUDA events around one backward call (SDPA: torch.autograd.grad of a retained graph, so
only the backward runs), warm-up, median, two input sets alternated.
    flashkit bench --backward [--seqlen 2048,8192] [--head-dim 64,128] [--deterministic] [--variant fa3_bwd --variant fa2_bwd]
                              [--json-out out.json]
    python3 -m flashkit.bench.backward [--seqlens 2048 8192] [--head-dims 64 128] [--variant fa3_bwd fa2_bwd] [--json out.json]
                                       [--head-dim-v 128]
With --head-dim-v (v, out and dout narrower than q and k; MLA's 128 under 192) PyTorch's rows are those of the
backends that take such a v, and each flashkit row is also timed on v and dout zero-padded to q's head dim (what
a caller had to do before the backward took head_dim_v: `padded_ms`, the padding copies not timed); FLOPs count
q k^T, dQ and dK over head_dim and P V, dP and dV over head_dim_v.
"""

from __future__ import annotations

import argparse
import json

from ..errors import UnsupportedError

TOKENS = 16384
HIDDEN = 2048


def median_ms(fn, warmup=3, iters=10):
    from .torch_baselines import time_torch
    return time_torch(fn, warmup, iters)


def bench_one(seqlen, hd, causal, deterministic=False, variants=(None,), hdv=None):
    """One row per flashkit variant (None: the selected one), each against PyTorch's flash and cuDNN backward
    timed in the same call on the same inputs; v and dout of hdv columns where given."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import flashkit
    batch, heads = TOKENS // seqlen, HIDDEN // hd
    dv = hdv or hd
    flops = backward_flops(batch, heads, seqlen, hd, causal, dv)
    import cupy
    sets, arrays, padded = [], [], []
    for s in range(2):
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v, do = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
                       for d in (hd, hd, dv, dv))
        out, lse = flashkit.attention(q, k, v, causal=causal, return_lse=True, variant="fa2")
        sets.append((q, k, v, do))
        # flashkit's calls take CuPy views (as flashkit.torch hands them): the call cache keys CuPy arrays, and a
        # torch tensor's full path (validation, selection, maps) is host time the 2k rows would time instead
        arrays.append(tuple(cupy.from_dlpack(x) for x in (q, k, v, do)) + (out, lse))
        if dv != hd:   # v, out and dout zero-padded to q's head dim
            pad = [cupy.from_dlpack(torch.nn.functional.pad(x, (0, hd - dv))) for x in (v, do)]
            padded.append(arrays[-1][:2] + (pad[0], pad[1], cupy.pad(out, ((0, 0),) * 3 + ((0, hd - dv),)), lse))
    base = {"seqlen": seqlen, "head_dim": hd, "head_dim_v": dv, "causal": causal, "batch": batch, "heads": heads}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            graphs = []
            for q, k, v, do in sets:
                qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                graphs.append((o, (qt, kt, vt), do.transpose(1, 2)))

            def tb(i):
                o, ins, g = graphs[i % 2]
                torch.autograd.grad(o, ins, g, retain_graph=True)
            base[f"{name}_ms"] = median_ms(tb)
        except Exception as e:   # a backend that does not take the shape
            base[f"{name}_ms"] = None
            base[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        base[f"{name}_tflops"] = flops / base[f"{name}_ms"] / 1e9 if base[f"{name}_ms"] else None
    rows = []
    for variant in variants:
        def fk(i):
            q, k, v, do, out, lse = arrays[i % 2]
            flashkit.attention_backward(do, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                                        variant=variant)
        row = dict(base, variant=variant, flashkit_ms=median_ms(fk))
        row["flashkit_tflops"] = flops / row["flashkit_ms"] / 1e9
        if padded:
            def fk_padded(i):
                q, k, v, do, out, lse = padded[i % 2]
                flashkit.attention_backward(do, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                                            variant=variant)
            row["padded_ms"] = median_ms(fk_padded)
            row["vs_padded"] = row["padded_ms"] / row["flashkit_ms"]
        for key in ("flash", "cudnn"):
            row[f"vs_{key}"] = row[f"{key}_ms"] / row["flashkit_ms"] if row.get(f"{key}_ms") else None
        rows.append(row)
    return rows


def backward_flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool,
                   head_dim_v: int | None = None) -> float:
    """2.5 forward passes (FlashAttention's convention): 2.5 x 2 B H S^2 (D + Dv) (4 B H S^2 D where v's head dim
    Dv is q's), halved when causal."""
    dv = head_dim_v or head_dim
    return 2.5 * 2 * batch * heads * seqlen * seqlen * (head_dim + dv) / (2 if causal else 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--head-dim-v", type=int, default=None, help="v's head dim, below each --head-dims (MLA: 128)")
    ap.add_argument("--variant", nargs="+", default=None,
                    help="backward variants, each timed in the same call as PyTorch (default: what flashkit selects)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  bf16  backward only  "
          f"deterministic={args.deterministic}  variants={','.join(args.variant or ['selected'])}"
          + (f"  head_dim_v={args.head_dim_v}" if args.head_dim_v else ""))
    rows = []
    fmt = lambda x: f"{x:7.1f}" if x else "    n/a"  # noqa: E731
    ratio = lambda x: f"{x:.2f}" if x else " n/a"  # noqa: E731
    for hd in args.head_dims:
        for causal in (False, True):
            for s in args.seqlens:
                try:
                    timed = bench_one(s, hd, causal, args.deterministic, tuple(args.variant or [None]),
                                      args.head_dim_v)
                except UnsupportedError as e:   # no backward kernel for this head dim on this GPU (sm_80: hd256)
                    print(f"hd{hd:<4} {'causal' if causal else 'full  '} s{s:<6} skipped: {e}", flush=True)
                    continue
                for r in timed:
                    rows.append(r)
                    print(f"hd{hd:<4} {'causal' if causal else 'full  '} s{s:<6} {r['variant'] or 'flashkit':<9}"
                          f"{fmt(r['flashkit_tflops'])} flash {fmt(r['flash_tflops'])} cudnn {fmt(r['cudnn_tflops'])}"
                          f" TFLOP/s   x flash {ratio(r['vs_flash'])}  x cudnn {ratio(r['vs_cudnn'])}"
                          + (f"  x padded v {r['vs_padded']:.3f}" if "vs_padded" in r else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
