"""Integer handles of the mask objects (BlockMask, ModMask): how a torch.library op, whose schema carries tensors,
numbers and strings but no Python objects, names the mask of a call (flashkit/torch_masked.py).

Every mask takes a handle when it is made. The registry holds masks weakly: a handle names its mask for as long as
the caller keeps the mask, as the call that passes it does.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from ..errors import InputError

NO_MASK = -1   # the handle of an absent mask

_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_NEXT = itertools.count()


def register(mask: Any) -> int:
    """A fresh handle for mask (weakly held)."""
    handle = next(_NEXT)
    _LIVE[handle] = mask
    return handle


def lookup(handle: int, what: str) -> Any:
    """The mask of handle (None for NO_MASK); InputError naming `what` when that mask no longer exists."""
    if handle == NO_MASK:
        return None
    mask = _LIVE.get(int(handle))
    if mask is None:
        raise InputError(f"{what}: the mask of handle {handle} no longer exists (keep the mask alive while the call "
                         "that uses it runs)")
    return mask


def handle_of(mask: Any) -> int:
    """mask's handle, NO_MASK for None."""
    return NO_MASK if mask is None else mask.handle
