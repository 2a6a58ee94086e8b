"""Exact merge of partial attention results through their log-sum-exps.

Partial s computed softmax over its own keys: (O_s, LSE_s). Over the union of keys
    LSE = logsumexp_s LSE_s,    O = sum_s exp(LSE_s - LSE) O_s,
in fp32. A row no partial saw keeps O = 0 and LSE = -inf. Layouts are flashkit's: O (batch, rows, heads,
head_dim), LSE (batch, heads, rows). `merge_pair` is the math on NumPy, CuPy or torch; `merge_into`
updates a torch fp32 accumulator in place, through the fused CuPy kernel (merge_kernel) where it applies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._torch import is_torch_tensor


def _namespace(x: Any):
    if is_torch_tensor(x):
        import torch
        return torch
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def merge_weights(lse_a: Any, lse_b: Any):
    """(w_a, w_b, lse): the weights of two partials and their merged LSE; 0, 0, -inf where both are -inf."""
    xp = _namespace(lse_a)
    m = xp.maximum(lse_a, lse_b)
    empty = xp.isneginf(m)
    m_safe = xp.where(empty, xp.zeros_like(m), m)
    ea, eb = xp.exp(lse_a - m_safe), xp.exp(lse_b - m_safe)   # exp(-inf) = 0 for an empty side
    total = ea + eb
    denom = xp.where(empty, xp.ones_like(total), total)
    lse = xp.where(empty, m, m_safe + xp.log(denom))
    return ea / denom, eb / denom, lse


def merge_pair(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any):
    """The merged (O, LSE) of two partials over disjoint key sets; O in float32 (float64 stays float64)."""
    xp = _namespace(o_a)
    w_a, w_b, lse = merge_weights(lse_a, lse_b)
    # LSE (b, h, s) -> per-row weights (b, s, h, 1) against O (b, s, h, d)
    w_a, w_b = (xp.swapaxes(w, 1, 2)[..., None] for w in (w_a, w_b))
    wide = xp.float64 if o_a.dtype == xp.float64 else xp.float32
    out = w_a * _as(o_a, wide, xp) + w_b * _as(o_b, wide, xp)
    return out, lse


def merge_all(parts: list[tuple[Any, Any]]):
    """Fold merge_pair over a list of (O, LSE) partials (the reference for the ring's running merge)."""
    out, lse = parts[0]
    xp = _namespace(out)
    out = _as(out, xp.float64 if out.dtype == xp.float64 else xp.float32, xp)
    for o, l in parts[1:]:
        out, lse = merge_pair(out, lse, o, l)
    return out, lse


def merge_into(acc_o: Any, acc_lse: Any, part_o: Any, part_lse: Any, row0: int = 0, use_kernel: bool = True) -> str:
    """acc[rows row0 : row0+n] <- merge(acc, part) in place (torch, on the current stream); returns the path taken.

    acc_o: float32 (b, S, h, d); acc_lse: float32 (b, h, S); part_o: (b, n, h, d) in any float dtype;
    part_lse: float32 (b, h, n).
    """
    n = part_o.shape[1]
    if use_kernel:
        from .merge_kernel import fused_merge_applies, fused_merge
        if fused_merge_applies(acc_o, acc_lse, part_o, part_lse):
            fused_merge(acc_o, acc_lse, part_o, part_lse, row0)
            return "kernel"
    rows_o, rows_lse = acc_o[:, row0:row0 + n], acc_lse[:, :, row0:row0 + n]
    out, lse = merge_pair(rows_o, rows_lse, part_o, part_lse)
    rows_o.copy_(out)
    rows_lse.copy_(lse)
    return "torch"


def _as(x: Any, dtype: Any, xp):
    if xp is np:
        return np.asarray(x, dtype=dtype)
    if is_torch_tensor(x):
        return x.to(dtype)
    return x.astype(dtype)
