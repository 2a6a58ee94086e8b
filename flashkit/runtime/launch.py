"""Turn a problem into grids, a parameter block and scratch memory, and launch a variant's entries."""

from __future__ import annotations

import math
import threading
from operator import itemgetter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..call.dtypes import BY_NAME, dtype_of_storage
from ..call.validate import Problem
from ..registry.manifest import KernelSpec
from .build import BuildConfig, LoadedKernel
from .device import cupy_module, device_info
from .kv_split import SMEM_RESERVED as SPLIT_SMEM_RESERVED
from .kv_split import plan as split_plan
from .params import ParamTemplate, make_params, merge_fields
from .tile_balance import persistent_balances
from .tma import array_geometry, encode, padded_keys, transposed_v_geometry

LOG2E = 1.4426950408889634
WARP_SIZE = 32
FLOAT32_BYTES = 4
RUNNING_STATE_EXTRA = 2          # m and l beside the head_dim accumulators of each row


def grid_for(kind: str, p: Problem, cfg: dict[str, int]) -> tuple[int, int, int]:
    """The launch grid of a grid kind (docs/kernel-contract.md)."""
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if kind == "q_blocks":
        return (cdiv(p.seqlen_q, cfg["block_m"]), p.heads, p.batch)
    if kind == "tiles":   # q_blocks' tiles on x (hopper/tile_scheduler.cuh); `persistent`: one CTA an SM walks them
        tiles = cdiv(p.seqlen_q, cfg["block_m"]) * p.heads * p.batch
        return (min(tiles, cfg["sm_count"]) if cfg.get("persistent") else tiles, 1, 1)
    if kind == "heads":
        return (p.heads, p.batch, 1)
    if kind == "score_tiles":
        return (cdiv(p.seqlen_k, cfg["block_n"]), cdiv(p.seqlen_q, cfg["block_m"]), p.batch * p.heads)
    if kind == "row_groups":
        return (cdiv(p.seqlen_q, cfg["warps"]), p.heads, p.batch)
    if kind == "kv_tiles":
        return (cdiv(p.seqlen_k, cfg["block_n"]), p.kv_heads, p.batch)
    if kind == "kv_splits":   # cfg carries the split plan (kv_split.plan)
        return (cfg["splits"], cfg["row_blocks"] * p.kv_heads, p.batch)
    if kind == "split_combine":   # one warp per output row; nothing to merge with one split
        return (cdiv(p.batch * p.heads * p.seqlen_q, cfg["warps"]) if cfg["splits"] > 1 else 0, 1, 1)
    raise ValueError(f"unknown grid kind {kind!r}")


def workspace_bytes(kind: str, p: Problem, cfg: dict[str, int], compiled_head_dim: int | None = None) -> int:
    """Bytes of the manifest's workspace kind for a call; compiled_head_dim: the build's head-dim class (the
    backward's dq_accum rows are as wide as the class, a padded call's extra columns staying 0)."""
    if kind == "v_transposed":   # V as (batch, kv_heads, head_dim, keys), keys padded to block_n
        return p.batch * p.kv_heads * p.head_dim * padded_keys(p.seqlen_k, cfg["block_n"]) * BY_NAME[p.dtype].itemsize
    if kind == "scores":
        return p.batch * p.heads * p.seqlen_q * p.seqlen_k * FLOAT32_BYTES
    if kind == "running_state":
        return p.batch * p.heads * p.seqlen_q * (p.head_dim + RUNNING_STATE_EXTRA) * FLOAT32_BYTES
    if kind == "split_partials":   # fp32 O and LSE of every split, none with one split
        rows = p.batch * p.heads * p.seqlen_q
        return cfg["splits"] * rows * (p.head_dim + 1) * FLOAT32_BYTES if cfg["splits"] > 1 else 0
    if kind == "dq_accum":   # backward: dq_accum, lse2, dsum over query rows padded to block_m, semaphores
        m_blocks = -(-p.seqlen_q // cfg["block_m"])
        rows = p.batch * p.heads * m_blocks * cfg["block_m"]
        width = compiled_head_dim or p.head_dim
        return (rows * (width + 2) + p.batch * p.heads * m_blocks) * FLOAT32_BYTES
    return 0


def lse_strides(p: Problem) -> dict[str, int]:
    """Params.lse_*_stride of the dense (batch, heads, seqlen_q) LSE (varlen's extras replace them)."""
    return {"lse_batch_stride": p.heads * p.seqlen_q, "lse_head_stride": p.seqlen_q}


def stride_fields(prefix: str, a) -> dict[str, int]:
    """Params' <prefix>_{batch,row,head}_stride of a (batch, seqlen, heads, D) array, in elements."""
    item = a.itemsize
    return {f"{prefix}_batch_stride": a.strides[0] // item, f"{prefix}_row_stride": a.strides[1] // item,
            f"{prefix}_head_stride": a.strides[2] // item}


@dataclass
class LaunchInputs:
    """Device arrays of one call; extras are pointer/int fields for block masks and fp8 scales."""

    q: Any
    k: Any
    v: Any
    out: Any
    lse: Any = None
    extras: dict[str, int] = field(default_factory=dict)
    map_arrays: dict[str, Any] = field(default_factory=dict)   # tensor-map arrays beyond q, k, v, o (dout)
    # the Params pointer field holding a map_arrays array's address ("dout": "bwd.dout"): a map whose field is
    # among a PreparedLaunch's variable pointers follows that pointer per call
    map_fields: dict[str, str] = field(default_factory=dict)


def launch(spec: KernelSpec, loaded: LoadedKernel, config: BuildConfig, p: Problem, io: LaunchInputs) -> None:
    """Launch every entry of the variant in order on the current stream."""
    prepare_launch(spec, loaded, config, p, io)(io.q, io.k, io.v, io.out, io.lse)


def prepare_launch(spec: KernelSpec, loaded: LoadedKernel, config: BuildConfig, p: Problem, io: LaunchInputs,
                   variable: tuple[str, ...] = ()) -> "PreparedLaunch":
    """Everything a launch decides from the call's signature: split plan, grids, workspace size, the
    parameter block (io's values; q, k, v, o, lse, workspace and the dotted `variable` extras change per
    call) and the tensor maps' geometry."""
    cfg = config.launch_dict
    extras = io.extras
    if cfg.get("persistent"):   # one CTA an SM, unless the static tile order would leave SMs idle (tile_balance.py)
        sms = device_info().sm_count
        balanced = persistent_balances(p.seqlen_q, p.seqlen_k, p.batch * p.heads, cfg["block_m"],
                                       cfg.get("block_n", cfg["block_m"]), config.causal, sms)
        cfg = {**cfg, "sm_count": sms, "persistent": int(balanced)}
    if "kv_splits" in spec.grids:   # the split-KV plan, from this device's SM count and bandwidth
        info = device_info()
        sp = split_plan(p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_k, config.head_dim, cfg, info.sm_count,
                        info.max_smem_per_block + SPLIT_SMEM_RESERVED, info.memory_bandwidth)
        cfg = {**cfg, "splits": sp.splits, "row_blocks": sp.row_blocks}
        extras = merge_fields(extras, {"cache": {"splits": sp.splits, "row_blocks": sp.row_blocks}})
    fields = dict(
        q=io.q.data.ptr, k=io.k.data.ptr, v=io.v.data.ptr, o=io.out.data.ptr, lse=0, workspace=0,
        **stride_fields("q", io.q), **stride_fields("k", io.k), **stride_fields("v", io.v),
        **stride_fields("o", io.out),
        batch=p.batch, heads=p.heads, kv_heads=p.kv_heads, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
        head_dim=p.head_dim, softmax_scale=p.softmax_scale, softmax_scale_log2=p.softmax_scale * LOG2E,
        head_dim_v=p.head_dim_v,   # v's and o's head dim (the FA2 family's padded V / O class; traits.cuh)
        **lse_strides(p))
    fields.update(extras)   # extras may override (varlen's LSE strides; a score_mod functor's softmax: log2(e))
    params = make_params(**fields)
    grids = [(fn, grid, loaded.smem_of(i)) for i, (fn, kind) in enumerate(zip(loaded.functions, spec.grids))
             if math.prod(grid := grid_for(kind, p, cfg)) != 0]
    maps = tensor_map_layouts(spec, cfg, p, io, tuple(variable))
    return PreparedLaunch(ParamTemplate(params, POINTER_FIELDS + tuple(variable)), grids,
                          (cfg["warps"] * WARP_SIZE, 1, 1), workspace_bytes(spec.workspace, p, cfg, config.head_dim), maps)


POINTER_FIELDS = ("q", "k", "v", "o", "lse", "workspace")
# Tensor maps whose address changes per call: the index of that pointer in a launch's pointers (POINTER_FIELDS
# order; vt: the workspace, where the pre-pass writes V transposed).
MAP_POINTERS = {"q": 0, "k": 1, "v": 2, "o": 3, "vt": POINTER_FIELDS.index("workspace")}


MAX_MAP_ADDRESSES = 64           # address tuples whose encoded tensor maps a PreparedLaunch keeps at hand


class PreparedLaunch:
    """One signature's launch: call it with the call's arrays (and the variable extras' pointers).

    It owns one parameter block, rewritten in place per call (only the pointers change) and handed to the
    kernels by address: CuPy's launch copies a CPointer's bytes as they are, where a NumPy structured scalar
    costs it a conversion of about 2 us per entry. The driver copies kernel parameters when a launch is
    queued, so the block is free again once the launches return; a lock keeps two threads from rewriting it
    under each other's launch (CuPy releases the GIL inside it).
    """

    def __init__(self, params: ParamTemplate, grids: list, block: tuple[int, int, int], workspace_bytes: int,
                 maps: tuple):
        self.params = params
        self.grids = grids                    # (function, grid, dynamic smem) of each entry that runs, in order
        self.block = block
        self.workspace_bytes = workspace_bytes
        self.maps = maps                      # (pointer index (MAP_POINTERS), or None; MapGeometry)
        # The call's addresses that the maps depend on (one C-level call per launch: this is the hot path).
        indices = sorted({i for i, _ in maps if i is not None})
        self._map_key = itemgetter(*indices) if indices else (lambda pointers: ())
        self._words = params.block()
        from cupy.cuda.function import CPointer   # a kernel argument passed as the bytes at an address
        self._cpointer = CPointer
        self._block_arg = CPointer(self._words.ctypes.data)
        self._lock = threading.Lock()
        self._maps_at: dict[tuple, tuple] = {}

    def __call__(self, q, k, v, out, lse=None, extra: tuple[int, ...] = (), workspace=None) -> None:
        """Launch on the current stream; workspace (None: a fresh one) must hold workspace_bytes."""
        if workspace is None and self.workspace_bytes:
            cupy = cupy_module()
            workspace = cupy.empty(self.workspace_bytes, dtype=cupy.uint8)
        self.run((q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr if lse is not None else 0,
                  workspace.data.ptr if workspace is not None else 0) + extra)

    def run(self, pointers: tuple[int, ...], stream: Any = None) -> None:
        """Launch at the call's addresses: POINTER_FIELDS' in order, then the variable extras'; on stream (anything
        with the handle as .ptr, as CuPy's launch reads it), or CuPy's current stream."""
        with self._lock:
            self.params.write(self._words, pointers)
            args = (self._block_arg, *self._encoded(pointers)) if self.maps else (self._block_arg,)
            for fn, grid, smem in self.grids:
                fn(grid, self.block, args, shared_mem=smem, stream=stream)

    def _encoded(self, pointers: tuple[int, ...]) -> tuple:
        """The tensor maps at the call's addresses, as kernel arguments; a repeated address tuple (a memory pool
        hands the same blocks back) costs a dictionary look-up instead of building and hashing a geometry per map.

        The maps' bytes are kept in one array and passed by address, as the parameter block is (CPointer): a
        NumPy scalar argument costs CuPy's launch a conversion of microseconds per map and launch."""
        ptrs = self._map_key(pointers)
        found = self._maps_at.get(ptrs)
        if found is None:
            if len(self._maps_at) >= MAX_MAP_ADDRESSES:
                self._maps_at.clear()
            maps = np.array([encode(g if i is None else replace(g, address=pointers[i])) for i, g in self.maps])
            base, size = maps.ctypes.data, maps.dtype.itemsize
            found = self._maps_at[ptrs] = (maps, tuple(self._cpointer(base + j * size) for j in range(len(maps))))
        return found[1]


def tensor_map_layouts(spec: KernelSpec, cfg: dict[str, int], p: Problem, io: LaunchInputs,
                       variable: tuple[str, ...] = ()) -> tuple:
    """(pointer index in MAP_POINTERS; geometry with address 0) of each tensor map, checked on io's arrays:
    a later call of the same signature (strides, 16-byte alignment) only puts its address in. A map of
    another tensor (the backward's dout, from io.map_arrays) follows its Params field when that field is one of
    the `variable` pointers (index len(POINTER_FIELDS) + its place there), else keeps its address:
    (None, geometry)."""
    out_dtype = dtype_of_storage(io.out.dtype)
    arrays = {"q": (io.q, p.dtype), "k": (io.k, p.dtype), "v": (io.v, p.dtype),
              "o": (io.out, out_dtype.name if out_dtype else p.dtype)}
    layouts = []
    for t, rows in spec.tensor_map_rows(cfg, p.head_dim).items():
        if t == "vt":
            layouts.append((MAP_POINTERS[t], transposed_v_geometry(p.dtype, BY_NAME[p.dtype].itemsize, p.batch, p.kv_heads,
                                                                  p.head_dim, p.seqlen_k, cfg["block_n"], rows)))
        elif t in arrays:
            layouts.append((MAP_POINTERS[t], replace(array_geometry(arrays[t][0], arrays[t][1], rows), address=0)))
        elif t in io.map_arrays:
            geometry = array_geometry(io.map_arrays[t], p.dtype, rows)
            field_name = io.map_fields.get(t)
            if field_name in variable:
                layouts.append((len(POINTER_FIELDS) + variable.index(field_name), replace(geometry, address=0)))
            else:
                layouts.append((None, geometry))
        else:
            raise ValueError(f"{spec.name}: tensor map {t!r} needs the array in LaunchInputs.map_arrays")
    return tuple(layouts)
