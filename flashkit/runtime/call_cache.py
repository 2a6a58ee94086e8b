"""The hot path: a call's decisions cached per signature, and workspaces reused per (device, stream, size).

Validation and selection depend only on a call's signature: the arrays' metadata (shape, byte strides, dtype,
address modulo 16, device), the flags and scalars, the current device and the kernel search path. A call
whose signature was seen (and validated, selected, built) before looks its decision up here and only fills
the parameter block and launches. Anything that changes selection empties the cache: a rediscovery of the
kernels (discover_kernels building a new catalogue) and clear_loaded().
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Hashable

import numpy as np

MAX_ENTRIES = 256               # distinct signatures kept (least recently used dropped first)
MAX_WORKSPACES = 8
ALIGN_MASK = 15                 # the address's alignment class: the kernels' 16-byte vector loads
LSE_DTYPE = np.dtype(np.float32)
KERNEL_PATH_ENV = "FLASHKIT_KERNEL_PATH"


class CallCache:
    """A bounded LRU map from a call's signature to its prepared decision."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable) -> Any:
        """The entry of key, or None (also for an unhashable key: an argument no cached call can have had)."""
        try:
            entry = self._entries.get(key)
        except TypeError:
            return None
        if entry is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:   # evicted by another thread meanwhile: the entry is still good for this call
                pass
        return entry

    def put(self, key: Hashable, entry: Any) -> None:
        """Keep entry under key; an unhashable key keeps nothing (that call always takes the full path)."""
        try:
            self._entries[key] = entry
        except TypeError:
            return
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries


CALLS = CallCache()             # attention and attention_with_kvcache, keyed by entry point and signature
_WORKSPACES: OrderedDict[tuple, Any] = OrderedDict()


def invalidate() -> None:
    """Forget every cached decision and workspace (the kernels were rediscovered or unloaded)."""
    CALLS.clear()
    _WORKSPACES.clear()


def array_signature(x: Any) -> tuple | None:
    """What validation, selection and launch read of a CuPy array; None for anything else (the full path)."""
    sigs = arrays_signature(x)
    return None if sigs is None else sigs[0]


def arrays_signature(*arrays: Any) -> tuple | None:
    """array_signature of each argument (None for an absent one); None when one given is no CuPy array.

    One loop over all of a call's arrays (no call per array): this runs on every cached call."""
    ndarray = _NDARRAY or _ndarray_type()
    sigs = []
    for x in arrays:
        if x is None:
            sigs.append(None)
        elif type(x) is ndarray:
            data = x.data
            sigs.append((x.shape, x.strides, x.dtype, data.ptr & ALIGN_MASK, data.device_id))
        else:
            return None
    return tuple(sigs)


def scalar_signature(x: Any) -> tuple:
    """A scalar argument with its type (True == 1 and 1 == 1.0, but the checks tell them apart)."""
    return (type(x), x)


UNKEYED = object()   # window_signature of an argument no cached call can have had


def window_signature(window_size: Any) -> Any:
    """window_size as a key item: None, or its type with each side's scalar_signature; UNKEYED for anything else
    (the full path names it)."""
    if window_size is None:
        return None
    if type(window_size) in (tuple, list):
        return (type(window_size), tuple(scalar_signature(w) for w in window_size))
    return UNKEYED


def context_signature() -> tuple | None:
    """The current device and the kernel search path: what the call's arrays do not say about selection
    (None where no device answers: the full path says why)."""
    device = current_device()
    return None if device is None else (device, kernel_path())


def kernel_path() -> Any:
    """FLASHKIT_KERNEL_PATH as the environment holds it (encoded; None when unset), for keys only.

    os.environ.get costs over a microsecond (it encodes the name and decodes the value every call); CPython's
    os.environ keeps the encoded mapping in _data, where the pre-encoded name is one dictionary look-up."""
    try:
        return os.environ._data.get(_KERNEL_PATH_KEY)
    except AttributeError:   # os.environ replaced by a plain mapping
        return os.environ.get(KERNEL_PATH_ENV)


def current_device() -> int | None:
    try:
        return (_GET_DEVICE or _get_device_function())()
    except Exception:
        return None


def workspace(nbytes: int):
    """A scratch buffer of nbytes for the current device and stream, reused by later calls on that stream.

    Safe because a stream runs its launches in order: the next call's kernels start after this one's ended.
    Never shared across streams (two streams could run both calls at once).
    """
    cupy = _cupy()
    key = (current_device(), cupy.cuda.get_current_stream().ptr, nbytes)
    buf = _WORKSPACES.get(key)
    if buf is None:
        buf = cupy.empty(nbytes, dtype=cupy.uint8)
        _WORKSPACES[key] = buf
        while len(_WORKSPACES) > MAX_WORKSPACES:
            _WORKSPACES.popitem(last=False)
    else:
        _WORKSPACES.move_to_end(key)
    return buf


class CachedLaunch:
    """A validated, selected and built signature: its prepared launch (runtime/launch.PreparedLaunch) and the
    shapes of the outputs it allocates when the caller passes none."""

    def __init__(self, prepared: Any, out_shape: tuple, out_storage: Any, lse_shape: tuple | None):
        self.prepared, self.out_shape, self.out_storage, self.lse_shape = prepared, out_shape, out_storage, lse_shape

    def launch(self, q: Any, k: Any, v: Any, out: Any, extra: tuple[int, ...] = ()):
        """Allocate the outputs (out unless given, the LSE when asked for), fill the parameter block, launch on
        the current stream with this stream's workspace; returns out, or (out, lse)."""
        ndarray = _NDARRAY or _ndarray_type()   # cupy.empty without its Python wrapper
        out_arr = ndarray(self.out_shape, self.out_storage) if out is None else out
        lse = ndarray(self.lse_shape, LSE_DTYPE) if self.lse_shape is not None else None
        nbytes = self.prepared.workspace_bytes
        self.prepared(q, k, v, out_arr, lse, extra, workspace(nbytes) if nbytes else None)
        return (out_arr, lse) if lse is not None else out_arr


_CUPY: list = []
_NDARRAY: type | None = None     # cupy.ndarray, bound at first use (CuPy is imported lazily)
_GET_DEVICE = None               # cupy.cuda.runtime.getDevice, bound likewise
_KERNEL_PATH_KEY = os.environ.encodekey(KERNEL_PATH_ENV) if hasattr(os.environ, "encodekey") else KERNEL_PATH_ENV


def _cupy():
    if not _CUPY:
        try:
            import cupy
        except ImportError:
            return None
        _CUPY.append(cupy)
    return _CUPY[0]


def ndarray_type() -> type:
    """cupy.ndarray (bound at first use: CuPy is imported lazily)."""
    return _NDARRAY or _ndarray_type()


def _ndarray_type() -> type:
    """cupy.ndarray (a class nothing is an instance of without CuPy), bound for later calls."""
    global _NDARRAY
    cupy = _cupy()
    _NDARRAY = cupy.ndarray if cupy is not None else type("NoCupyArray", (), {})
    return _NDARRAY


def _get_device_function():
    global _GET_DEVICE
    _GET_DEVICE = _cupy().cuda.runtime.getDevice
    return _GET_DEVICE
