"""Verification of FP8 variants: the kernel on quantized inputs against the float64 reference on the
original inputs, bounded by a plain implementation with the same FP8 quantization (DESIGN.md's rule).
"""

from __future__ import annotations

import itertools

from ..call.arrays import array_module
from ..call.dtypes import BY_NAME
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module
from .harness import QUICK_SHAPES, SHAPES, Check, CheckResult, Shape, judge, random_qkv, register_family
from .reference import element_mask, expand_kv, output_atol, reference_attention

FP8_INPUTS = ("bfloat16", "float16")   # what gets quantized; the output has the same dtype


def plain_fp8_attention(q, k, v, *, scale: float, causal: bool = False):
    """The textbook computation on dequantized float32 q, k, v, quantizing P as the kernel does:
    S in fp32, P = 448 exp(S - rowmax) rounded to e4m3, O = P V / rowsum(448 exp(S - rowmax))."""
    from ..features.fp8 import E4M3_MAX, round_e4m3
    xp = array_module(q)
    k, v = expand_kv(k, q.shape[2], xp), expand_kv(v, q.shape[2], xp)
    s = xp.einsum("bqhd,bkhd->bhqk", q, k).astype(xp.float32) * xp.float32(scale)
    mask = element_mask(q.shape[1], k.shape[1], causal, None, xp)
    if mask is not None:
        s = xp.where(mask, s, -xp.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = xp.where(xp.isfinite(m), m, 0).astype(xp.float32)
    p = (xp.exp(s - m_safe) * xp.float32(E4M3_MAX)).astype(xp.float32)
    l = p.sum(axis=-1, keepdims=True)
    lse = xp.where(l > 0, m_safe + xp.log(xp.where(l > 0, l, 1) / E4M3_MAX), -xp.inf)[..., 0]
    out = xp.einsum("bhqk,bkhd->bqhd", round_e4m3(p), v) / xp.transpose(xp.where(l > 0, l, 1), (0, 2, 1, 3))
    return out.astype(xp.float32), lse


def fp8_check(spec: KernelSpec, shape: Shape, head_dim: int, in_dtype: str, causal: bool,
              block: int | None = None, hadamard: bool = False, api_quantizes: bool = False) -> Check:
    """One check: quantize fresh inputs, run the variant, judge against reference and plain."""
    from ..features.fp8 import DEFAULT_BLOCK
    block = DEFAULT_BLOCK if block is None else block
    tags = [f"{in_dtype}->fp8", "per-tensor" if block == 0 else f"block{block}"]
    tags += (["hadamard"] if hadamard else []) + (["fp8=True"] if api_quantizes else [])
    label = f"{shape.label()} d{head_dim} {' '.join(tags)}" + (" causal" if causal else "")
    options = {"block": block or None, "hadamard": hadamard}

    def run(seed: int) -> CheckResult:
        from ..api import attention
        from ..features.fp8 import dequantize_fp8, quantize_qkv
        xp = cupy_module()
        out_dt = BY_NAME[in_dtype]
        q, k, v = random_qkv(shape, head_dim, in_dtype, seed)
        (qd, qs), (kd, ks), (vd, vs) = quantize_qkv(q, k, v, seed=seed, **options)
        out = xp.full(q.shape, xp.nan, dtype=out_dt.storage)   # poisoned: an unwritten element stays NaN
        if api_quantizes:
            out, lse = attention(q, k, v, causal=causal, variant=spec.name, return_lse=True, out=out,
                                 fp8=True, fp8_options=dict(options, seed=seed))
        else:
            out, lse = attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal,
                                 variant=spec.name, return_lse=True, out=out, out_dtype=in_dtype)
        scale = head_dim ** -0.5
        ref, lse_ref = reference_attention(q, k, v, scale=scale, causal=causal)
        plain, lse_plain = plain_fp8_attention(dequantize_fp8(qd, qs), dequantize_fp8(kd, ks),
                                               dequantize_fp8(vd, vs), scale=scale, causal=causal)
        plain = plain.astype(out_dt.storage)   # rounded to the output dtype, as the kernel's output
        atol = output_atol(ref, out_dt, max(shape.seqlen_k, head_dim))
        return judge(spec.name, label, out, ref, plain, atol, lse, lse_ref, lse_plain, head_dim=head_dim)

    return Check(spec.name, label, run)


def fp8_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The shape matrix on bf16 inputs (and fp16 unless quick), with per-tensor, 256-row block, Hadamard and
    attention(fp8=True) checks beside the default block quantization."""
    shapes = QUICK_SHAPES if quick else SHAPES
    inputs = FP8_INPUTS[:1] if quick else FP8_INPUTS
    checks = [fp8_check(spec, s, d, t, c) for t, d, c, s in itertools.product(inputs, head_dims, causal_opts, shapes)]
    for d, c in itertools.product(head_dims, causal_opts):
        checks += [fp8_check(spec, shapes[4 % len(shapes)], d, "bfloat16", c, hadamard=True),
                   fp8_check(spec, shapes[1], d, "bfloat16", c, block=0),
                   fp8_check(spec, shapes[4], d, "bfloat16", c, block=256),
                   fp8_check(spec, shapes[-1], d, "bfloat16", c, block=64, hadamard=True, api_quantizes=True)]
    return checks


register_family("fp8", fp8_checks)
