"""flashkit: attention kernels for NVIDIA GPUs, compiled at run time through CuPy/NVRTC."""

from .api import attention, explain, variants
from .backward import attention_backward, attention_varlen_backward
from .kvcache import attention_with_kvcache
from .varlen import attention_varlen
from .errors import (CompileError, DeviceError, FallbackWarning, FlashkitError, InputError, ManifestError,
                     UnsupportedError)

__version__ = "0.1.0"


def __getattr__(name: str):
    # BlockMask, ModMask and quantize_fp8 import lazily: they pull in CuPy-side code only when used.
    if name == "BlockMask":
        from .features.block_mask import BlockMask
        return BlockMask
    if name == "ModMask":
        from .features.mod_mask import ModMask
        return ModMask
    if name == "quantize_fp8":
        from .features.fp8 import quantize_fp8
        return quantize_fp8
    raise AttributeError(f"module 'flashkit' has no attribute {name!r}")


__all__ = ["attention", "attention_backward", "attention_varlen_backward", "attention_with_kvcache", "attention_varlen",
           "explain", "variants", "BlockMask", "ModMask", "quantize_fp8", "FlashkitError", "InputError",
           "UnsupportedError", "ManifestError", "CompileError", "DeviceError", "FallbackWarning", "__version__"]
