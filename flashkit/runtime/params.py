"""The NumPy mirror of `flashkit::Params` (include/flashkit/params.cuh), passed to kernels by value."""

from __future__ import annotations

import numpy as np

POINTERS = ("q", "k", "v", "o", "lse", "workspace", "kv_block_count", "kv_block_index",
            "q_scale", "k_scale", "v_scale")
STRIDES = tuple(f"{t}_{s}_stride" for t in "qkvo" for s in ("batch", "row", "head"))
INTS = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim",
        "mask_batch", "mask_heads", "mask_q_blocks", "mask_k_blocks", "mask_block_q", "mask_block_k",
        "scale_block_rows", "q_scale_blocks", "k_scale_blocks")
FLOATS = ("softmax_scale", "softmax_scale_log2")

# align=True lays the fields out as a C compiler does (natural alignment, padded to 8).
PARAMS_DTYPE = np.dtype(
    [(n, np.uint64) for n in POINTERS] + [(n, np.int64) for n in STRIDES]
    + [(n, np.int32) for n in INTS] + [(n, np.float32) for n in FLOATS], align=True)


def make_params(**fields) -> np.ndarray:
    """A zeroed parameter block with the given fields set; unknown names raise KeyError."""
    block = np.zeros((), dtype=PARAMS_DTYPE)
    for name, value in fields.items():
        if name not in PARAMS_DTYPE.names:
            raise KeyError(f"Params has no field {name!r}")
        block[name] = value
    return block
