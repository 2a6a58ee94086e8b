"""Running the sweep: flashkit's kernels and the PyTorch baselines on each shape, with CUDA events, in one run.

Features take part through hooks their bench modules register (the core imports none of them):
a mask hook turns a shape into (mask, FLOPs of the kept blocks), a call hook turns a variant into
the call to time (fp8 variants on pre-quantized inputs).
"""

from __future__ import annotations

import datetime
import platform
from dataclasses import asdict
from typing import Any, Callable, Sequence

from . import torch_baselines
from .config import (BenchConfig, BenchResult, BenchRow, BenchShape, Progress, attention_flops, convention_shapes,
                     device_l2_bytes, mark_unavailable, rotation_copies, tflops, time_row)
from .timing import CupyPeak, time_cupy, time_cupy_interleaved

# (shape, config) -> (mask, FLOPs) when the feature shapes this run, else None
MaskHook = Callable[[BenchShape, BenchConfig], "tuple[Any, float] | None"]
# (variant, shape, inputs) -> the call to time, call(i) on rotated input set i, when the feature owns the variant
CallHook = Callable[[str | None, BenchShape, list], "Callable[[int], Any] | None"]
_MASK_HOOKS: list[MaskHook] = []
_CALL_HOOKS: list[CallHook] = []


def register_mask(hook: MaskHook) -> None:
    """Let a feature give a shape its mask and FLOP count (the first hook that answers wins)."""
    _MASK_HOOKS.append(hook)


def register_call(hook: CallHook) -> None:
    """Let a feature time its variants its own way (the first hook that answers wins)."""
    _CALL_HOOKS.append(hook)


def _l2_bytes(config: BenchConfig) -> int:
    return config.l2_bytes or device_l2_bytes()


def make_inputs(shape: BenchShape, dtype: str, copies: int, seed: int) -> list[tuple[Any, Any, Any]]:
    """`copies` independent (q, k, v) sets of standard normals, (batch, seqlen, heads, head_dim)."""
    import cupy
    from ..call.dtypes import dtype_by_name
    storage = dtype_by_name(dtype).storage
    rng = cupy.random.default_rng(seed)
    dims = (shape.batch, shape.seqlen, shape.heads, shape.head_dim)
    return [tuple(rng.standard_normal(dims, dtype=cupy.float32).astype(storage) for _ in range(3))
            for _ in range(copies)]


def _free_pools() -> None:
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch
        torch.cuda.empty_cache()
    except Exception:
        pass


def prepare_flashkit(shape: BenchShape, inputs, variant: str | None, config: BenchConfig, flops: float,
                     mask: Any = None) -> tuple[BenchRow, Callable[[int], Any] | None]:
    """The row of flashkit.attention on the rotated inputs and the call to time (its first call made, its peak
    memory measured); an exception records the row as unavailable, with no call."""
    from ..api import attention
    row = BenchRow(flashkit_label(shape, variant, mask is not None, config.dtype), shape.batch, shape.seqlen, shape.heads,
                   shape.head_dim, shape.causal, config.dtype, flops,
                   density=mask.density if mask is not None else None)

    def call(i: int):
        q, k, v = inputs[i % len(inputs)]
        return attention(q, k, v, causal=shape.causal, variant=variant, block_mask=mask)

    try:
        call = next((c for c in (hook(variant, shape, inputs) for hook in _CALL_HOOKS) if c is not None), call)
        call(0)
        import cupy
        cupy.cuda.runtime.deviceSynchronize()
        with CupyPeak() as peak:
            call(1)
            cupy.cuda.runtime.deviceSynchronize()
        row.peak_bytes = peak.extra
        return row, call
    except Exception as exc:   # unsupported shape, compile failure, out of memory: a row, not a crash
        mark_unavailable(row, exc)
        return row, None


def bench_flashkit(shape: BenchShape, inputs, variant: str | None, config: BenchConfig, flops: float,
                   mask: Any = None) -> BenchRow:
    """Time flashkit.attention on the rotated inputs; an exception records the row as unavailable."""
    return time_row(*prepare_flashkit(shape, inputs, variant, config, flops, mask), config, time_cupy)


def time_together(prepared: list[tuple[BenchRow, Callable[[int], Any] | None]], config: BenchConfig,
                  timer: Callable[[list, int, int], list[float]] = time_cupy_interleaved) -> list[BenchRow]:
    """Every prepared call of one shape timed interleaved call by call (BenchConfig.interleave), so that their
    ratios hold under one clock; torch's calls run on the legacy default stream that CuPy's events time."""
    timed = [(row, call) for row, call in prepared if call is not None]
    if timed:
        try:
            for (row, _), ms in zip(timed, timer([c for _, c in timed], config.warmup, config.iters)):
                row.ms, row.tflops = ms, tflops(row.flops, ms)
        except Exception as exc:   # one call failing mid-run fails the comparison: every row says why
            for row, _ in timed:
                mark_unavailable(row, exc)
    return [row for row, _ in prepared]


def flashkit_label(shape: BenchShape, variant: str | None, block_sparse: bool, dtype: str = "bfloat16") -> str:
    """'flashkit:<variant>'; for automatic selection, the variant it picks here ('flashkit:auto' if unknown)."""
    if variant:
        return f"flashkit:{variant}"
    try:
        from ..api import explain
        from ..runtime.device import device_info
        sel = explain(dtype=dtype, head_dim=shape.head_dim, seqlen_q=shape.seqlen, heads=shape.heads,
                      batch=shape.batch, causal=shape.causal, block_sparse=block_sparse, cc=device_info().cc)
        return f"flashkit:{sel.chosen.name}" if sel.chosen else "flashkit:auto"
    except Exception:
        return "flashkit:auto"


def run_benchmark(config: BenchConfig | None = None, progress: Progress | None = None,
                  shapes: Sequence[BenchShape] | None = None) -> BenchResult:
    """Every kernel of the config on every shape of the sweep (or `shapes`), in one process."""
    config = config or BenchConfig()
    say = progress or (lambda msg: None)
    if shapes is None:
        causal = (False,) if config.densities else config.causal
        shapes = convention_shapes(config.seqlens, config.head_dims, causal, config.tokens, config.hidden)
    torch_ok, torch_reason = torch_baselines.available()
    if not torch_ok:
        say(f"torch baselines skipped: {torch_reason}")
    l2 = _l2_bytes(config)
    rows: list[BenchRow] = []
    for shape in shapes:
        itemsize = 4 if config.dtype == "float32" else 2
        set_bytes = 3 * shape.batch * shape.seqlen * shape.heads * shape.head_dim * itemsize
        try:
            inputs = make_inputs(shape, config.dtype, rotation_copies(set_bytes, l2), config.seed)
        except Exception as exc:
            say(f"{shape.label}: inputs failed ({type(exc).__name__}: {exc})")
            continue
        for density in (config.densities or (None,)):
            rows.extend(_bench_one(BenchShape(shape.batch, shape.seqlen, shape.heads, shape.head_dim,
                                              shape.causal, density), inputs, config, torch_ok, say))
        del inputs
        _free_pools()
    return BenchResult(rows, environment(config))


def _bench_one(shape: BenchShape, inputs, config: BenchConfig, torch_ok: bool, say: Progress) -> list[BenchRow]:
    masked = next((m for m in (hook(shape, config) for hook in _MASK_HOOKS) if m is not None), None)
    mask, flops = masked or (None, attention_flops(shape.batch, shape.heads, shape.seqlen, shape.seqlen,
                                                   shape.head_dim, shape.causal))
    if config.interleave:
        prepared = [prepare_flashkit(shape, inputs, variant, config, flops, mask) for variant in config.variants]
        prepared += [torch_baselines.prepare_backend(backend, shape, inputs, config, flops, mask)
                     for backend in _torch_backends(config, mask, torch_ok)]
        out = time_together(prepared, config)
        for row in out:
            _report(row, shape, say)
        _free_pools()
        return out
    out = []
    for variant in config.variants:
        out.append(bench_flashkit(shape, inputs, variant, config, flops, mask))
        _report(out[-1], shape, say)
        _free_pools()
    for backend in _torch_backends(config, mask, torch_ok):
        out.append(torch_baselines.bench_backend(backend, shape, inputs, config, flops, mask))
        _report(out[-1], shape, say)
        _free_pools()
    return out


def _torch_backends(config: BenchConfig, mask: Any, torch_ok: bool) -> tuple[str, ...]:
    """The PyTorch baselines of a shape: flex alone beside a block mask, else the configured SDPA backends."""
    if not torch_ok:
        return ()
    return tuple(config.torch_backends) if mask is None else tuple(b for b in ("flex",) if b in config.torch_backends)


def _report(row: BenchRow, shape: BenchShape, say: Progress) -> None:
    if row.available:
        say(f"{shape.label} {row.kernel}: {row.ms:.3f} ms, {row.tflops:.1f} TFLOP/s")
    else:
        say(f"{shape.label} {row.kernel}: unavailable ({row.reason})")


def environment(config: BenchConfig | None = None) -> dict[str, Any]:
    """Date, GPU and library versions for BENCHMARKS.md (best effort; fields missing where unknown)."""
    meta: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "python": platform.python_version()}
    try:
        import cupy
        meta["cupy"] = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        meta["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        meta["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:
        pass
    try:
        import torch
        meta["torch"] = torch.__version__
    except Exception:
        pass
    if config is not None:
        meta["config"] = {k: (list(v) if isinstance(v, (tuple, list)) else v) for k, v in asdict(config).items()}
    return meta
