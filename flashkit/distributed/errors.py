"""Errors of the distributed layer: each a FlashkitError, raised on every rank alike where it can be."""

from __future__ import annotations

from ..errors import FlashkitError, InputError


class DistributedError(FlashkitError):
    """A process group, collective or transfer failed (or the distributed extra is missing)."""


class TorchMissingError(DistributedError, ImportError):
    """flashkit.distributed's ring needs PyTorch, an optional extra: pip install 'flashkit[torch]'."""


class RankMismatchError(DistributedError, InputError):
    """The ranks of a group called with inconsistent inputs; found before the first transfer."""


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A collective did not complete in time (a rank did not join, or died)."""
