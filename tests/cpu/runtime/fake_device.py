"""A GPU-less stand-in for the device under the whole call path (selection, build, tensor maps, allocation,
workspaces), shared by the call-cache tests and `scripts/bench_host.py --fake`.

CuPy arrays live over fake device addresses (nothing reads them): `fake` makes one, and CuPy's own allocations
(cupy.empty and friends, through CuPy's real code) come from a fake allocator, so a benchmark on this harness
pays what CuPy's array construction costs. Kernel entries are Recorders that keep each launch's parameter
bytes, so a test can compare the cached path with the full one bit for bit.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import ml_dtypes
import numpy as np

from flashkit import api, backward, kvcache, varlen
from flashkit.features import mod_mask
from flashkit.runtime import build, call_cache
from flashkit.runtime import launch as launch_mod
from flashkit.runtime.device import DeviceInfo
from flashkit.runtime.params import PARAMS_DTYPE
from flashkit.runtime.tma import TENSOR_MAP_DTYPE

H100 = DeviceInfo(0, "Fake H100", (9, 0), 132, 227 * 1024, 13000, 13000)
BF16 = ml_dtypes.bfloat16
ADDRESS_BASE, ADDRESS_STEP = 1 << 32, 1 << 24   # far apart: no two fake arrays overlap
_ADDRESSES = itertools.count(ADDRESS_BASE, ADDRESS_STEP)


def fake_memory(nbytes: int, offset: int = 0):
    """A MemoryPointer to nbytes at a fresh fake device address (plus offset)."""
    import cupy
    mem = cupy.cuda.UnownedMemory(next(_ADDRESSES), nbytes + offset, None, device_id=0)
    return cupy.cuda.MemoryPointer(mem, offset)


def fake(shape, dtype=BF16, offset: int = 0):
    """A CuPy array over a fake device address (nothing reads it), 16-byte aligned unless offset says not."""
    import cupy
    dtype = np.dtype(dtype)
    return cupy.ndarray(shape, dtype, memptr=fake_memory(max(int(np.prod(shape)) * dtype.itemsize, 1), offset))


class Recorder:
    """A kernel entry that records (entry, grid, block, parameter bytes, tensor-map bytes) of each launch;
    with record off (a benchmark) it converts the arguments as CuPy's launch does before the driver call
    (a CPointer as it is, a NumPy scalar through CScalar) and counts the launch."""

    launches: list = []
    record = True
    count = 0

    def __init__(self, name: str):
        self.name = name

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        Recorder.count += 1
        if Recorder.record:
            Recorder.launches.append((self.name, grid, block, argument_bytes(args[0], PARAMS_DTYPE.itemsize),
                                      tuple(argument_bytes(a, TENSOR_MAP_DTYPE.itemsize) for a in args[1:])))
        else:
            [_scalar_argument(a) if isinstance(a, np.generic) else a.ptr for a in args]


def _scalar_argument(value):
    from cupy._core._scalar import CScalar   # what cupy.cuda.function._pointer makes of a NumPy scalar
    return CScalar(value)


def argument_bytes(arg, nbytes: int) -> bytes:
    """A kernel argument's bytes: a NumPy scalar's own, or the nbytes a CuPy CPointer points at."""
    return bytes(arg) if isinstance(arg, np.generic) else ctypes.string_at(arg.ptr, nbytes)


def counting(counts: dict, name: str, fn):
    """fn, adding one to counts[name] per call (how often validation or selection ran)."""
    def wrapper(*a, **kw):
        counts[name] += 1
        return fn(*a, **kw)
    return wrapper


def pooled_memory(nbytes: int, _blocks: dict = {}):   # noqa: B006 (the pool)
    """One fake block per size, handed out again and again: CuPy's pool when each output dies before the next
    call allocates (a benchmark loop), so address-keyed caches see what they would on a device."""
    if nbytes not in _blocks:
        _blocks[nbytes] = fake_memory(nbytes)
    return _blocks[nbytes]


@contextmanager
def installed(setattr_, pooled: bool = False) -> Iterator[None]:
    """The fake H100 under the call path while inside; setattr_ is a MonkeyPatch's setattr (undone by its owner),
    the allocator is restored here. pooled: CuPy's allocations reuse one address per size (pooled_memory),
    else each gets a fresh one."""
    import cupy
    allocator = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(pooled_memory if pooled else fake_memory)
    try:
        install(setattr_)
        yield
    finally:
        cupy.cuda.set_allocator(allocator)
        call_cache.invalidate()


def install(setattr_) -> None:
    """The fake H100's functions in place of the device's (allocation: see installed)."""
    call_cache.invalidate()
    Recorder.launches, Recorder.count = [], 0
    for mod in (api, launch_mod, kvcache, backward, varlen):
        setattr_(mod, "device_info", lambda *a: H100)

    def fake_build(spec, config, cc):   # a mask_mod build's tile classifier too (build.AUX_ENTRIES)
        aux = {e: Recorder(e) for e in build.aux_entries(spec, config)}
        return build.LoadedKernel([Recorder(e) for e in spec.entries], 1024, aux)
    for mod in (api, backward):
        setattr_(mod, "build_module", fake_build)
    setattr_(launch_mod, "encode", lambda g: np.frombuffer(
        np.array([g.address] + [0] * 15, dtype=np.uint64).tobytes(), dtype=TENSOR_MAP_DTYPE)[0])
    setattr_(call_cache, "current_device", lambda: 0)
    # kept tile classifications (ModMask, a scalar mask_mod by name) mark and order streams: none here
    setattr_(mod_mask, "mark_stream", lambda: (None, 0))
    setattr_(mod_mask, "order_after", lambda event, stream: None)
    setattr_(mod_mask, "_NAMED", OrderedDict())
    workspaces: dict = {}

    def workspace(nbytes: int):
        if nbytes not in workspaces:
            workspaces[nbytes] = fake((nbytes,), np.uint8)
        return workspaces[nbytes]
    setattr_(call_cache, "workspace", workspace)
