"""The NumPy mirror of `flashkit::Params` (include/flashkit/params.cuh), passed to kernels by value."""

from __future__ import annotations

import struct

import numpy as np

POINTERS = ("q", "k", "v", "o", "lse", "workspace", "kv_block_count", "kv_block_index",
            "q_scale", "k_scale", "v_scale")
STRIDES = tuple(f"{t}_{s}_stride" for t in "qkvo" for s in ("batch", "row", "head"))
INTS = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim",
        "mask_batch", "mask_heads", "mask_q_blocks", "mask_k_blocks", "mask_block_q", "mask_block_k",
        "scale_block_rows", "q_scale_blocks", "k_scale_blocks")
FLOATS = ("softmax_scale", "softmax_scale_log2")

# The backward's nested block (`BwdParams bwd`, appended last so every forward offset is unchanged).
BWD_POINTERS = ("dout", "dq", "dk", "dv")
BWD_STRIDES = tuple(f"{t}_{s}_stride" for t in ("do", "dq", "dk", "dv") for s in ("batch", "row", "head"))
BWD_INTS = ("deterministic", "order_pairs")
BWD_DTYPE = np.dtype([(n, np.uint64) for n in BWD_POINTERS] + [(n, np.int64) for n in BWD_STRIDES]
                     + [(n, np.int32) for n in BWD_INTS], align=True)

# The KV-cache block (`KvCacheParams cache`, appended after bwd so every earlier offset is unchanged).
CACHE_POINTERS = ("block_table", "seqlens")
CACHE_STRIDES = ("table_batch_stride",)
CACHE_INTS = ("page_size", "splits", "row_blocks")
CACHE_DTYPE = np.dtype([(n, np.uint64) for n in CACHE_POINTERS] + [(n, np.int64) for n in CACHE_STRIDES]
                       + [(n, np.int32) for n in CACHE_INTS], align=True)

# The modifications block (`ModParams mods`, appended after cache so every earlier offset is unchanged).
MODS_POINTERS = ("alibi_slopes",)
MODS_STRIDES = ("alibi_batch_stride", "alibi_head_stride")
MODS_INTS = ("window_left", "window_right", "chunk")
MODS_FLOATS = ("softcap", "softcap_in", "softcap_out", "inv_softmax_scale")
# A drop-in functor's arguments (`ModArgs args`, inside ModParams) and mask_mod's tile lists, after the built-ins.
MOD_ARG_POINTERS, MOD_ARG_INTS, MOD_ARG_FLOATS = 2, 4, 4
MOD_ARGS_DTYPE = np.dtype([("ptr", np.uint64, (MOD_ARG_POINTERS,)), ("ints", np.int32, (MOD_ARG_INTS,)),
                           ("floats", np.float32, (MOD_ARG_FLOATS,)), ("seqlen_q", np.int32),
                           ("seqlen_k", np.int32)], align=True)
TILE_POINTERS = ("tile_count", "tile_list", "tile_state")
TILE_INTS = ("tile_batch", "tile_heads", "q_tiles", "k_tiles")
MODS_DTYPE = np.dtype([(n, np.uint64) for n in MODS_POINTERS] + [(n, np.int64) for n in MODS_STRIDES]
                      + [(n, np.int32) for n in MODS_INTS] + [(n, np.float32) for n in MODS_FLOATS]
                      + [("args", MOD_ARGS_DTYPE)] + [(n, np.uint64) for n in TILE_POINTERS]
                      + [(n, np.int32) for n in TILE_INTS], align=True)

# The varlen block (`VarlenParams varlen`) and the LSE's strides, appended after mods.
VARLEN_POINTERS = ("cu_seqlens_q", "cu_seqlens_k")
VARLEN_DTYPE = np.dtype([(n, np.uint64) for n in VARLEN_POINTERS], align=True)
LSE_STRIDES = ("lse_batch_stride", "lse_head_stride")
# Then the head dim of v and o (head_dim_v: MLA's 128 under 192), after every earlier field, and the backward's
# visit lists (`BwdListParams bwd_lists`: a block mask's or a mask_mod's, bwd_mask.cuh) after it.
BWD_LIST_POINTERS = ("count", "list", "rank")
BWD_LIST_INTS = ("batch", "heads", "q_tiles", "k_tiles")
BWD_LIST_DTYPE = np.dtype([(n, np.uint64) for n in BWD_LIST_POINTERS] + [(n, np.int32) for n in BWD_LIST_INTS],
                          align=True)

# align=True lays the fields out as a C compiler does (natural alignment, padded to 8).
PARAMS_DTYPE = np.dtype(
    [(n, np.uint64) for n in POINTERS] + [(n, np.int64) for n in STRIDES]
    + [(n, np.int32) for n in INTS] + [(n, np.float32) for n in FLOATS] + [("bwd", BWD_DTYPE)]
    + [("cache", CACHE_DTYPE)] + [("mods", MODS_DTYPE)] + [("varlen", VARLEN_DTYPE)]
    + [(n, np.int64) for n in LSE_STRIDES] + [("head_dim_v", np.int32)] + [("bwd_lists", BWD_LIST_DTYPE)],
    align=True)


def flat_fields(dtype: np.dtype = PARAMS_DTYPE, prefix: str = "", base: int = 0):
    """(dotted name, scalar dtype, absolute offset) of every leaf field, nested blocks flattened ('bwd.dq'),
    C arrays by element ('mods.args.ptr[1]')."""
    out = []
    for name in dtype.names:
        sub, off = dtype.fields[name][:2]
        if sub.names:
            out += flat_fields(sub, f"{prefix}{name}.", base + off)
        elif sub.subdtype is not None:   # a C array: one leaf per element ('mods.args.ints[0]')
            item, (count,) = sub.subdtype
            out += [(f"{prefix}{name}[{i}]", item, base + off + i * item.itemsize) for i in range(count)]
        else:
            out.append((f"{prefix}{name}", sub, base + off))
    return out


def make_params(**fields) -> np.ndarray:
    """A zeroed parameter block with the given fields set; unknown names raise KeyError."""
    block = np.zeros((), dtype=PARAMS_DTYPE)
    for name, value in fields.items():
        if name not in PARAMS_DTYPE.names:
            raise KeyError(f"Params has no field {name!r}")
        _assign(block, name, value, "Params")
    return block


def merge_fields(base: dict, more: dict) -> dict:
    """base's make_params fields with more's on top; a nested block given on both sides ('mods': {...}) merges
    field by field."""
    out = dict(base)
    for name, value in more.items():
        both = isinstance(value, dict) and isinstance(out.get(name), dict)
        out[name] = {**out[name], **value} if both else value
    return out


def _assign(block: np.ndarray, name: str, value, where: str) -> None:
    """block[name] = value; a nested block is given as a dict of its fields (nested blocks too)."""
    sub = block.dtype.fields[name][0]
    if not sub.names:
        block[name] = value
        return
    unknown = set(value) - set(sub.names)
    if unknown:
        raise KeyError(f"{where}.{name} has no field {sorted(unknown)[0]!r}")
    for key, item in value.items():
        _assign(block[name], key, item, f"{where}.{name}")


FIELD_OFFSETS = {name: off for name, _, off in flat_fields()}   # dotted leaf name -> byte offset


POINTER_BYTES = 8               # every pointer field is a uint64 at an 8-byte aligned offset


class ParamTemplate:
    """A parameter block built once; only the named pointer fields change per call.

    The repeated-call path (runtime/call_cache.py): every field but the pointers is fixed by the call's
    signature. The pointers are written with one struct.pack_into per run of adjacent fields (q..workspace are
    one run), the cheapest way to patch a few words of a block from Python (a structured copy costs
    microseconds, per-word NumPy stores about a tenth of one each).
    """

    def __init__(self, block: np.ndarray, pointers: tuple[str, ...]):
        offsets = FIELD_OFFSETS
        unknown = [n for n in pointers if n not in offsets]
        if unknown:
            raise KeyError(f"Params has no field {unknown[0]!r}")
        self._words = np.frombuffer(np.asarray(block, dtype=PARAMS_DTYPE).tobytes(), dtype=np.uint64).copy()
        self._runs = pointer_runs(tuple(offsets[n] for n in pointers))
        self._given = tuple(int(self._words[offsets[n] // POINTER_BYTES]) for n in pointers)   # the block's own
        self.pointers = pointers

    def block(self) -> np.ndarray:
        """A fresh copy of the template's bytes, as 64-bit words (a buffer for write())."""
        return self._words.copy()

    def write(self, words: np.ndarray, values: tuple[int, ...]) -> None:
        """words (a block()) with pointers[i] = values[i]; pointers past the values given keep the block's."""
        if len(values) < len(self._given):
            values = values + self._given[len(values):]
        for packer, offset, first, end in self._runs:
            packer.pack_into(words, offset, *values[first:end])

    def fill(self, *values: int) -> np.void:
        """The block with pointers[i] = values[i], as the structured scalar a kernel takes by value."""
        words = self.block()
        self.write(words, values)
        return np.frombuffer(words, dtype=PARAMS_DTYPE)[0]


def pointer_runs(offsets: tuple[int, ...]) -> tuple:
    """(struct packer, byte offset, first value index, end index) of each run of adjacent pointer fields."""
    runs, first = [], 0
    for i in range(1, len(offsets) + 1):
        if i == len(offsets) or offsets[i] != offsets[i - 1] + POINTER_BYTES:
            runs.append((struct.Struct(f"<{i - first}Q"), offsets[first], first, i))
            first = i
    return tuple(runs)
