"""Benchmarks: flashkit kernels against PyTorch's attention backends, timed with CUDA events, in one run.

Convention (the FlashAttention papers'): batch * seqlen = 16k tokens, hidden 2048 (heads = 2048 / head_dim),
seqlen 512..16k, head dims 64/128/256, bf16. Forward FLOPs = 4 * B * H * Sq * Sk * D, halved when causal;
block-sparse counts only the kept blocks. Inputs rotate among copies whose total exceeds the L2.
"""

from __future__ import annotations

import datetime
import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
TOKENS = 16384
HIDDEN = 2048
L2_BYTES_DEFAULT = 50 * 2**20      # H100 / H200 L2, used when the device does not say
SDPA_BACKENDS = ("flash", "cudnn", "efficient")   # PyTorch's scaled_dot_product_attention backends
TORCH_BACKENDS = SDPA_BACKENDS + ("flex",)         # + flex_attention, the block-sparse baseline

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchShape:
    """One attention problem of the sweep; q, k, v are (batch, seqlen, heads, head_dim)."""

    batch: int
    seqlen: int
    heads: int
    head_dim: int
    causal: bool = False
    density: float | None = None   # block-sparse runs: the requested fraction of kept blocks

    @property
    def label(self) -> str:
        extra = " causal" if self.causal else ""
        extra += f" density={self.density:g}" if self.density is not None else ""
        return f"b{self.batch} s{self.seqlen} h{self.heads} d{self.head_dim}{extra}"


@dataclass
class BenchConfig:
    """What to run: the sweep, the kernels, and how long to time each."""

    seqlens: Sequence[int] = SEQLENS
    head_dims: Sequence[int] = HEAD_DIMS
    causal: Sequence[bool] = (False, True)
    dtype: str = "bfloat16"
    tokens: int = TOKENS
    hidden: int = HIDDEN
    variants: Sequence[str | None] = (None,)      # None: let flashkit select
    torch_backends: Sequence[str] = TORCH_BACKENDS
    densities: Sequence[float] | None = None       # set: block-sparse mode (non-causal, flex as baseline)
    block: int = 128
    warmup: int = 10
    iters: int = 50
    seed: int = 0
    l2_bytes: int | None = None                    # None: the device's L2 size


@dataclass
class BenchRow:
    """One kernel on one shape: median time, throughput and peak extra memory, or why it did not run."""

    kernel: str
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str
    flops: float
    density: float | None = None    # block-sparse: the mask's actual density
    ms: float | None = None
    tflops: float | None = None
    peak_bytes: int | None = None   # device memory the call allocated beyond its inputs
    available: bool = True
    reason: str = ""

    @property
    def shape_key(self) -> tuple:
        return (self.batch, self.seqlen, self.heads, self.head_dim, self.causal, self.density)


@dataclass
class BenchResult:
    rows: list[BenchRow]
    meta: dict[str, Any] = field(default_factory=dict)


# ---- shapes and FLOPs (pure, CPU-testable) -----------------------------------------------------

def convention_shapes(seqlens: Sequence[int] = SEQLENS, head_dims: Sequence[int] = HEAD_DIMS,
                      causal: Sequence[bool] = (False, True), tokens: int = TOKENS,
                      hidden: int = HIDDEN) -> list[BenchShape]:
    """batch = tokens // seqlen (at least 1), heads = hidden // head_dim, for every combination."""
    shapes = []
    for d in head_dims:
        if hidden % d:
            raise ValueError(f"head_dim {d} does not divide hidden {hidden}")
        for c in causal:
            for s in seqlens:
                shapes.append(BenchShape(max(1, tokens // s), s, hidden // d, d, bool(c)))
    return shapes


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool = False) -> float:
    """Forward FLOPs: 4 * B * H * Sq * Sk * D (two GEMMs), halved when causal."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def block_sparse_flops(dense_blocks: Any, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
                       head_dim: int, block_q: int, block_k: int) -> float:
    """Forward FLOPs of the kept blocks only: 4 * D * sum over kept (i, j) of rows_i * keys_j, per (b, h).

    dense_blocks: boolean (B|1, H|1, q_blocks, k_blocks); ragged last blocks count only what exists.
    """
    blocks = np.asarray(dense_blocks.get() if hasattr(dense_blocks, "get") else dense_blocks, dtype=bool)
    qb, kb = blocks.shape[-2:]
    rows = np.minimum(block_q, seqlen_q - np.arange(qb) * block_q).astype(np.float64)
    keys = np.minimum(block_k, seqlen_k - np.arange(kb) * block_k).astype(np.float64)
    per_mask = np.einsum("bhij,i,j->bh", blocks.astype(np.float64), rows, keys)
    per_mask = np.broadcast_to(per_mask, (batch, heads))
    return 4.0 * head_dim * float(per_mask.sum())


def tflops(flops: float, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12


def rotation_copies(bytes_per_set: int, l2_bytes: int) -> int:
    """How many input sets to rotate so that their total exceeds the L2 (two at least)."""
    return max(2, l2_bytes // max(1, bytes_per_set) + 1)


# ---- timing ----------------------------------------------------------------------------------

def time_cuda(fn: Callable[[int], Any], warmup: int, iters: int, event: Callable[[], Any],
              elapsed_ms: Callable[[Any, Any], float], sync: Callable[[], None]) -> float:
    """Median milliseconds of fn(i) (i selects the rotated inputs), one event pair per run."""
    for i in range(warmup):
        fn(i)
    sync()
    pairs = []
    for i in range(iters):
        start, end = event(), event()
        start.record()
        fn(warmup + i)
        end.record()
        pairs.append((start, end))
    sync()
    return float(np.median([elapsed_ms(a, b) for a, b in pairs]))


def time_cupy(fn: Callable[[int], Any], warmup: int, iters: int) -> float:
    import cupy
    return time_cuda(fn, warmup, iters, cupy.cuda.Event, cupy.cuda.get_elapsed_time,
                     cupy.cuda.runtime.deviceSynchronize)


class CupyPeak:
    """Peak bytes the CuPy memory pool hands out while active, beyond what it held at the start."""

    def __enter__(self) -> "CupyPeak":
        import cupy
        self._cupy, self._pool = cupy, cupy.get_default_memory_pool()
        self._base = self.peak = self._pool.used_bytes()
        cupy.cuda.set_allocator(self._malloc)
        return self

    def _malloc(self, size: int):
        mem = self._pool.malloc(size)
        self.peak = max(self.peak, self._pool.used_bytes())
        return mem

    def __exit__(self, *exc) -> None:
        self._cupy.cuda.set_allocator(self._pool.malloc)

    @property
    def extra(self) -> int:
        return self.peak - self._base


# ---- running ---------------------------------------------------------------------------------

def _l2_bytes(config: BenchConfig) -> int:
    if config.l2_bytes:
        return config.l2_bytes
    try:
        import cupy
        return int(cupy.cuda.Device().attributes["L2CacheSize"]) or L2_BYTES_DEFAULT
    except Exception:
        return L2_BYTES_DEFAULT


def make_inputs(shape: BenchShape, dtype: str, copies: int, seed: int) -> list[tuple[Any, Any, Any]]:
    """`copies` independent (q, k, v) sets of standard normals, (batch, seqlen, heads, head_dim)."""
    import cupy
    from .dtypes import dtype_by_name
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


def mark_unavailable(row: BenchRow, exc: BaseException) -> BenchRow:
    """Record why a kernel did not run (first line of the exception) instead of raising."""
    row.available = False
    row.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return row


def bench_flashkit(shape: BenchShape, inputs, variant: str | None, config: BenchConfig, flops: float,
                   mask: Any = None) -> BenchRow:
    """Time flashkit.attention on the rotated inputs; an exception records the row as unavailable."""
    from . import attention
    row = BenchRow(flashkit_label(shape, variant, mask is not None, config.dtype), shape.batch, shape.seqlen, shape.heads,
                   shape.head_dim, shape.causal, config.dtype, flops,
                   density=mask.density if mask is not None else None)

    def call(i: int):
        q, k, v = inputs[i % len(inputs)]
        return attention(q, k, v, causal=shape.causal, variant=variant, block_mask=mask)

    def call_fp8(i: int):   # fp8 variants time the attention on pre-quantized inputs
        (qd, qs), (kd, ks), (vd, vs) = quantized[i % len(quantized)]
        return attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, causal=shape.causal, variant=variant)

    try:
        if is_fp8_variant(variant):
            from .fp8 import quantize_qkv
            quantized = [quantize_qkv(q, k, v) for q, k, v in inputs]
            call = call_fp8
        call(0)
        import cupy
        cupy.cuda.runtime.deviceSynchronize()
        with CupyPeak() as peak:
            call(1)
            cupy.cuda.runtime.deviceSynchronize()
        row.peak_bytes = peak.extra
        row.ms = time_cupy(call, config.warmup, config.iters)
        row.tflops = tflops(flops, row.ms)
    except Exception as exc:   # unsupported shape, compile failure, out of memory: a row, not a crash
        mark_unavailable(row, exc)
    return row


def is_fp8_variant(variant: str | None) -> bool:
    """Whether a variant runs only on fp8 inputs (its manifest requires fp8)."""
    from .registry import discover_kernels
    spec = discover_kernels().specs.get(variant) if variant else None
    return bool(spec and spec.requires.get("fp8"))


def flashkit_label(shape: BenchShape, variant: str | None, block_sparse: bool, dtype: str = "bfloat16") -> str:
    """'flashkit:<variant>'; for automatic selection, the variant it picks here ('flashkit:auto' if unknown)."""
    if variant:
        return f"flashkit:{variant}"
    try:
        from .api import explain
        from .runtime.device import device_info
        sel = explain(dtype=dtype, head_dim=shape.head_dim, seqlen_q=shape.seqlen, heads=shape.heads,
                      batch=shape.batch, causal=shape.causal, block_sparse=block_sparse, cc=device_info().cc)
        return f"flashkit:{sel.chosen.name}" if sel.chosen else "flashkit:auto"
    except Exception:
        return "flashkit:auto"


def run_benchmark(config: BenchConfig | None = None, progress: Progress | None = None,
                  shapes: Sequence[BenchShape] | None = None) -> BenchResult:
    """Every kernel of the config on every shape of the sweep (or `shapes`), in one process."""
    from . import bench_torch
    config = config or BenchConfig()
    say = progress or (lambda msg: None)
    if shapes is None:
        causal = (False,) if config.densities else config.causal
        shapes = convention_shapes(config.seqlens, config.head_dims, causal, config.tokens, config.hidden)
    torch_ok, torch_reason = bench_torch.available()
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
    from . import bench_torch
    mask = None
    flops = attention_flops(shape.batch, shape.heads, shape.seqlen, shape.seqlen, shape.head_dim, shape.causal)
    if shape.density is not None:
        from .block_mask import BlockMask
        mask = BlockMask.random(shape.batch, shape.heads, shape.seqlen, shape.seqlen, shape.density,
                                seed=config.seed, block=config.block)
        bq, bk = mask.block
        flops = block_sparse_flops(mask.dense_blocks(), shape.batch, shape.heads, shape.seqlen, shape.seqlen,
                                   shape.head_dim, bq, bk)
    out = []
    for variant in config.variants:
        out.append(bench_flashkit(shape, inputs, variant, config, flops, mask))
        _report(out[-1], shape, say)
        _free_pools()
    if torch_ok:
        backends = ("flex",) if mask is not None else tuple(config.torch_backends)
        for backend in backends:
            if backend not in config.torch_backends:
                continue
            out.append(bench_torch.bench_backend(backend, shape, inputs, config, flops, mask))
            _report(out[-1], shape, say)
            _free_pools()
    return out


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


# ---- rendering -------------------------------------------------------------------------------
from .bench_report import render_json, render_memory_table, render_table, ratios, write_plot  # noqa: E402,F401
