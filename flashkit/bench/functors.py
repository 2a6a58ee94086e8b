"""Drop-in functors timed against the built-in modifications and flex_attention in one run
(python3 -m flashkit.bench.functors; flashkit bench --functors). Each comparison (built-in, drop-in, flex) is timed
interleaved call by call, so that its ratios hold under one clock.

relative_bias (a drop-in ALiBi) against the built-in alibi_slopes on the same kernel, and against flex_attention with
the same score_mod (compiled); document and prefix_lm masks against flex with the same mask_mod (its block mask
built once, outside the timing; flashkit classifies its tiles inside every call by name, once with a
flashkit.ModMask), and the document mask's backward (attention_backward over its lists, by name and with the
ModMask) against the dense causal backward and flex's; relative_bias's backward (a bias) against the
built-in ALiBi's and flex's, causal and not. TFLOP/s count every (query, key)
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
from .timing import time_cupy_interleaved

DOCUMENTS = 8   # the document mask's packed sequences per row
BACKWARD_FLOPS = 2.5   # a backward's products over a forward's


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

    def record(name: str, impl: str, ms: float, causal: bool, flop_factor: float = 1.0) -> None:
        tflops = flop_factor * 4 * b * h * d * s * s / (2 if causal else 1) / (ms * 1e-3) / 1e12
        rows.append({"name": name, "impl": impl, "ms": ms, "tflops": tflops})
        print(f"{name:<40} {impl:<22} {ms:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)

    def fk(**kw) -> Callable[[int], Any]:
        return lambda i: flashkit.attention(*cviews[i % ROTATE], **kw)

    def interleaved(name: str, causal: bool, calls: list[tuple[str, Callable[[int], Any] | None]],
                    flop_factor: float = 1.0) -> None:
        """Time the calls of one comparison interleaved call by call (the same clocks for all: their ratios are
        what the rows are for); a None call (flex unavailable) is left out."""
        present = [(impl, fn) for impl, fn in calls if fn is not None]
        for (impl, _), ms in zip(present, time_cupy_interleaved([fn for _, fn in present], args.warmup, args.iters)):
            record(name, impl, ms, causal, flop_factor)

    flex = {} if args.no_flex else flex_calls(tv, slopes_t, doc_t, prefix, s)
    for causal in (False, True):
        tag = "causal " if causal else ""
        for variant in ("fa3", "causal" if causal else "fa2"):
            interleaved(f"{tag}alibi", causal, [
                (f"built-in {variant}", fk(causal=causal, alibi_slopes=slopes, variant=variant)),
                (f"relative_bias {variant}", fk(causal=causal, mod="relative_bias", mod_args={"slopes": slopes},
                                                variant=variant)),
                ("flex", flex.get(f"{tag}alibi") if variant == "fa3" else None)])
        interleaved(f"{tag}plain", causal, [("flashkit", fk(causal=causal))])
    doc_mask = flashkit.ModMask("document", {"doc_ids": doc})   # classified once, as flex's block mask is built
    interleaved("causal document", True, [("flashkit", fk(causal=True, mod="document", mod_args={"doc_ids": doc})),
                                          ("flashkit ModMask", fk(causal=True, mod=doc_mask)),
                                          ("flex", flex.get("causal document"))])
    interleaved("prefix_lm", True, [("flashkit", fk(mod="prefix_lm", mod_args={"prefix": prefix})),
                                    ("flex", flex.get("prefix_lm"))])
    # The backward over the document mask's lists (classified in every call) against the dense causal backward
    # and flex_attention's backward with the same block mask; FLOPs 2.5 x the forward's.
    doc_kw = dict(causal=True, mod="document", mod_args={"doc_ids": doc})
    q0, k0, v0 = cviews[0]
    dout = cupy.from_dlpack(torch.randn_like(views[0][0]))
    out_doc, lse_doc = flashkit.attention(q0, k0, v0, return_lse=True, **doc_kw)
    out_c, lse_c = flashkit.attention(q0, k0, v0, causal=True, return_lse=True)
    interleaved("causal document backward", True, [
        ("flashkit", lambda i: flashkit.attention_backward(dout, q0, k0, v0, out_doc, lse_doc, **doc_kw)),
        ("flashkit ModMask", lambda i: flashkit.attention_backward(dout, q0, k0, v0, out_doc, lse_doc, causal=True,
                                                                   mod=doc_mask)),
        ("flashkit causal, no mask", lambda i: flashkit.attention_backward(dout, q0, k0, v0, out_c, lse_c,
                                                                           causal=True)),
        ("flex", flex.get("causal document backward"))], flop_factor=BACKWARD_FLOPS)
    # A score_mod's backward (relative_bias, a bias: slope 1) against the built-in ALiBi's and flex's.
    for causal in (False, True):
        tag = "causal " if causal else ""
        rb_kw = dict(causal=causal, mod="relative_bias", mod_args={"slopes": slopes})
        alibi_kw = dict(causal=causal, alibi_slopes=slopes)
        out_rb, lse_rb = flashkit.attention(q0, k0, v0, return_lse=True, **rb_kw)
        out_al, lse_al = flashkit.attention(q0, k0, v0, return_lse=True, **alibi_kw)
        interleaved(f"{tag}alibi backward", causal, [
            ("relative_bias", lambda i, o=out_rb, lse=lse_rb, kw=rb_kw: flashkit.attention_backward(
                dout, q0, k0, v0, o, lse, **kw)),
            ("built-in", lambda i, o=out_al, lse=lse_al, kw=alibi_kw: flashkit.attention_backward(
                dout, q0, k0, v0, o, lse, **kw)),
            ("flex", flex.get(f"{tag}alibi backward"))], flop_factor=BACKWARD_FLOPS)
    for name, kw in (("causal document", dict(causal=True, mod="document", mod_args={"doc_ids": doc})),
                     ("causal document ModMask", dict(causal=True, mod=doc_mask)),
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
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cupy": cupy.__version__,
              "shape": {"batch": b, "seqlen": s, "heads": h, "head_dim": d}, "rows": rows, "first_calls": compile_rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def flex_calls(tv, slopes_t, doc_t, prefix, s) -> dict[str, Callable[[int], Any]]:
    """flex_attention (torch.compile'd) with the same modifications, by row name, block masks built once; {} (and
    the reason printed) where flex or torch.compile does not work here."""
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
        calls = {"alibi": lambda i: flex(*tv[i % ROTATE], score_mod=alibi),
                 "causal alibi": lambda i: flex(*tv[i % ROTATE], score_mod=alibi, block_mask=bm_causal),
                 "causal document": lambda i: flex(*tv[i % ROTATE], block_mask=bm_doc),
                 "prefix_lm": lambda i: flex(*tv[i % ROTATE], block_mask=bm_prefix)}
        # the backward alone: the graph of one forward kept, its gradients taken again per call
        leaves = tuple(t.detach().requires_grad_() for t in tv[0])
        out = flex(*leaves, block_mask=bm_doc)
        grad_out = torch.randn_like(out)
        calls["causal document backward"] = lambda i: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)
        out_alibi = flex(*leaves, score_mod=alibi, block_mask=bm_causal)
        calls["causal alibi backward"] = lambda i: torch.autograd.grad(out_alibi, leaves, grad_out, retain_graph=True)
        out_alibi_full = flex(*leaves, score_mod=alibi)
        calls["alibi backward"] = lambda i: torch.autograd.grad(out_alibi_full, leaves, grad_out, retain_graph=True)
        for fn in calls.values():   # compiled here, not inside a timed warm-up
            fn(0)
        torch.cuda.synchronize()
        return calls
    except Exception as e:   # flex needs a working torch.compile; say so and go on
        print(f"flex_attention failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return {}


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
