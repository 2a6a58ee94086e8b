"""The FP8 accuracy experiment of FlashAttention-3 (section 4.3): RMSE against a float64 reference on
inputs with outliers, for per-tensor FP8, block FP8 and block FP8 + Hadamard, beside bf16 fa2.

Inputs: N(0, 1) plus N(0, 100) on a fraction (0.1%) of the entries of q, k and v, held in bf16; the
reference is float64 attention on those bf16 values. Run it on a GPU: scripts/fp8-accuracy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

OUTLIER_FRACTION = 1e-3
OUTLIER_STD = 10.0          # N(0, 100): variance 100


@dataclass
class AccuracyResult:
    method: str
    variant: str
    rmse: float
    max_error: float
    ratio_to_per_tensor: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def outlier_inputs(batch: int, seqlen: int, heads: int, head_dim: int, seed: int,
                   outlier_fraction: float = OUTLIER_FRACTION, outlier_std: float = OUTLIER_STD):
    """q, k, v in bf16: N(0, 1) + N(0, outlier_std**2) on a random outlier_fraction of the entries."""
    from ..call.dtypes import BFLOAT16
    from ..runtime.device import cupy_module
    xp = cupy_module()
    rng = xp.random.default_rng(seed)
    shape = (batch, seqlen, heads, head_dim)

    def one():
        x = rng.standard_normal(shape, dtype=xp.float32)
        hit = rng.random(shape, dtype=xp.float32) < outlier_fraction
        return (x + hit * (outlier_std * rng.standard_normal(shape, dtype=xp.float32))).astype(BFLOAT16.storage)

    return one(), one(), one()


def fp8_accuracy(batch: int = 1, seqlen: int = 4096, heads: int = 16, head_dim: int = 128,
                 causal: bool = False, block: int = 128, seed: int = 0,
                 bf16_variant: str = "fa2") -> list[AccuracyResult]:
    """RMSE vs float64 for bf16 (bf16_variant), FP8 per-tensor, FP8 block, FP8 block + Hadamard."""
    from ..api import attention
    from ..features.fp8 import quantize_qkv
    from ..runtime.device import cupy_module
    from .reference import reference_attention
    xp = cupy_module()
    q, k, v = outlier_inputs(batch, seqlen, heads, head_dim, seed)
    ref, _ = reference_attention(q, k, v, scale=head_dim ** -0.5, causal=causal)

    def measure(method: str, variant: str, out) -> AccuracyResult:
        err = out.astype(xp.float64) - ref
        return AccuracyResult(method, variant, math.sqrt(float((err * err).mean())), float(xp.abs(err).max()))

    results = [measure("bf16", bf16_variant, attention(q, k, v, causal=causal, variant=bf16_variant))]
    for method, blk, hadamard in (("fp8 per-tensor", None, False), (f"fp8 block {block}", block, False),
                                  (f"fp8 block {block} + hadamard", block, True)):
        (qd, qs), (kd, ks), (vd, vs) = quantize_qkv(q, k, v, block=blk, hadamard=hadamard, seed=seed)
        out = attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal, variant="fp8",
                        out_dtype="bfloat16")
        results.append(measure(method, "fp8", out))
    per_tensor = results[1].rmse
    for r in results:
        r.ratio_to_per_tensor = r.rmse / per_tensor if per_tensor > 0 else None
    return results


def format_table(results: list[AccuracyResult]) -> str:
    lines = [f"{'method':<28} {'variant':<8} {'RMSE':>11} {'max err':>11} {'/ per-tensor':>13}"]
    for r in results:
        ratio = f"{r.ratio_to_per_tensor:.3f}" if r.ratio_to_per_tensor is not None else "-"
        lines.append(f"{r.method:<28} {r.variant:<8} {r.rmse:11.3e} {r.max_error:11.3e} {ratio:>13}")
    return "\n".join(lines)
