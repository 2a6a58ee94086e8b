"""The CUDA device as flashkit sees it, with one clear error where there is none."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import DeviceError


def cupy_module():
    """CuPy, or DeviceError naming the extra to install."""
    try:
        import cupy
    except ImportError:
        raise DeviceError("CuPy is not installed: pip install 'flashkit[cuda12]' or 'flashkit[cuda13]'") from None
    return cupy


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    cc: tuple[int, int]
    sm_count: int
    max_smem_per_block: int
    driver: int
    runtime: int
    memory_bandwidth: float = 0.0   # peak DRAM bytes a second (memory clock x 2 x bus width); 0 where not reported

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


def device_count() -> int:
    try:
        return cupy_module().cuda.runtime.getDeviceCount()
    except Exception:
        return 0


@lru_cache(maxsize=None)
def device_info(index: int | None = None) -> DeviceInfo:
    """Properties of a device (the current one by default); DeviceError if there is none."""
    cupy = cupy_module()
    if device_count() == 0:
        raise DeviceError("no CUDA device found: this command needs an NVIDIA GPU "
                          "(use --arch to compile without one)")
    rt = cupy.cuda.runtime
    idx = cupy.cuda.Device().id if index is None else index
    props = rt.getDeviceProperties(idx)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceInfo(idx, name, (props["major"], props["minor"]), props["multiProcessorCount"],
                      props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"]),
                      rt.driverGetVersion(), rt.runtimeGetVersion(), peak_memory_bandwidth(rt, idx))


DDR = 2   # HBM and GDDR move data on both clock edges
BITS_PER_BYTE = 8


def peak_memory_bandwidth(rt, index: int) -> float:
    """Peak DRAM bandwidth in bytes a second from the driver's memory clock (kHz) and bus width (bits); 0.0 where the
    driver does not report them."""
    try:
        khz = rt.deviceGetAttribute(rt.cudaDevAttrMemoryClockRate, index)
        bits = rt.deviceGetAttribute(rt.cudaDevAttrGlobalMemoryBusWidth, index)
    except Exception:
        return 0.0
    return float(khz) * 1e3 * DDR * bits / BITS_PER_BYTE


def require_device() -> DeviceInfo:
    return device_info()
