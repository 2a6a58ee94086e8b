"""PyTorch, imported only when the ring is used: `import flashkit` never imports torch."""

from __future__ import annotations

from .errors import TorchMissingError


def require_torch():
    """The torch module (with torch.distributed), or TorchMissingError naming the extra."""
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError as e:
        raise TorchMissingError("flashkit.distributed needs PyTorch (an optional extra): "
                                f"pip install 'flashkit[torch]' ({e})") from None
    if not torch.distributed.is_available():
        raise TorchMissingError("flashkit.distributed needs a PyTorch build with torch.distributed")
    return torch


def is_torch_tensor(x) -> bool:
    """True for a torch.Tensor, without importing torch."""
    return type(x).__module__.startswith("torch")
