"""BlockMask: which (query block, key block) pairs attend, and the compressed form the kernel walks.

A mask is a boolean block array of shape (batch or 1, heads or 1, q_blocks, k_blocks), with
q_blocks = ceil(seqlen_q / block_q) and k_blocks = ceil(seqlen_k / block_k); a kept block is
wholly visible (a ragged last block covers only the keys / queries that exist). It is compressed
once, with array operations in the module of its data (CuPy on the GPU, NumPy on the CPU), into
what the `block_sparse` kernel reads per query block (docs/kernel-contract.md):
  kv_block_count  int32 (B|1, H|1, q_blocks)            how many key blocks it keeps
  kv_block_index  int32 (B|1, H|1, q_blocks, k_blocks)  their indices, ascending; then -1 padding

Block size: block_q and block_k are multiples of BLOCK_MULTIPLE (128; default 128 x 128), because
the kernel's tiles (block_m 128, block_n 64) must nest inside mask blocks. The mask is reusable across
calls; its device copy is made once. Combine with `causal=True` in `flashkit.attention` for the exact
element causal mask on top of the blocks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InputError
from .mask_handles import register

BLOCK_MULTIPLE = 128        # kernel tiles (block_m, block_n) divide this: mask blocks are multiples of it
DEFAULT_BLOCK = 128
INDEX_PAD = -1              # kv_block_index entries past the count (never read by the kernel)
INT32_LIMIT = 2**31 - 1     # the kernel addresses the compressed arrays with int offsets


def _module_of(x: Any):
    """numpy or cupy, whichever x belongs to (CUDA arrays of other libraries become CuPy)."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    if hasattr(x, "__cuda_array_interface__") or (hasattr(x, "__dlpack_device__") and _is_cuda_dlpack(x)):
        import cupy
        return cupy
    return np


def _is_cuda_dlpack(x: Any) -> bool:
    try:
        return int(x.__dlpack_device__()[0]) in (2, 3)   # kDLCUDA, kDLCUDAHost
    except Exception:
        return False


def default_module():
    """CuPy when a CUDA device answers, else NumPy: where the helpers build their masks."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:
        pass
    return np


def _check_block(block_q: Any, block_k: Any) -> tuple[int, int]:
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0 or b % BLOCK_MULTIPLE:
            raise InputError(f"block_mask: {name} must be a positive multiple of {BLOCK_MULTIPLE} "
                             f"(the kernel's tiles nest in mask blocks), got {b!r}")
    return int(block_q), int(block_k)


def _block_sizes(block: Any) -> tuple[int, int]:
    """block=128 or (block_q, block_k)."""
    if isinstance(block, (tuple, list)) and len(block) == 2:
        return _check_block(*block)
    return _check_block(block, block)


def _check_seqlen(name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"block_mask: {name} must be an int >= 1, got {n!r}")
    return int(n)


def compress(blocks, xp):
    """(count, index) of a boolean (B, H, Q, K) block array: per row, how many kept and which, ascending.

    Array operations only: kept blocks are ranked by a running sum and scattered to their rank.
    """
    rows_shape, k_blocks = blocks.shape[:-1], blocks.shape[-1]
    count = blocks.sum(axis=-1, dtype=xp.int32)
    kept_rank = xp.cumsum(blocks, axis=-1, dtype=xp.int32) - 1
    dropped_rank = xp.cumsum(~blocks, axis=-1, dtype=xp.int32) - 1 + count[..., None]
    position = xp.where(blocks, kept_rank, dropped_rank)   # a permutation of each row
    n_rows = math.prod(rows_shape)
    flat = (xp.arange(n_rows, dtype=xp.int64)[:, None] * k_blocks + position.reshape(n_rows, k_blocks)).ravel()
    index = xp.empty(n_rows * k_blocks, dtype=xp.int32)
    index[flat] = xp.tile(xp.arange(k_blocks, dtype=xp.int32), n_rows)
    index = index.reshape(blocks.shape)
    index = xp.where(xp.arange(k_blocks, dtype=xp.int32) < count[..., None], index, xp.int32(INDEX_PAD))
    return count, index.astype(xp.int32)


def _bool_4d(x, xp, what: str, expected_shape: str):
    """x as a 4-d boolean array ((sq, sk)-like 2-d input gains two broadcast dims); InputError otherwise."""
    arr = xp.asarray(x)
    if arr.dtype != xp.bool_:
        raise InputError(f"block_mask: expected a boolean {what}, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[None, None]
    if arr.ndim != 4 or 0 in arr.shape:
        raise InputError(f"block_mask: expected {expected_shape}, got {tuple(arr.shape)}")
    return arr


class BlockMask:
    """A block-sparsity pattern for `flashkit.attention(..., block_mask=)`; build with the classmethods."""

    def __init__(self, blocks, block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK,
                 seqlen_q: int | None = None, seqlen_k: int | None = None):
        xp = _module_of(blocks)
        arr = _bool_4d(blocks, xp, "block array", "a non-empty block array of shape (batch or 1, heads or 1, "
                       "q_blocks, k_blocks) or (q_blocks, k_blocks)")
        if arr.size > INT32_LIMIT:
            raise InputError(f"block_mask: {arr.size} blocks; at most {INT32_LIMIT} are supported")
        self.block_q, self.block_k = _check_block(block_q, block_k)
        self.seqlen_q = None if seqlen_q is None else _check_seqlen("seqlen_q", seqlen_q)
        self.seqlen_k = None if seqlen_k is None else _check_seqlen("seqlen_k", seqlen_k)
        for name, n, blk, have in (("seqlen_q", self.seqlen_q, self.block_q, arr.shape[2]),
                                   ("seqlen_k", self.seqlen_k, self.block_k, arr.shape[3])):
            if n is not None and -(-n // blk) != have:
                raise InputError(f"block_mask: {name}={n} needs ceil({n}/{blk})={-(-n // blk)} blocks, "
                                 f"the block array has {have}")
        self._xp = xp
        self._blocks = xp.ascontiguousarray(arr)
        self.kv_block_count, self.kv_block_index = compress(self._blocks, xp)   # converted once
        self._density: float | None = None
        self._device: dict = {}   # device id -> (count, index) CuPy copies; ("blocks", id) -> the block array
        self.handle = register(self)   # how a torch op names this mask (mask_handles.py)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_blocks(cls, blocks, block: int | tuple[int, int] = DEFAULT_BLOCK, *,
                    seqlen_q: int | None = None, seqlen_k: int | None = None) -> "BlockMask":
        """From a boolean (B|1, H|1, ceil(sq/block_q), ceil(sk/block_k)) array (NumPy, CuPy or CUDA).

        Seqlens are optional; when given, calls must match them exactly.
        """
        bq, bk = _block_sizes(block)
        return cls(blocks, bq, bk, seqlen_q, seqlen_k)

    @classmethod
    def from_dense(cls, mask, block: int | tuple[int, int] = DEFAULT_BLOCK, *, causal: bool = False) -> "BlockMask":
        """From a boolean element mask (B|1, H|1, sq, sk) or (sq, sk), True = attend, reduced to blocks.

        Partial blocks are rejected (InputError naming the first): each block must be all True or
        all False over the elements that exist, since the kernel reads no element mask. With
        causal=True, elements the causal mask hides are ignored (pass causal=True to attention too).
        """
        bq, bk = _block_sizes(block)
        xp = _module_of(mask)
        m = _bool_4d(mask, xp, "element mask", "an element mask of shape (batch or 1, heads or 1, seqlen_q, "
                     "seqlen_k) or (seqlen_q, seqlen_k)")
        b, h, sq, sk = m.shape
        qb, kb = -(-sq // bq), -(-sk // bk)
        hidden = None
        if causal:
            i = xp.arange(sq)[:, None]
            hidden = xp.arange(sk)[None, :] > i + (sk - sq)
        any_visible = m if hidden is None else (m & ~hidden)
        all_visible = m if hidden is None else (m | hidden)
        kept = _reduce_blocks(any_visible, bq, bk, qb, kb, xp, fill=False, op="any")
        whole = _reduce_blocks(all_visible, bq, bk, qb, kb, xp, fill=True, op="all")
        partial = kept & ~whole
        if bool(partial.any()):
            where = [int(x) for x in xp.argwhere(partial)[0]]
            raise InputError(f"block_mask: from_dense got {int(partial.sum())} partial {bq}x{bk} block(s), "
                             f"the first at (batch {where[0]}, head {where[1]}, query block {where[2]}, "
                             f"key block {where[3]}); expected each block all True or all False "
                             "(the kernel has no element mask: use BlockMask.causal with causal=True, "
                             "or from_dense(..., causal=True) for causal edges)")
        return cls(kept, bq, bk, sq, sk)

    @classmethod
    def causal(cls, seqlen_q: int, seqlen_k: int | None = None, *, block: int | tuple[int, int] = DEFAULT_BLOCK,
               xp=None) -> "BlockMask":
        """The blocks holding any key a query sees under the bottom-right aligned causal mask.

        Block-granular; pass causal=True to attention for the exact element mask.
        """
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        first_key = g.c * g.bk
        last_row = g.xp.minimum((g.r + 1) * g.bq, g.sq) - 1
        return g.mask(first_key <= last_row + g.offset)

    @classmethod
    def sliding_window(cls, seqlen_q: int, seqlen_k: int | None = None, *, width: int,
                       block: int | tuple[int, int] = DEFAULT_BLOCK, xp=None) -> "BlockMask":
        """Blocks holding any (i, j) with |j - (i + seqlen_k - seqlen_q)| < width (local attention).

        Block-granular; with causal=True in attention it becomes a causal window.
        """
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
            raise InputError(f"block_mask: width must be an int >= 1, got {width!r}")
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        row_lo, row_hi = g.r * g.bq, g.xp.minimum((g.r + 1) * g.bq, g.sq) - 1
        key_lo, key_hi = g.c * g.bk, g.xp.minimum((g.c + 1) * g.bk, g.sk) - 1
        # j - i - offset over the block spans [key_lo - row_hi, key_hi - row_lo] - offset.
        lo, hi = key_lo - row_hi - g.offset, key_hi - row_lo - g.offset
        return g.mask((hi > -width) & (lo < width))

    @classmethod
    def strided(cls, seqlen_q: int, seqlen_k: int | None = None, *, stride: int, local: int = 1,
                block: int | tuple[int, int] = DEFAULT_BLOCK, xp=None) -> "BlockMask":
        """Sparse Transformer's strided pattern over blocks: |d - c| < local, or (d - c) % stride == 0.

        d is the query block's diagonal key block (bottom-right aligned).
        """
        stride, local = _positive("stride", stride), _positive("local", local)
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        delta = g.diag - g.c
        return g.mask((abs(delta) < local) | (delta % stride == 0))

    @classmethod
    def fixed(cls, seqlen_q: int, seqlen_k: int | None = None, *, stride: int, summary: int = 1,
              block: int | tuple[int, int] = DEFAULT_BLOCK, xp=None) -> "BlockMask":
        """Sparse Transformer's fixed pattern over blocks: the diagonal's chunk of `stride` blocks,
        plus the last `summary` blocks of every chunk."""
        stride, summary = _positive("stride", stride), _positive("summary", summary)
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        return g.mask((g.c // stride == g.diag // stride) | (g.c % stride >= stride - summary))

    @classmethod
    def butterfly(cls, seqlen_q: int, seqlen_k: int | None = None, *,
                  block: int | tuple[int, int] = DEFAULT_BLOCK, xp=None) -> "BlockMask":
        """Butterfly over blocks: key block c is kept when d XOR c is 0 or a power of two (log2 blocks a row)."""
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        x = g.diag ^ g.c
        return g.mask((x & (x - 1)) == 0)

    @classmethod
    def random(cls, batch: int, heads: int, seqlen_q: int, seqlen_k: int, density: float, *, seed: int = 0,
               block: int | tuple[int, int] = DEFAULT_BLOCK, xp=None) -> "BlockMask":
        """Each block kept independently with probability `density` (0 keeps none, 1 keeps all)."""
        batch, heads = _positive("batch", batch), _positive("heads", heads)
        if isinstance(density, bool) or not isinstance(density, (int, float, np.floating, np.integer)) \
                or not 0.0 <= float(density) <= 1.0:
            raise InputError(f"block_mask: density must be a number in [0, 1], got {density!r}")
        g = _Grid(seqlen_q, seqlen_k, block, xp)
        rng = g.xp.random.default_rng(seed)
        blocks = rng.random((batch, heads, g.qb, g.kb), dtype=g.xp.float32) < float(density)
        return cls(blocks, g.bq, g.bk, g.sq, g.sk)

    # ---- properties -----------------------------------------------------------------------------
    @property
    def block(self) -> tuple[int, int]:
        """(block_q, block_k): query rows and keys per block."""
        return self.block_q, self.block_k

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(batch or 1, heads or 1, q_blocks, k_blocks)."""
        return tuple(int(n) for n in self._blocks.shape)

    @property
    def density(self) -> float:
        """Fraction of the blocks (over all that exist in the block array) that are kept."""
        if self._density is None:
            self._density = float(self.kv_block_count.sum()) / self._blocks.size
        return self._density

    def dense_blocks(self):
        """The boolean block array (B|1, H|1, q_blocks, k_blocks), a copy, in the mask's array module."""
        return self._blocks.copy()

    def to_element_mask(self, seqlen_q: int, seqlen_k: int):
        """The boolean element mask (B|1, H|1, seqlen_q, seqlen_k) this block mask means (for the reference)."""
        seqlen_q, seqlen_k = _check_seqlen("seqlen_q", seqlen_q), _check_seqlen("seqlen_k", seqlen_k)
        self._check_seqlens(seqlen_q, seqlen_k)
        xp = self._xp
        rows = xp.arange(seqlen_q) // self.block_q
        cols = xp.arange(seqlen_k) // self.block_k
        return self._blocks[:, :, rows[:, None], cols[None, :]]

    def __repr__(self) -> str:
        b, h, qb, kb = self.shape
        seq = f", seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}" if self.seqlen_q else ""
        return f"BlockMask(shape=({b}, {h}, {qb}, {kb}), block=({self.block_q}, {self.block_k}){seq})"

    # ---- the calls api.py makes ---------------------------------------------------------------------
    def check_compatible(self, problem) -> None:
        """InputError naming block_mask and what was expected when the call's shape does not fit."""
        b, h, _, _ = self.shape
        self._check_seqlens(problem.seqlen_q, problem.seqlen_k)
        if b not in (1, problem.batch):
            raise InputError(f"block_mask: batch dimension {b} does not fit batch={problem.batch}; expected 1 "
                             f"or {problem.batch}")
        if h not in (1, problem.heads):
            raise InputError(f"block_mask: heads dimension {h} does not fit heads={problem.heads}; expected 1 "
                             f"or {problem.heads} (one per query head)")

    def kernel_fields(self, problem, keep: list) -> dict[str, int]:
        """The Params fields of this mask for a launch; its device arrays are appended to `keep`."""
        self.check_compatible(problem)
        count, index = self.device_arrays()
        keep.extend((count, index))
        b, h, qb, kb = self.shape
        return {"kv_block_count": count.data.ptr, "kv_block_index": index.data.ptr,
                "mask_batch": b, "mask_heads": h, "mask_q_blocks": qb, "mask_k_blocks": kb,
                "mask_block_q": self.block_q, "mask_block_k": self.block_k}

    def device_arrays(self):
        """(kv_block_count, kv_block_index) as contiguous int32 CuPy arrays on the current device (cached)."""
        import cupy
        dev = cupy.cuda.Device().id
        if dev not in self._device:
            self._device[dev] = tuple(cupy.ascontiguousarray(cupy.asarray(a, dtype=cupy.int32))
                                      for a in (self.kv_block_count, self.kv_block_index))
        return self._device[dev]

    def device_blocks(self):
        """The boolean block array as a contiguous CuPy array on the current device (cached; the backward's lists)."""
        import cupy
        key = ("blocks", cupy.cuda.Device().id)
        if key not in self._device:
            self._device[key] = cupy.ascontiguousarray(cupy.asarray(self._blocks, dtype=cupy.bool_))
        return self._device[key]

    def _check_seqlens(self, seqlen_q: int, seqlen_k: int) -> None:
        _, _, qb, kb = self.shape
        if self.seqlen_q is not None and (self.seqlen_q, self.seqlen_k) != (seqlen_q, seqlen_k):
            raise InputError(f"block_mask: built for seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}; "
                             f"got seqlen_q={seqlen_q}, seqlen_k={seqlen_k}")
        want_q, want_k = -(-seqlen_q // self.block_q), -(-seqlen_k // self.block_k)
        if (qb, kb) != (want_q, want_k):
            raise InputError(f"block_mask: has {qb} x {kb} blocks of {self.block_q}x{self.block_k}; "
                             f"seqlen_q={seqlen_q}, seqlen_k={seqlen_k} expected {want_q} x {want_k} "
                             "(ceil(seqlen / block))")


def _positive(name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"block_mask: {name} must be an int >= 1, got {n!r}")
    return int(n)


def _reduce_blocks(m, bq: int, bk: int, qb: int, kb: int, xp, fill: bool, op: str):
    """any/all of each (bq x bk) block of a (B, H, sq, sk) mask, padding the ragged edge with `fill`."""
    b, h, sq, sk = m.shape
    if (sq, sk) != (qb * bq, kb * bk):
        padded = xp.full((b, h, qb * bq, kb * bk), fill, dtype=xp.bool_)
        padded[:, :, :sq, :sk] = m
        m = padded
    blocks = m.reshape(b, h, qb, bq, kb, bk)
    return blocks.any(axis=(3, 5)) if op == "any" else blocks.all(axis=(3, 5))


class _Grid:
    """Block coordinates of a (seqlen_q, seqlen_k) problem, for the pattern helpers."""

    def __init__(self, seqlen_q: int, seqlen_k: int | None, block, xp):
        self.sq = _check_seqlen("seqlen_q", seqlen_q)
        self.sk = _check_seqlen("seqlen_k", seqlen_q if seqlen_k is None else seqlen_k)
        self.bq, self.bk = _block_sizes(block)
        self.xp = xp or default_module()
        self.qb, self.kb = -(-self.sq // self.bq), -(-self.sk // self.bk)
        self.offset = self.sk - self.sq   # causal diagonal: query i sees key i + offset
        self.r = self.xp.arange(self.qb, dtype=self.xp.int64)[:, None]
        self.c = self.xp.arange(self.kb, dtype=self.xp.int64)[None, :]
        # The key block holding the diagonal key of the query block's last row (clipped to the grid).
        last_row = self.xp.minimum((self.r + 1) * self.bq, self.sq) - 1
        self.diag = self.xp.clip((last_row + self.offset) // self.bk, 0, self.kb - 1)

    def mask(self, blocks) -> BlockMask:
        blocks = self.xp.broadcast_to(blocks, (self.qb, self.kb))
        return BlockMask(blocks[None, None], self.bq, self.bk, self.sq, self.sk)
