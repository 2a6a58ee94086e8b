"""Built-in attention modifications: window_size, attention_chunk, softcap, alibi_slopes.

Checked on metadata before any compile or launch; the kernels see them as compile-time selections
(BuildConfig.mods -> -DFLASHKIT_WINDOW / _SOFTCAP / _ALIBI) and runtime values (Params.mods).
Semantics (flash-attn's and FlashAttention-3's), with off = seqlen_k - seqlen_q:
  window_size=(left, right)  query i sees keys i + off - left <= j <= i + off + right (-1: unbounded)
  attention_chunk=c          and floor((i + off) / c) == floor(j / c)
  softcap=c                  scaled scores s become c tanh(s / c)
  alibi_slopes               then s - slope[b, h] |i + off - j|
causal=True sets right = 0 (flash-attn's rule), so window_size=(left, r) with causal is (left, 0), and (-1, r) is
causal alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..call.arrays import describe, to_cupy
from ..call.validate import Problem, check_device, check_on_gpu
from ..errors import InputError

UNBOUNDED = -1
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class Mods:
    """The modifications of one call, validated; the default is none."""

    window_left: int = UNBOUNDED
    window_right: int = UNBOUNDED
    chunk: int = 0
    softcap: float = 0.0
    alibi: bool = False

    @property
    def local(self) -> bool:
        """A local mask (window or chunk) is needed."""
        return self.window_left >= 0 or self.window_right >= 0 or self.chunk > 0

    @property
    def features(self) -> tuple[str, ...]:
        """The manifest features (and BuildConfig.mods) these modifications need, in define order."""
        return tuple(f for f, on in (("window", self.local), ("softcap", self.softcap > 0), ("alibi", self.alibi))
                     if on)

    def request_flags(self) -> dict[str, bool]:
        return {"window": self.local, "chunk": self.chunk > 0, "softcap": self.softcap > 0, "alibi": self.alibi}

    def window(self) -> tuple[int, int]:
        return (self.window_left, self.window_right)

    def describe(self) -> str:
        parts = []
        if self.window_left >= 0 or self.window_right >= 0:
            parts.append(f"window({self.window_left},{self.window_right})")
        if self.chunk:
            parts.append(f"chunk({self.chunk})")
        if self.softcap:
            parts.append(f"softcap({self.softcap:g})")
        if self.alibi:
            parts.append("alibi")
        return " ".join(parts)


NO_MODS = Mods()


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_window(window_size: Any) -> tuple[int, int]:
    """(left, right), each an int >= -1; None is (-1, -1)."""
    if window_size is None:
        return (UNBOUNDED, UNBOUNDED)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(_is_int(w) for w in window_size)):
        raise InputError(f"window_size: expected (left, right), two ints >= -1, got {window_size!r}")
    left, right = (int(w) for w in window_size)
    if left < UNBOUNDED or right < UNBOUNDED:
        raise InputError(f"window_size: expected (left, right), two ints >= -1 (-1: unbounded), got {window_size!r}")
    return left, right


def check_softcap(softcap: Any) -> float:
    """A finite float >= 0 (0 disables)."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
        raise InputError(f"softcap: expected a float >= 0 (0 disables), got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap < 0:
        raise InputError(f"softcap: expected a finite float >= 0 (0 disables), got {softcap}")
    return float(softcap)


def check_chunk(attention_chunk: Any) -> int:
    """An int >= 0 (0 disables)."""
    if not _is_int(attention_chunk) or attention_chunk < 0:
        raise InputError(f"attention_chunk: expected an int >= 0 (0 disables), got {attention_chunk!r}")
    return int(attention_chunk)


def check_alibi(alibi_slopes: Any, problem: Problem, device: int | None) -> bool:
    """alibi_slopes: None, or a float32 CUDA array (heads,) or (batch, heads) on q's device."""
    if alibi_slopes is None:
        return False
    m = describe(alibi_slopes, "alibi_slopes")
    check_on_gpu(m)
    if m.dtype != np.float32:
        raise InputError(f"alibi_slopes: expected dtype float32, got {m.dtype}")
    shapes = ((problem.heads,), (problem.batch, problem.heads))
    if tuple(m.shape) not in shapes:
        raise InputError(f"alibi_slopes: expected shape ({problem.heads},) or ({problem.batch}, {problem.heads}), "
                         f"got {tuple(m.shape)}")
    check_device(m, device)
    return True


def check_mods(problem: Problem, causal: bool, *, window_size: Any = None, softcap: Any = 0.0,
               alibi_slopes: Any = None, attention_chunk: Any = 0, device: int | None = None) -> Mods:
    """Every modification argument checked (InputError naming it); causal sets the window's right side to 0."""
    left, right = check_window(window_size)
    cap = check_softcap(softcap)
    chunk = check_chunk(attention_chunk)
    alibi = check_alibi(alibi_slopes, problem, device)
    if causal:   # flash-attn's rule: the right side is 0; with no left side or chunk, the window is causal's own
        right = 0 if left >= 0 or chunk > 0 else UNBOUNDED
    return Mods(left, right, chunk, cap, alibi)


def given(window_size: Any = None, softcap: Any = 0.0, alibi_slopes: Any = None, attention_chunk: Any = 0) -> bool:
    """Whether a call passes any modification argument (else it needs no check: NO_MODS)."""
    return window_size is not None or softcap != 0 or alibi_slopes is not None or attention_chunk != 0


def mods_of(problem: Problem, causal: bool, *, window_size: Any = None, softcap: Any = 0.0, alibi_slopes: Any = None,
            attention_chunk: Any = 0, device: int | None = None) -> Mods:
    """check_mods for a call that passes modifications; NO_MODS, unchecked, for one that passes none."""
    if not given(window_size, softcap, alibi_slopes, attention_chunk):
        return NO_MODS
    return check_mods(problem, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                      attention_chunk=attention_chunk, device=device)


def launch_fields(mods: Mods, problem: Problem, alibi_slopes: Any, keep: list) -> dict:
    """The launch's Params.mods for a call's checked modifications ({} for none); the slopes viewed as a CuPy
    array, kept alive in `keep` until the launch is queued."""
    if not mods.features:
        return {}
    slopes = to_cupy(alibi_slopes, "alibi_slopes") if mods.alibi else None
    if slopes is not None:
        keep.append(slopes)
    return kernel_fields(mods, problem, slopes)


def kernel_fields(mods: Mods, problem: Problem, slopes: Any = None) -> dict:
    """Params.mods for a launch: open window sides as seqlen_q + seqlen_k, softcap and ALiBi in raw-score units.

    Uses |softmax_scale|: a negative scale runs as -q with |scale| (api.run).
    """
    scale = abs(problem.softmax_scale)
    span = problem.seqlen_q + problem.seqlen_k   # a window this wide is unbounded; keeps the kernel's ints small
    side = (lambda w: span if w < 0 else min(w, span))  # noqa: E731
    fields = {"window_left": side(mods.window_left), "window_right": side(mods.window_right), "chunk": mods.chunk,
              "inv_softmax_scale": 1.0 / scale}
    if mods.softcap > 0:
        fields.update(softcap=mods.softcap, softcap_in=scale / mods.softcap, softcap_out=mods.softcap / scale)
    if slopes is not None:
        item = slopes.itemsize
        if slopes.ndim == 1:
            fields.update(alibi_batch_stride=0, alibi_head_stride=slopes.strides[0] // item)
        else:
            fields.update(alibi_batch_stride=slopes.strides[0] // item, alibi_head_stride=slopes.strides[1] // item)
        fields["alibi_slopes"] = slopes.data.ptr
    return {"mods": fields}


def op_mod_args(window_size: tuple[int, int] | None = None, softcap: float = 0.0, alibi_slopes: Any = None,
                attention_chunk: int = 0) -> tuple:
    """flashkit's modification keywords as the flat trailing arguments of flashkit.torch's ops (window (-1, -1):
    none; a window that is no pair of ints, or a bad chunk, is named by the forward's checks)."""
    left, right = check_window(window_size)
    return left, right, check_softcap(softcap), alibi_slopes, check_chunk(attention_chunk)
