"""A GPU-less stand-in for the device under the whole call path (selection, build, tensor maps, allocation,
workspaces), shared by the call-cache tests and `scripts/bench_host.py --fake`.

CuPy arrays live over fake device addresses (nothing reads them); kernel entries are Recorders that keep each
launch's parameter bytes, so a test can compare the cached path with the full one bit for bit.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from flashkit import api, kvcache
from flashkit.runtime import build, call_cache
from flashkit.runtime import launch as launch_mod
from flashkit.runtime.device import DeviceInfo
from flashkit.runtime.tma import TENSOR_MAP_DTYPE

H100 = DeviceInfo(0, "Fake H100", (9, 0), 132, 227 * 1024, 13000, 13000)
BF16 = ml_dtypes.bfloat16
ADDRESS_BASE, ADDRESS_STEP = 1 << 32, 1 << 24   # far apart: no two fake arrays overlap
_ADDRESSES = itertools.count(ADDRESS_BASE, ADDRESS_STEP)


def fake(shape, dtype=BF16, offset: int = 0):
    """A CuPy array over a fake device address (nothing reads it), 16-byte aligned unless offset says not."""
    import cupy
    dtype = np.dtype(dtype)
    nbytes = max(int(np.prod(shape)) * dtype.itemsize, 1) + offset
    mem = cupy.cuda.UnownedMemory(next(_ADDRESSES), nbytes, None, device_id=0)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(mem, offset))


class Recorder:
    """A kernel entry that records (entry, grid, block, parameter bytes, tensor-map bytes) of each launch;
    with record off (a benchmark) it only counts them."""

    launches: list = []
    record = True
    count = 0

    def __init__(self, name: str):
        self.name = name

    def __call__(self, grid, block, args, shared_mem=0):
        Recorder.count += 1
        if Recorder.record:
            Recorder.launches.append((self.name, grid, block, bytes(args[0]), tuple(bytes(a) for a in args[1:])))


def install(setattr_) -> None:
    """Put the fake H100 under the call path; setattr_ is a MonkeyPatch's setattr (undone by its owner)."""
    import cupy
    call_cache.invalidate()
    Recorder.launches, Recorder.count = [], 0
    for mod in (api, launch_mod, kvcache):
        setattr_(mod, "device_info", lambda *a: H100)

    def fake_build(spec, config, cc):
        return build.LoadedKernel([Recorder(e) for e in spec.entries], 1024)
    setattr_(api, "build_module", fake_build)
    setattr_(launch_mod, "encode", lambda g: np.frombuffer(
        np.array([g.address] + [0] * 15, dtype=np.uint64).tobytes(), dtype=TENSOR_MAP_DTYPE)[0])
    setattr_(cupy, "empty", lambda shape, dtype=float: fake(shape if isinstance(shape, tuple) else (shape,), dtype))
    setattr_(call_cache, "current_device", lambda: 0)
    workspaces: dict = {}
    setattr_(call_cache, "workspace", lambda n: workspaces.setdefault(n, fake((n,), np.uint8)))
