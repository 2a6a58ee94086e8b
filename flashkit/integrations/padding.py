"""transformers' attention masks, classified exactly into what flashkit can run (NumPy arrays or torch tensors).

A padding mask (batch, keys) marks each sequence's tokens (1) and padding (0); the key axis holds the
sequence's positions 0..keys-1 and the q_len queries are its last q_len positions (a KV cache's new tokens).
Three outcomes, exact for every query that is a token (outputs at padding positions are left unspecified,
as flash-attn's padded path leaves them):
  - dense: one plain call over the first `keys` keys. No padding at all; or right padding under causal
    attention, where every token's query sees only keys before it, all of them tokens;
  - ragged: the tokens packed per sequence, through varlen (left padding, holes, non-causal padding);
    per sequence, causal bottom-right alignment in packed coordinates equals the mask's, because the packed
    queries are exactly the packed keys at the queries' positions (for q_len == 1 the one query is kept
    always, as transformers' flash_attention_2 does);
  - an UnsupportedError naming attention_mask, for anything else (a 4D mask that is no padding pattern,
    per-head masks, additive biases).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, UnsupportedError

UNBOUNDED = -1


@dataclass(frozen=True)
class MaskPlan:
    """How to run one call under a padding mask."""

    keys: int                  # keys attended: a prefix of the key axis (a static cache's filled part)
    causal: bool
    ragged: bool               # False: one dense call over keys [0, keys) is exact for every token
    key_mask: Any = None       # ragged: (batch, keys) bool, each sequence's tokens among the keys
    query_mask: Any = None     # ragged: (batch, q_len) bool, the queries that are packed


def _torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _ones(like: Any, shape: tuple[int, ...]):
    if _torch(like):
        import torch
        return torch.ones(shape, dtype=torch.bool, device=like.device)
    return np.ones(shape, dtype=bool)


def _arange(like: Any, n: int):
    if _torch(like):
        import torch
        return torch.arange(n, device=like.device)
    return np.arange(n)


def _dtype_min(x: Any) -> float:
    if _torch(x):
        import torch
        return float(torch.finfo(x.dtype).min)
    return float(np.finfo(x.dtype).min)


def _is_bool(x: Any) -> bool:
    return str(x.dtype) in ("bool", "torch.bool")


def _is_float(x: Any) -> bool:
    return x.dtype.is_floating_point if _torch(x) else np.issubdtype(x.dtype, np.floating)


def plan_padding(mask: Any, q_len: int, kv_len: int, causal: bool,
                 window: tuple[int, int] | None = None) -> MaskPlan:
    """The plan for a 2D (batch, keys) 0/1 padding mask; a longer mask is sliced from the right (as
    transformers' flash_attention_mask does), a shorter one attends to the first mask-length keys only."""
    if len(mask.shape) != 2:
        raise InputError(f"attention_mask: expected a 2D (batch, keys) padding mask, got shape {tuple(mask.shape)}")
    m = mask[:, -kv_len:] != 0
    keys = int(m.shape[1])
    if q_len > keys:
        raise UnsupportedError(f"attention_mask: covers {keys} keys, fewer than the {q_len} queries")
    if bool(m.all()):
        return MaskPlan(keys, causal, False)
    if causal and not bool((m[:, 1:] & ~m[:, :-1]).any()):   # right padding: no token after a pad
        return MaskPlan(keys, causal, False)
    if window is not None and (window[0] >= 0 or window[1] >= 0):
        runs = (m[:, 1:] & ~m[:, :-1]).sum(1) + m[:, 0]     # starts of token runs per sequence
        if bool((runs > 1).any()):
            raise UnsupportedError("attention_mask: padding between tokens with a sliding window; the window is "
                                   "counted in packed tokens, which differs from positions there")
    queries = m[:, keys - q_len:] if q_len > 1 else _ones(m, (int(m.shape[0]), 1))
    return MaskPlan(keys, causal, True, m, queries)


def padding_of_4d(mask: Any, batch: int, q_len: int, kv_len: int, causal: bool,
                  window: tuple[int, int] | None = None) -> tuple[Any, bool]:
    """(key_mask (batch, kv_len) bool, causal) of a 4D (batch | 1, heads | 1, q_len, kv_len) mask (bool, 0/1,
    or additive 0 / dtype minimum), when it is exactly a padding mask with or without causal attention (and
    the window); UnsupportedError otherwise. causal is the caller's where both readings fit."""
    shape = tuple(mask.shape)
    if len(shape) != 4 or shape[2:] != (q_len, kv_len) or shape[0] not in (1, batch):
        raise InputError(f"attention_mask: expected a 4D mask ({batch} or 1, heads or 1, {q_len}, {kv_len}), "
                         f"got shape {shape}")
    if _is_float(mask):
        keep = mask == 0
        if not bool((keep | (mask <= _dtype_min(mask) / 2)).all()):
            raise UnsupportedError("attention_mask: an additive 4D mask with values other than 0 and the dtype's "
                                   "minimum (a bias) is not a padding mask; flashkit cannot add it")
    else:
        keep = mask != 0
    if bool((keep != keep[:, :1]).any()):
        raise UnsupportedError("attention_mask: the 4D mask differs between heads; flashkit takes one padding "
                               "mask for all heads")
    keep = keep[:, 0]
    keys = keep.any(1)                                                   # a key someone sees is a token
    if q_len > kv_len:
        raise UnsupportedError(f"attention_mask: {q_len} queries against {kv_len} keys is no padding pattern")
    rows = keys[:, kv_len - q_len:] if q_len > 1 else _ones(keys, (int(keys.shape[0]), 1))
    i = (_arange(keep, q_len) + (kv_len - q_len))[:, None]               # each query's position
    j = _arange(keep, kv_len)[None, :]
    band = _ones(keep, (q_len, kv_len))
    left, right = window if window is not None else (UNBOUNDED, UNBOUNDED)
    if left >= 0:
        band = band & (j >= i - left)
    full = band & (j <= i + right) if right >= 0 else band

    def fits(pattern) -> bool:
        return not bool(((keep != (keys[:, None, :] & pattern[None])) & rows[:, :, None]).any())

    fits_causal, fits_full = fits(band & (j <= i)), fits(full)
    if not (fits_causal or fits_full):
        raise UnsupportedError("attention_mask: this 4D mask is not a padding mask (with or without causal "
                               "attention and the sliding window); flashkit cannot run arbitrary masks")
    if keys.shape[0] != batch:
        keys = keys & _ones(keys, (batch, kv_len))
    return keys, (causal if fits_causal and fits_full else fits_causal)
