"""The built-in modifications timed against dense flashkit and PyTorch in one run (python3 -m flashkit.bench.mods).

Each modification is timed interleaved call by call with the dense causal call on the same kernel family (and, for a
window, with PyTorch's), so that its ratio to dense holds under one clock: at the GPU's power limit each kernel timed
alone runs at a clock of its own (a modified build draws less power and clocks higher; timed alone, the dense hd128
causal call also read 665 TFLOP/s in one run against 572 in a sweep; docs/design-notes.md). Sliding window: flashkit never visits tiles outside the
window, PyTorch's SDPA takes an explicit boolean mask (all tiles computed), flex_attention a compiled block mask.
TFLOP/s count the visible (query, key) pairs only: 4 * B * H * D * pairs, and `vs dense` is the row's TFLOP/s over
the dense causal call's in the same comparison (issue 14's target: at least 0.9). Benchmark convention: bf16, CUDA
events, warm-up, median, inputs rotated past the L2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from .timing import time_cupy_interleaved
from .torch_baselines import compiled_flex

ROTATE = 3   # copies of the inputs: 3 x 192 MiB at the default shape, far past a 50 MB L2


def visible_pairs(seqlen: int, left: int, causal: bool = True) -> int:
    """Visible (query, key) pairs of a square window (left, 0) (left < 0: plain causal)."""
    if left < 0:
        return seqlen * (seqlen + 1) // 2
    return sum(min(i, left) + 1 for i in range(seqlen))


def shape_parser(doc: str) -> argparse.ArgumentParser:
    """The options every modification benchmark takes: the shape, timing, flex on or off, a JSON file."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    return ap


def rotated_inputs(b: int, s: int, h: int, d: int):
    """ROTATE sets of bf16 (q, k, v), (batch, seqlen, heads, D): as torch tensors and as CuPy views of them."""
    import cupy
    import torch
    gen = torch.Generator(device="cuda").manual_seed(0)
    views = [tuple(torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
             for _ in range(ROTATE)]
    return views, [tuple(cupy.from_dlpack(t) for t in v) for v in views]


def main(argv: list[str] | None = None) -> dict:
    ap = shape_parser(__doc__)
    ap.add_argument("--windows", default="1024,4096")
    args = ap.parse_args(argv)

    import cupy
    import torch
    import torch.nn.functional as F

    import flashkit
    b, s, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    views, cviews = rotated_inputs(b, s, h, d)
    slopes = cupy.asarray([2.0 ** (-8 * (i + 1) / h) for i in range(h)], dtype=cupy.float32)
    rows: list[dict[str, Any]] = []

    def record(name: str, ms: float, pairs: int, impl: str, dense_rate: float | None) -> float:
        tflops = 4 * b * h * d * pairs / (ms * 1e-3) / 1e12
        row = {"name": name, "impl": impl, "ms": ms, "tflops": tflops}
        if dense_rate:
            row["vs_dense"] = tflops / dense_rate
        rows.append(row)
        ratio = f"  {row['vs_dense']:.3f}x dense" if dense_rate else ""
        print(f"{name:<44} {impl:<10} {ms:8.3f} ms {tflops:7.1f} TFLOP/s{ratio}", flush=True)
        return tflops

    def fk(**kw) -> Callable[[int], Any]:
        return lambda i: flashkit.attention(*cviews[i % ROTATE], **kw)

    def compare(calls: list[tuple[str, str, Callable[[int], Any] | None, int]]) -> None:
        """One comparison, its calls interleaved call by call; the first is the dense causal call the others are
        rated against (a None call, flex unavailable, is left out)."""
        present = [c for c in calls if c[2] is not None]
        times = time_cupy_interleaved([fn for _, _, fn, _ in present], args.warmup, args.iters)
        (name, impl, _, pairs), ms = present[0], times[0]
        dense_rate = record(name, ms, pairs, impl, None)
        for (name, impl, _, pairs), ms in zip(present[1:], times[1:]):
            record(name, ms, pairs, impl, dense_rate)

    full = visible_pairs(s, -1)
    tv = [tuple(t.transpose(1, 2) for t in v) for v in views]   # (b, h, s, d) views for PyTorch
    dense = ("causal (dense, best kernel)", "flashkit", fk(causal=True), full)
    compare([dense, ("causal (dense)", "sdpa",
                     lambda i: F.scaled_dot_product_attention(*tv[i % ROTATE], is_causal=True), full)])
    compare([("causal (dense, FA2 family)", "flashkit", fk(causal=True, variant="causal"), full),
             ("causal softcap=30, FA2 family", "flashkit", fk(causal=True, softcap=30.0, variant="fa2"), full),
             ("causal alibi, FA2 family", "flashkit", fk(causal=True, alibi_slopes=slopes, variant="fa2"), full)])
    compare([dense,
             ("causal softcap=30", "flashkit", fk(causal=True, softcap=30.0), full),
             ("causal alibi", "flashkit", fk(causal=True, alibi_slopes=slopes), full),
             ("causal softcap+alibi", "flashkit", fk(causal=True, softcap=30.0, alibi_slopes=slopes), full)])
    for left in (int(w) for w in args.windows.split(",")):
        pairs = visible_pairs(s, left)
        name = f"window ({left}, 0)"
        i_idx = torch.arange(s, device="cuda")[:, None]
        j_idx = torch.arange(s, device="cuda")[None, :]
        mask = (j_idx <= i_idx) & (j_idx >= i_idx - left)
        flex = None
        if not args.no_flex:
            try:
                from torch.nn.attention.flex_attention import create_block_mask

                def sliding(bb, hh, q_idx, kv_idx, left=left):
                    return (kv_idx <= q_idx) & (kv_idx >= q_idx - left)
                bm = create_block_mask(sliding, B=None, H=None, Q_LEN=s, KV_LEN=s, device="cuda")
                flex = (lambda i, bm=bm: compiled_flex()(*tv[i % ROTATE], block_mask=bm))
                flex(0)
            except Exception as e:   # flex needs a working torch.compile; say so and go on
                print(f"flex_attention failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                flex = None
        compare([dense,
                 (name, "flashkit", fk(causal=True, window_size=(left, 0)), pairs),
                 (name + " non-causal call", "flashkit", fk(window_size=(left, 0)), pairs),
                 (name, "sdpa+mask", lambda i, mask=mask: F.scaled_dot_product_attention(*tv[i % ROTATE],
                                                                                        attn_mask=mask), pairs),
                 (name, "flex", flex, pairs)])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cupy": cupy.__version__,
              "shape": {"batch": b, "seqlen": s, "heads": h, "head_dim": d}, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
