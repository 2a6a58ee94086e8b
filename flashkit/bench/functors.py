"""Drop-in functors timed against the built-in modifications and flex_attention in one run
(python3 -m flashkit.bench.functors; flashkit bench --functors).

relative_bias (a drop-in ALiBi) against the built-in alibi_slopes on the same kernel, and against flex_attention with
the same score_mod (compiled); document and prefix_lm masks against flex with the same mask_mod (its block mask
built once, outside the timing; flashkit classifies its tiles inside every call). TFLOP/s count every (query, key)
pair of the dense problem (halved when causal), so that the rows compare times. The first call of a new functor
(a fresh cubin cache: NVRTC compile, load, launch) and the next call are timed on the host.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable

from .mods import ROTATE, rotated_inputs, shape_parser
from .timing import time_cupy
from .torch_baselines import time_torch

DOCUMENTS = 8   # the document mask's packed sequences per row


def main(argv: list[str] | None = None) -> dict:
    args = shape_parser(__doc__).parse_args(argv)

    import cupy
    import torch

    import flashkit
    b, s, h, d = args.batch, args.seqlen, args.heads, args.head_dim
    rows: list[dict[str, Any]] = []
    compile_rows = time_first_calls(b, min(s, 1024), h, d)
    views, cviews = rotated_inputs(b, s, h, d)
    tv = [tuple(t.transpose(1, 2) for t in v) for v in views]
    slopes_t = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)], device="cuda", dtype=torch.float32)
    slopes = cupy.from_dlpack(slopes_t)
    doc_t = (torch.arange(s, device="cuda", dtype=torch.int32) * DOCUMENTS // s)[None].repeat(b, 1).contiguous()
    doc = cupy.from_dlpack(doc_t)
    prefix = s // 4

    def record(name: str, impl: str, ms: float, causal: bool) -> None:
        tflops = 4 * b * h * d * s * s / (2 if causal else 1) / (ms * 1e-3) / 1e12
        rows.append({"name": name, "impl": impl, "ms": ms, "tflops": tflops})
        print(f"{name:<40} {impl:<22} {ms:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)

    def fk(**kw) -> Callable[[int], Any]:
        return lambda i: flashkit.attention(*cviews[i % ROTATE], **kw)

    def t(fn) -> float:
        return time_cupy(fn, args.warmup, args.iters)

    for causal in (False, True):
        tag = "causal " if causal else ""
        for variant in ("fa3", "causal" if causal else "fa2"):
            record(f"{tag}alibi", f"built-in {variant}", t(fk(causal=causal, alibi_slopes=slopes, variant=variant)),
                   causal)
            record(f"{tag}alibi", f"relative_bias {variant}",
                   t(fk(causal=causal, mod="relative_bias", mod_args={"slopes": slopes}, variant=variant)), causal)
        record(f"{tag}plain", "flashkit", t(fk(causal=causal)), causal)
    record("causal document", "flashkit", t(fk(causal=True, mod="document", mod_args={"doc_ids": doc})), True)
    for name, kw in (("causal document", dict(causal=True, mod="document", mod_args={"doc_ids": doc})),
                     ("causal relative_bias", dict(causal=True, mod="relative_bias", mod_args={"slopes": slopes})),
                     ("causal alibi", dict(causal=True, alibi_slopes=slopes)), ("causal plain", dict(causal=True))):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for i in range(args.iters):
            fk(**kw)(i)
        host = (time.perf_counter() - t0) / args.iters   # enqueue time per call (the GPU runs behind)
        rows.append({"name": name, "impl": "host per call", "ms": host * 1e3, "tflops": None})
        print(f"{name:<40} {'host per call':<22} {host * 1e3:8.3f} ms", flush=True)
        cupy.cuda.runtime.deviceSynchronize()
    record("prefix_lm", "flashkit", t(fk(mod="prefix_lm", mod_args={"prefix": prefix})), True)
    if not args.no_flex:
        flex_rows(rows, tv, slopes_t, doc_t, prefix, s, args, record)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cupy": cupy.__version__,
              "shape": {"batch": b, "seqlen": s, "heads": h, "head_dim": d}, "rows": rows, "first_calls": compile_rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def flex_rows(rows, tv, slopes_t, doc_t, prefix, s, args, record) -> None:
    """flex_attention (torch.compile'd) with the same modifications, block masks built once."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        import torch
        flex = torch.compile(flex_attention, dynamic=False)

        def alibi(score, bb, hh, q_idx, kv_idx):
            return score - slopes_t[hh] * (q_idx - kv_idx).abs()

        def causal_mask(bb, hh, q_idx, kv_idx):
            return kv_idx <= q_idx

        def document(bb, hh, q_idx, kv_idx):
            return (doc_t[bb, q_idx] == doc_t[bb, kv_idx]) & (kv_idx <= q_idx)

        def prefix_lm(bb, hh, q_idx, kv_idx):
            return (kv_idx < prefix) | (kv_idx <= q_idx)
        bm_causal = create_block_mask(causal_mask, B=None, H=None, Q_LEN=s, KV_LEN=s, device="cuda")
        bm_doc = create_block_mask(document, B=doc_t.shape[0], H=None, Q_LEN=s, KV_LEN=s, device="cuda")
        bm_prefix = create_block_mask(prefix_lm, B=None, H=None, Q_LEN=s, KV_LEN=s, device="cuda")
        tt = (lambda fn: time_torch(fn, args.warmup, args.iters))  # noqa: E731
        record("alibi", "flex", tt(lambda i: flex(*tv[i % ROTATE], score_mod=alibi)), False)
        record("causal alibi", "flex", tt(lambda i: flex(*tv[i % ROTATE], score_mod=alibi, block_mask=bm_causal)),
               True)
        record("causal document", "flex", tt(lambda i: flex(*tv[i % ROTATE], block_mask=bm_doc)), True)
        record("prefix_lm", "flex", tt(lambda i: flex(*tv[i % ROTATE], block_mask=bm_prefix)), True)
    except Exception as e:   # flex needs a working torch.compile; say so and go on
        print(f"flex_attention failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


def time_first_calls(b: int, s: int, h: int, d: int) -> list[dict]:
    """Host seconds of a functor's first call in a fresh cubin cache (compile included) and of its second call,
    beside the plain kernel's first call in the same fresh cache."""
    import cupy

    import flashkit
    from flashkit.runtime.build import clear_loaded
    q, k, v = (cupy.random.standard_normal((b, s, h, d), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    slopes = cupy.full((h,), 0.1, dtype=cupy.float32)
    out = []
    old = os.environ.get("FLASHKIT_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FLASHKIT_CACHE_DIR"] = tmp
        clear_loaded()
        try:
            for name, kw in (("plain", {}), ("relative_bias", {"mod": "relative_bias", "mod_args": {"slopes": slopes}}),
                             ("prefix_lm", {"mod": "prefix_lm", "mod_args": {"prefix": 7}})):
                times = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    flashkit.attention(q, k, v, causal=True, **kw)
                    cupy.cuda.runtime.deviceSynchronize()
                    times.append(time.perf_counter() - t0)
                out.append({"name": name, "first_s": times[0], "second_s": times[1]})
                print(f"first call {name:<16} {times[0]:.3f} s (compile + load + run); second {times[1] * 1e3:.2f} ms",
                      flush=True)
        finally:
            if old is None:
                os.environ.pop("FLASHKIT_CACHE_DIR", None)
            else:
                os.environ["FLASHKIT_CACHE_DIR"] = old
            clear_loaded()
    return out


if __name__ == "__main__":
    main()
