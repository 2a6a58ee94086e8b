"""PyTorch baselines of the benchmark: SDPA with each backend, and flex_attention (compiled).

Inputs are the benchmark's own CuPy arrays, seen zero-copy through DLPack as (B, H, S, D) views.
Every failure (backend unsupported for the shape, compile error, out of memory) becomes an unavailable row.
"""

from __future__ import annotations

from typing import Any, Callable

from .config import BenchConfig, BenchRow, BenchShape, mark_unavailable, time_row
from .timing import time_cuda

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}

_compiled_flex: Any = None


def available() -> tuple[bool, str]:
    """(True, '') when torch imports and sees a CUDA device, else (False, why)."""
    try:
        import torch
    except Exception as exc:
        return False, f"torch not importable ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, ""


def torch_views(inputs) -> list[tuple[Any, Any, Any]]:
    """(batch, seqlen, heads, D) CuPy arrays -> (batch, heads, seqlen, D) torch views, no copy."""
    import torch
    return [tuple(torch.from_dlpack(x).transpose(1, 2) for x in qkv) for qkv in inputs]


def time_torch(fn: Callable[[int], Any], warmup: int, iters: int) -> float:
    import torch
    return time_cuda(fn, warmup, iters, lambda: torch.cuda.Event(enable_timing=True),
                     lambda a, b: a.elapsed_time(b), torch.cuda.synchronize)


def torch_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes torch's allocator hands out during fn(), beyond what it held before."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return int(torch.cuda.max_memory_allocated() - base)


def sdpa_call(backend: str, causal: bool, views) -> Callable[[int], Any]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kernel = getattr(SDPBackend, SDPA_BACKENDS[backend])

    def call(i: int):
        q, k, v = views[i % len(views)]
        kwargs = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kwargs)
    return call


def cudnn_and_flashkit_ms(sets, causal: bool, warmup: int, iters: int, **kw) -> tuple[float, float]:
    """Median milliseconds of cuDNN SDPA and of flashkit.attention(q, k, v, causal=causal, **kw) on the rotated
    (batch, seqlen, heads, D) CuPy input sets, timed interleaved call by call (timing.time_cupy_interleaved)."""
    from ..api import attention
    from .timing import time_cupy_interleaved

    def flashkit_call(i: int):
        return attention(*sets[i % len(sets)], causal=causal, **kw)
    cudnn_ms, flashkit_ms = time_cupy_interleaved([sdpa_call("cudnn", causal, torch_views(sets)), flashkit_call],
                                                  warmup, iters)
    return cudnn_ms, flashkit_ms


def time_sdpa(backend: str, q, k, v, causal: bool, warmup: int, iters: int) -> float:
    """Milliseconds of PyTorch SDPA's `backend` (an SDPA_BACKENDS name) on (batch, seqlen, heads, D) CuPy arrays;
    raises where the backend refuses the shape."""
    return time_torch(sdpa_call(backend, causal, torch_views([(q, k, v)])), warmup, iters)


def compiled_flex():
    """flex_attention through torch.compile, compiled once per process."""
    global _compiled_flex
    if _compiled_flex is None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_block_mask(shape: BenchShape, mask: Any = None):
    """flex_attention's BlockMask: the same kept blocks as a flashkit BlockMask (and causal, for a causal shape),
    the causal mask, or None."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    s = shape.seqlen
    if mask is not None:
        import cupy
        blocks = torch.as_tensor(cupy.asnumpy(mask.dense_blocks()), device="cuda")
        mb, mh = int(blocks.shape[0]), int(blocks.shape[1])
        bq, bk = mask.block

        def kept(b, h, q_idx, kv_idx):
            inside = blocks[b % mb, h % mh, q_idx // bq, kv_idx // bk]
            return inside & (q_idx >= kv_idx) if shape.causal else inside
        return create_block_mask(kept, B=mb if mb > 1 else None, H=mh if mh > 1 else None, Q_LEN=s, KV_LEN=s,
                                 device="cuda", BLOCK_SIZE=(bq, bk))
    if shape.causal:
        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
        return create_block_mask(causal, B=None, H=None, Q_LEN=s, KV_LEN=s, device="cuda")
    return None


def _flex_call(shape: BenchShape, views, mask: Any) -> Callable[[int], Any]:
    flex = compiled_flex()
    block_mask = flex_block_mask(shape, mask)

    def call(i: int):
        q, k, v = views[i % len(views)]
        kwargs = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        return flex(q, k, v, block_mask=block_mask, **kwargs)
    return call


def prepare_backend(backend: str, shape: BenchShape, inputs, config: BenchConfig, flops: float,
                    mask: Any = None) -> tuple[BenchRow, Callable[[int], Any] | None]:
    """The row of one torch backend ('flash', 'cudnn', 'efficient', 'flex') on the benchmark's inputs and the call
    to time (its first call made: flex compiled, a refused shape raised; its peak memory measured), or no call
    and the row unavailable."""
    row = BenchRow(f"torch:{backend}", shape.batch, shape.seqlen, shape.heads, shape.head_dim, shape.causal,
                   config.dtype, flops, density=mask.density if mask is not None else None)
    try:
        if backend not in SDPA_BACKENDS and backend != "flex":
            raise ValueError(f"unknown torch backend {backend!r}; expected one of "
                             f"{', '.join([*SDPA_BACKENDS, 'flex'])}")
        if mask is not None and backend != "flex":
            raise ValueError("block-sparse masks run only with flex")
        views = torch_views(inputs)
        call = _flex_call(shape, views, mask) if backend == "flex" else sdpa_call(backend, shape.causal, views)
        call(0)   # first call: compiles flex, and raises here when the backend refuses the shape
        row.peak_bytes = torch_peak_bytes(lambda: call(1))
        return row, call
    except Exception as exc:
        mark_unavailable(row, exc)
        return row, None


def bench_backend(backend: str, shape: BenchShape, inputs, config: BenchConfig, flops: float,
                  mask: Any = None) -> BenchRow:
    """Time one torch backend ('flash', 'cudnn', 'efficient', 'flex') on the benchmark's inputs."""
    return time_row(*prepare_backend(backend, shape, inputs, config, flops, mask), config, time_torch)
