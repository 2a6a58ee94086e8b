"""ModMask: a mask_mod functor bound to its arguments, its tiles classified once per kernel geometry and reused:
flashkit's create_block_mask (flex_attention's), for drop-in functors.

`attention(..., mod="document", mod_args={...})` classifies the functor's tiles in every call (functor.cuh's
classify / compact entries: a mask_mod evaluation per element of every tile the causal / window mask leaves),
because the arguments' contents may have changed since the last call. A model calls every layer with the same
document ids, so that work repeats. A ModMask is a snapshot instead, as flex's BlockMask is:

    docs = flashkit.ModMask("document", {"doc_ids": doc_ids})
    out = flashkit.attention(q, k, v, causal=True, mod=docs)                         # classified here, kept
    dq, dk, dv = flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, mod=docs)   # its own tiles

The first call of each kernel geometry (forward or backward, variant, build, problem, modifications, device)
classifies and keeps the result (the forward's tile lists, the backward's visit lists); later calls of that
geometry launch the attention alone. After writing an argument array in place, call refresh(), which makes the
next calls classify again.

The kept buffers are read by later launches on any stream: a launch on another stream than the classifying one
first waits on the classification's event (an ordering of streams, no host wait).

A mask_mod called by name whose arguments are all scalars (prefix_lm) has nothing that can change behind the call's
back: its mask is a function of the indices and of scalars that are part of the call's signature. Such calls keep
their classifications the same way, under that signature (`named_tiles`), a few signatures and geometries at most.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..errors import InputError
from .mask_handles import register

MAX_GEOMETRIES = 16   # kept classifications per mask (least recently used dropped first)
NAMED_SIGNATURES = 8  # scalar-argument mask_mods by name: signatures kept (least recently used dropped first)
NAMED_GEOMETRIES = 4  # and kernel geometries a signature (a forward and a backward, at two lengths)


class KeptTiles:
    """Tile classifications (or backward visit lists) kept per kernel geometry key, each with the event that
    ends its classifying launches; at most `limit`, the least recently used dropped first."""

    def __init__(self, limit: int = MAX_GEOMETRIES):
        self._limit = limit
        self._held: OrderedDict[tuple, tuple[Any, Any, int]] = OrderedDict()

    def refresh(self) -> None:
        """Forget every kept classification: the next call of each geometry classifies the arguments as they are
        then (after an argument array was written in place)."""
        self._held.clear()

    def held(self, key: tuple) -> Any:
        """The classification kept for key (the current stream ordered after it), or None."""
        entry = self._held.get(key)
        if entry is None:
            return None
        buffers, event, stream_ptr = entry
        self._held.move_to_end(key)
        order_after(event, stream_ptr)
        return buffers

    def hold(self, key: tuple, buffers: Any) -> None:
        """Keep buffers, classified by launches just queued on the current stream, for later calls of key."""
        self._held[key] = (buffers, *mark_stream())
        self._held.move_to_end(key)
        while len(self._held) > self._limit:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        """How many kernel geometries hold a classification."""
        return len(self._held)


class ModMask(KeptTiles):
    """A mask_mod functor (docs/functors.md) with its arguments, for attention(..., mod=ModMask(...)) and
    attention_backward(..., mod=...): its tile classification is computed on first use per kernel geometry and
    reused, a snapshot of the arguments' contents (refresh() after changing them)."""

    def __init__(self, mod: str, mod_args: dict | None = None):
        if not isinstance(mod, str):
            raise InputError(f"mod: expected a functor name (str), got {type(mod).__name__}")
        from ..registry import discover_kernels
        spec = discover_kernels().get_mod(mod)
        if not spec.mask:
            raise InputError(f"mod: {mod!r} has no mask_mod, which a ModMask classifies; pass mod={mod!r} "
                             "to attention() itself")
        if mod_args is not None and not isinstance(mod_args, dict):
            raise InputError(f"mod_args: expected a dict of {mod!r}'s arguments, got {type(mod_args).__name__}")
        self.mod = mod
        # CUDA arrays of other libraries (torch tensors) as CuPy views, once: a call on CuPy arrays takes the call
        # cache's path, and the view keeps the tensor alive as long as the mask.
        self.mod_args = {name: _device_view(value, name) for name, value in (mod_args or {}).items()}
        super().__init__()
        self.handle = register(self)   # how a torch op names this mask (mask_handles.py)

    def __repr__(self) -> str:
        return f"ModMask({self.mod!r}, args={sorted(self.mod_args)}, {len(self._held)} classified)"


def unwrap_mod(mod: Any, mod_args: Any) -> tuple[Any, Any, ModMask | None]:
    """(functor name, its arguments, the ModMask or None) of a call's mod / mod_args: a ModMask carries both."""
    if type(mod) is not ModMask:
        return mod, mod_args, None
    if mod_args is not None:
        raise InputError("mod_args: a ModMask carries its arguments; pass mod=ModMask(name, mod_args) alone")
    return mod.mod, mod.mod_args, mod


def call_tiles(mod: Any, mod_args: Any) -> tuple[Any, Any, KeptTiles | None, tuple | None]:
    """(functor name, its arguments, where its tiles are kept or None, its signature: functors.functor_signature)
    of a call's mod / mod_args: a ModMask's own tiles, else a scalar-argument mask_mod's named_tiles."""
    from .functors import functor_signature
    mod, mod_args, mask = unwrap_mod(mod, mod_args)
    signature = functor_signature(mod, mod_args)
    return mod, mod_args, mask if mask is not None else named_tiles(mod, signature), signature


_NAMED: OrderedDict[tuple, KeptTiles] = OrderedDict()


def named_tiles(mod: Any, signature: tuple | None) -> KeptTiles | None:
    """The kept tiles of a mask_mod called by name whose arguments are all scalars, under its signature (the name,
    the file's state, each scalar with its type: functors.functor_signature); None for any other call (an array
    argument's contents may change between calls, so those classify every call)."""
    if signature is None:
        return None
    tiles = _NAMED.get(signature)   # (a kept signature was checked when it was first seen: its file state is in it)
    if tiles is None:
        from ..registry import discover_kernels
        spec = discover_kernels().mods.get(mod)
        if spec is None or not spec.mask or any(a.kind == "pointer" for a in spec.args):
            return None
        tiles = _NAMED[signature] = KeptTiles(NAMED_GEOMETRIES)
        while len(_NAMED) > NAMED_SIGNATURES:
            _NAMED.popitem(last=False)
    _NAMED.move_to_end(signature)
    return tiles


def mark_stream() -> tuple[Any, int]:
    """(an event recorded on the current stream, the stream's handle): where the launches queued so far end."""
    from ..runtime.device import cupy_module
    cupy = cupy_module()
    stream = cupy.cuda.get_current_stream()
    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    return event, stream.ptr


def order_after(event: Any, stream_ptr: int) -> None:
    """Make the current stream's later work wait for event, recorded on stream_ptr (nothing on that stream: it
    runs its launches in order)."""
    from ..runtime.device import cupy_module
    stream = cupy_module().cuda.get_current_stream()
    if stream.ptr != stream_ptr:
        stream.wait_event(event)


def _device_view(value: Any, name: str) -> Any:
    """value as a CuPy view when it is a CUDA array of another library; anything else as given (the call's checks
    name what is wrong with it)."""
    if isinstance(value, (int, float)) or type(value).__module__.startswith(("cupy", "numpy")):
        return value
    from .block_mask import _is_cuda_dlpack
    if hasattr(value, "__cuda_array_interface__") or (hasattr(value, "__dlpack_device__") and _is_cuda_dlpack(value)):
        from ..call.arrays import to_cupy
        return to_cupy(value, f"mod_args['{name}']")
    return value
