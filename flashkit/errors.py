"""Exception types: every flashkit failure a user can cause is one of these, with a one-line message."""

from __future__ import annotations


class FlashkitError(Exception):
    """Base class of every flashkit error."""


class InputError(FlashkitError, ValueError):
    """An argument is invalid: its message names the argument and what was expected."""


class UnsupportedError(FlashkitError):
    """No kernel (or not the requested one) supports the request; carries every candidate's reasons."""

    def __init__(self, message: str, reasons: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.reasons = reasons or {}


class ManifestError(FlashkitError):
    """A kernel file's manifest is missing, malformed or clashes with another's."""


class CompileError(FlashkitError):
    """NVRTC refused a kernel; the message carries the compiler's log."""


class DeviceError(FlashkitError):
    """No usable CUDA device (or CuPy) where one is needed."""


class FallbackWarning(UserWarning):
    """A call runs on the baseline kernel (`standard`) although faster kernels take its dtype: the message says why each
    of them was rejected."""
