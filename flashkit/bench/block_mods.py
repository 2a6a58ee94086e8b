"""Block masks with modifications timed in one run (python3 -m flashkit.bench.block_mods): the block-sparse kernel
with softcap / ALiBi / a window against the same kernel and mask without it, against the dense kernel with the same
modification at density 1.0, and against flex_attention with the same block mask and score_mod (compiled; softcap and
ALiBi). Each comparison is timed interleaved call by call, so that its ratios hold under one clock. TFLOP/s count the
kept blocks' (query, key) pairs (bench/block_sparse.py's block_sparse_flops; halved when causal), so rows of one mask
compare times. Benchmark convention: bf16, 16k tokens (batch x seqlen), hidden 2048, inputs rotated past the L2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from .block_sparse import block_sparse_flops
from .config import BenchShape
from .mods import ROTATE, rotated_inputs
from .timing import time_cupy_interleaved
from .torch_baselines import compiled_flex, flex_block_mask

SOFTCAP = 30.0     # Gemma 2's logit cap
WINDOW = 4096      # Mistral's sliding window (left, 0), causal rows only
TOKENS, HIDDEN = 16384, 2048


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--densities", default="1.0,0.5,0.25")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--flex-densities", default="0.5", help="densities timed against flex too (each compiles anew)")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    import cupy
    import torch

    import flashkit
    from flashkit.features.block_mask import BlockMask
    s = args.seqlen
    b = max(1, TOKENS // s)
    flex_densities = set() if args.no_flex else {float(x) for x in args.flex_densities.split(",")}
    rows: list[dict[str, Any]] = []
    for d in (int(x) for x in args.head_dims.split(",")):
        h = HIDDEN // d
        views, cviews = rotated_inputs(b, s, h, d)
        tv = [tuple(t.transpose(1, 2) for t in v) for v in views]
        slopes_t = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
        slopes = cupy.from_dlpack(slopes_t)
        for density in (float(x) for x in args.densities.split(",")):
            mask = BlockMask.random(b, h, s, s, density, seed=0)
            for causal in (False, True):
                bq, bk = mask.block
                flops = block_sparse_flops(mask.dense_blocks(), b, h, s, s, d, bq, bk) / (2 if causal else 1)
                flex = flex_calls(tv, BenchShape(b, s, h, d, causal, density), mask, slopes_t) \
                    if density in flex_densities else {}
                mods = {"softcap": dict(softcap=SOFTCAP), "alibi": dict(alibi_slopes=slopes)}
                if causal:
                    mods["window"] = dict(window_size=(WINDOW, 0))

                def fk(causal=causal, **kw) -> Callable[[int], Any]:
                    return lambda i: flashkit.attention(*cviews[i % ROTATE], causal=causal, **kw)
                for mod, kw in mods.items():
                    calls = [("block mask + mod", fk(block_mask=mask, **kw)), ("block mask", fk(block_mask=mask))]
                    if density == 1.0:
                        calls.append(("dense + mod", fk(**kw)))
                    if mod in flex:
                        calls.append(("flex", flex[mod]))
                    times = time_cupy_interleaved([fn for _, fn in calls], args.warmup, args.iters)
                    name = f"hd{d} {'causal ' if causal else ''}density {density} {mod}"
                    for (impl, _), ms in zip(calls, times):
                        tflops = flops / (ms * 1e-3) / 1e12
                        rows.append({"name": name, "impl": impl, "ms": ms, "tflops": tflops})
                        print(f"{name:<36} {impl:<18} {ms:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)
                    base = dict(zip([c for c, _ in calls], times))
                    print(f"{name:<36} {'ratios':<18} mod/no mod {base['block mask'] / base['block mask + mod']:.3f}"
                          + (f"  vs dense+mod {base['dense + mod'] / base['block mask + mod']:.3f}"
                             if "dense + mod" in base else "")
                          + (f"  vs flex {base['flex'] / base['block mask + mod']:.3f}" if "flex" in base else ""),
                          flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cupy": cupy.__version__,
              "seqlen": s, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def flex_calls(tv, shape: BenchShape, mask, slopes_t) -> dict[str, Callable[[int], Any]]:
    """flex_attention (torch.compile'd) with the same kept blocks (and causal) and each score_mod, by modification
    name; {} where flex is unavailable (the error printed)."""
    try:
        import torch
        flex = compiled_flex()
        block_mask = flex_block_mask(shape, mask)

        def softcap(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)

        def alibi(score, b, h, q_idx, kv_idx):   # square calls: the diagonal at q_idx == kv_idx
            return score - slopes_t[h] * (q_idx - kv_idx).abs()

        def call(score_mod):
            return lambda i: flex(*tv[i % ROTATE], score_mod=score_mod, block_mask=block_mask)
        out = {"softcap": call(softcap), "alibi": call(alibi)}
        for fn in out.values():
            fn(0)   # compile outside the timing
        return out
    except Exception as e:  # noqa: BLE001 - flex is a baseline: report and go on without it
        print(f"flex_attention failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return {}


if __name__ == "__main__":
    main()
