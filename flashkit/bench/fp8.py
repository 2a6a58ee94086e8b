"""FP8 runs of the sweep: variants that take only fp8 inputs are timed on pre-quantized q, k, v."""

from __future__ import annotations

from typing import Any, Callable

from .config import BenchShape
from .run import register_call


def is_fp8_variant(variant: str | None) -> bool:
    """Whether a variant runs only on fp8 inputs (its manifest requires fp8)."""
    from ..registry import discover_kernels
    spec = discover_kernels().specs.get(variant) if variant else None
    return bool(spec and spec.requires.get("fp8"))


def fp8_call(variant: str | None, shape: BenchShape, inputs: list) -> Callable[[int], Any] | None:
    """The timed call of an fp8 variant: attention on quantized copies of the inputs; None for others."""
    if not is_fp8_variant(variant):
        return None
    from ..api import attention
    from ..features.fp8 import quantize_qkv
    quantized = [quantize_qkv(q, k, v) for q, k, v in inputs]

    def call(i: int):
        (qd, qs), (kd, ks), (vd, vs) = quantized[i % len(quantized)]
        return attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, causal=shape.causal, variant=variant)
    return call


register_call(fp8_call)
