"""flash-attn's arguments, checked and mapped onto flashkit's before any array is touched.

Each argument flashkit cannot honour raises one error naming it: InputError for a malformed value,
UnsupportedError for a feature flashkit does not have.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InputError, UnsupportedError
from ..features.mods import UNBOUNDED, check_window

NO_WINDOW = (UNBOUNDED, UNBOUNDED)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_dropout(dropout_p: Any) -> None:
    """flashkit has no attention dropout: dropout_p must be 0 (flash-attn's value for evaluation)."""
    if not _is_number(dropout_p) or not math.isfinite(dropout_p):
        raise InputError(f"dropout_p: expected a float, got {dropout_p!r}")
    if dropout_p != 0:
        raise UnsupportedError(f"dropout_p: flashkit has no attention dropout, got {dropout_p}; pass 0.0 "
                               "(or apply dropout outside the attention)")


def window(window_size: Any) -> tuple[int, int] | None:
    """flash-attn's (left, right), -1 unbounded, as flashkit's window_size: None when both sides are open."""
    left, right = check_window(window_size)
    return None if (left, right) == NO_WINDOW else (left, right)


def softcap(value: Any) -> float:
    """flash-attn's softcap: a float, active when > 0 (0 or less switches it off, as flash-attn does)."""
    if not _is_number(value) or not math.isfinite(value):
        raise InputError(f"softcap: expected a finite float (0 disables), got {value!r}")
    return float(value) if value > 0 else 0.0


def refuse(value: Any, name: str, why: str) -> None:
    """An argument flashkit has no counterpart for: it must be left at None."""
    if value is not None:
        raise UnsupportedError(f"{name}: {why}")


def check_num_splits(num_splits: Any) -> None:
    """flashkit picks the split-KV count itself (`flashkit explain` shows it): only 0, flash-attn's 'heuristic'."""
    if not isinstance(num_splits, (int, np.integer)) or isinstance(num_splits, (bool, np.bool_)) or num_splits < 0:
        raise InputError(f"num_splits: expected an int >= 0, got {num_splits!r}")
    if num_splits != 0:
        raise UnsupportedError(f"num_splits: flashkit chooses the split-KV count itself (flashkit explain shows "
                               f"it), got {num_splits}; pass 0")


def as_int(value: Any, name: str) -> int:
    """An int, or a one-element integer tensor/array (transformers passes max lengths as 0-d tensors)."""
    if isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name}: expected an int, got {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        got = item()
        if isinstance(got, int) and not isinstance(got, bool):
            return got
    raise InputError(f"{name}: expected an int, got {value!r}")
