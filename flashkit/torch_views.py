"""Torch tensors as CuPy views, and CuPy results back as tensors, on torch's current stream and through torch's
caching allocator: what flashkit.torch's ops, its masked calls (torch_masked.py) and the compat layer run under."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from . import torch_direct as direct


MAX_EXTERNAL_STREAMS = 64
_EXTERNAL_STREAMS: dict[tuple[int, int], object] = {}   # (device, handle) -> CuPy's Stream over it


def _current_stream(cupy, device: int):
    """CuPy's view of torch's current stream on device: one per handle, kept (it only names the stream)."""
    handle = direct.raw_stream(device)
    stream = _EXTERNAL_STREAMS.get((device, handle))
    if stream is None:
        if len(_EXTERNAL_STREAMS) >= MAX_EXTERNAL_STREAMS:
            _EXTERNAL_STREAMS.clear()
        stream = _EXTERNAL_STREAMS[(device, handle)] = cupy.cuda.Stream.from_external(direct.StreamHandle(handle))
    return stream


_ALLOCATORS: dict[int, Callable] = {}   # device -> CuPy allocator over torch's caching allocator


def _torch_allocator(cupy, device: int) -> Callable:
    """A CuPy allocator that takes its memory from torch's caching allocator on device (made once a device)."""
    alloc = _ALLOCATORS.get(device)
    if alloc is None:
        def alloc(size: int):
            t = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), size, t), 0)
        _ALLOCATORS[device] = alloc
    return alloc


@contextlib.contextmanager
def _on_torch_stream_and_allocator():
    """CuPy launches on torch's current stream and allocates through torch's caching allocator."""
    import cupy
    device = torch.cuda.current_device()
    with (cupy.cuda.Device(device), _current_stream(cupy, device),
          cupy.cuda.using_allocator(_torch_allocator(cupy, device))):
        yield


_FROM_DLPACK = getattr(torch._C, "_from_dlpack", None)   # the C import behind torch.utils.dlpack.from_dlpack


def _as_torch(x) -> torch.Tensor:
    """A CuPy result as a torch tensor (zero copy). Under _on_torch_stream_and_allocator CuPy's stream is torch's, so
    the capsule is taken for that stream and imported without torch.from_dlpack's Python stream handshake."""
    if _FROM_DLPACK is not None:
        import cupy
        handle = cupy.cuda.get_current_stream().ptr
        return _FROM_DLPACK(x.__dlpack__(stream=handle or DLPACK_LEGACY_STREAM))   # as torch.from_dlpack asks
    return torch.from_dlpack(x)


_TO_DLPACK = getattr(torch._C, "_to_dlpack", None)   # the C export behind torch.utils.dlpack.to_dlpack
DLPACK_CUDA = 2                                      # DLPack's kDLCUDA device type
DLPACK_LEGACY_STREAM = 1                             # DLPack's name for CUDA's legacy default stream (handle 0)


class _Exported:
    """A CUDA tensor exported to DLPack without torch's stream handshake (Tensor.__dlpack__ asks torch for the
    current stream and device in Python: about 14 of the 18 us a view costs). The handshake has nothing to do
    here: the views are taken on torch's current stream, which is also CuPy's (_on_torch_stream_and_allocator)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return _TO_DLPACK(self.tensor)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (DLPACK_CUDA, self.tensor.get_device())



# Tensors viewed as CuPy arrays before a call: dtypes whose CuPy view means what the tensor means (fp8 tensors go
# through to_cupy's byte view on the full path instead).
_VIEWED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)


def cupy_views(arrays: tuple) -> tuple:
    """CUDA tensors of _VIEWED_DTYPES as zero-copy CuPy views, so that a repeated signature takes the call
    cache's path (runtime/call_cache.py keys CuPy arrays only; torch tensors took the full path, about 0.4 ms of
    host time, every call). Call it under _on_torch_stream_and_allocator: DLPack then hands the tensor over on
    torch's own stream. Anything else (CPU tensors, fp8, scalars, a tensor DLPack refuses) is left as it is, for
    the full path's checks and their messages."""
    import cupy
    views = []
    for a in arrays:
        if isinstance(a, torch.Tensor) and a.is_cuda and a.dtype in _VIEWED_DTYPES:
            try:
                a = cupy.from_dlpack(_Exported(a) if _TO_DLPACK is not None else a)
            except Exception:   # left to the full path, which names the argument
                pass
        views.append(a)
    return tuple(views)


def tensor_view(x):
    """One argument as cupy_views views it (a torch tensor detached first: DLPack refuses tensors that require
    grad); anything else (None, a scalar) as given."""
    return cupy_views((x.detach(),))[0] if isinstance(x, torch.Tensor) else x
