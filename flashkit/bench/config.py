"""What a benchmark runs: the sweep's shapes, its configuration, its rows, and the FLOP counts.

Convention (the FlashAttention papers'): batch * seqlen = 16k tokens, hidden 2048 (heads = 2048 // head_dim: a head
dim that does not divide it, such as 80, 96 or 192, gets the whole heads that fit), seqlen 512..16k, head dims
64/128/256, bf16. Forward FLOPs = 4 * B * H * Sq * Sk * D, halved when causal;
block-sparse counts only the kept blocks. Inputs rotate among copies whose total exceeds the L2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

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
    # Time a shape's kernels (flashkit's and PyTorch's) interleaved call by call instead of one after the other:
    # ratios under one clock (at the GPU's power limit each kernel timed alone runs at a clock of its own;
    # bench/timing.py's time_interleaved, docs/design-notes.md).
    interleave: bool = False


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
    """batch = tokens // seqlen (at least 1), heads = hidden // head_dim (at least 1), for every combination."""
    shapes = []
    for d in head_dims:
        if d <= 0 or d > hidden:
            raise ValueError(f"head_dim {d}: expected 1..hidden ({hidden})")
        for c in causal:
            for s in seqlens:
                shapes.append(BenchShape(max(1, tokens // s), s, hidden // d, d, bool(c)))
    return shapes


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool = False) -> float:
    """Forward FLOPs: 4 * B * H * Sq * Sk * D (two GEMMs), halved when causal."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12


def device_l2_bytes() -> int:
    """The current device's L2 size (L2_BYTES_DEFAULT where no device says)."""
    try:
        import cupy
        return int(cupy.cuda.Device().attributes["L2CacheSize"]) or L2_BYTES_DEFAULT
    except Exception:
        return L2_BYTES_DEFAULT


def rotation_copies(bytes_per_set: int, l2_bytes: int) -> int:
    """How many input sets to rotate so that their total exceeds the L2 (two at least)."""
    return max(2, l2_bytes // max(1, bytes_per_set) + 1)


def mark_unavailable(row: BenchRow, exc: BaseException) -> BenchRow:
    """Record why a kernel did not run (first line of the exception) instead of raising."""
    row.available = False
    row.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return row


def time_row(row: BenchRow, call: Callable[[int], Any] | None, config: BenchConfig,
             timer: Callable[[Callable[[int], Any], int, int], float]) -> BenchRow:
    """row with call's median time and throughput (a row without a call, or whose timing raises, is unavailable)."""
    if call is not None:
        try:
            row.ms = timer(call, config.warmup, config.iters)
            row.tflops = tflops(row.flops, row.ms)
        except Exception as exc:
            mark_unavailable(row, exc)
    return row
