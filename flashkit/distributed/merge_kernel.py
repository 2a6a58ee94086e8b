"""The fused merge: one CUDA kernel (NVRTC through CuPy) updating an fp32 (O, LSE) accumulator in place.

One group of threads per (batch, row, head), eight head_dim elements a thread (16-byte loads of the
16-bit partial), the group inside one warp, so that its first lane writes the new LSE after every lane
has read the old one. No toolkit headers: 16-bit values convert by bit shifts (bf16) or one PTX cvt (fp16).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

VEC = 8            # head_dim elements per thread
MAX_HEAD_DIM = 32 * VEC
THREADS = 256

MERGE_SOURCE = r"""
#define FK_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float fk_bf16_to_float(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ float fk_f16_to_float(unsigned short b) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b)); return f;
}

// acc[b, row0 + r, h, :] = w_a acc + w_b part;  w_x = exp(LSE_x - LSE), LSE = logsumexp(LSE_a, LSE_b)
#define FK_DEFINE_MERGE(NAME, TO_FLOAT)                                                               \
extern "C" __global__ void NAME(                                                                      \
    unsigned long long acc_o_p, unsigned long long acc_lse_p,                                         \
    unsigned long long part_o_p, unsigned long long part_lse_p,                                       \
    long long batch, long long rows, long long heads, long long head_dim, long long row0,             \
    long long ao_sb, long long ao_ss, long long ao_sh, long long al_sb, long long al_sh,              \
    long long po_sb, long long po_ss, long long po_sh, long long pl_sb, long long pl_sh) {            \
  float* acc_o = reinterpret_cast<float*>(acc_o_p);                                                   \
  float* acc_lse = reinterpret_cast<float*>(acc_lse_p);                                               \
  const unsigned short* part_o = reinterpret_cast<const unsigned short*>(part_o_p);                   \
  const float* part_lse = reinterpret_cast<const float*>(part_lse_p);                                 \
  const long long g = (long long)blockIdx.x * blockDim.y + threadIdx.y;   /* (b, r, h) group */      \
  const bool active = g < batch * rows * heads;                                                       \
  const int lane = threadIdx.x;                                                                       \
  long long h = 0, r = 0, b = 0;                                                                      \
  float la = FK_NEG_INF, lb = FK_NEG_INF;                                                             \
  if (active) {                                                                                       \
    h = g % heads; r = (g / heads) % rows; b = g / (heads * rows);                                    \
    la = acc_lse[b * al_sb + h * al_sh + row0 + r];                                                   \
    lb = part_lse[b * pl_sb + h * pl_sh + r];                                                         \
  }                                                                                                   \
  const float m = fmaxf(la, lb);                                                                      \
  float wa = 0.f, wb = 0.f, lse = m;                                                                  \
  if (m != FK_NEG_INF) {                                                                              \
    const float ea = expf(la - m), eb = expf(lb - m), total = ea + eb;                                \
    wa = ea / total; wb = eb / total; lse = m + logf(total);                                          \
  }                                                                                                   \
  const long long d0 = (long long)lane * 8;                                                           \
  if (active && d0 < head_dim) {                                                                      \
    float4* a = reinterpret_cast<float4*>(acc_o + b * ao_sb + (row0 + r) * ao_ss + h * ao_sh + d0);   \
    const uint4 p = *reinterpret_cast<const uint4*>(part_o + b * po_sb + r * po_ss + h * po_sh + d0); \
    const unsigned words[4] = {p.x, p.y, p.z, p.w};                                                   \
    float4 a0 = a[0], a1 = a[1];                                                                      \
    float pv[8];                                                                                      \
    _Pragma("unroll") for (int i = 0; i < 4; ++i) {                                                   \
      pv[2 * i] = TO_FLOAT((unsigned short)(words[i] & 0xffffu));                                     \
      pv[2 * i + 1] = TO_FLOAT((unsigned short)(words[i] >> 16));                                     \
    }                                                                                                 \
    a0.x = wa * a0.x + wb * pv[0]; a0.y = wa * a0.y + wb * pv[1];                                     \
    a0.z = wa * a0.z + wb * pv[2]; a0.w = wa * a0.w + wb * pv[3];                                     \
    a1.x = wa * a1.x + wb * pv[4]; a1.y = wa * a1.y + wb * pv[5];                                     \
    a1.z = wa * a1.z + wb * pv[6]; a1.w = wa * a1.w + wb * pv[7];                                     \
    a[0] = a0; a[1] = a1;                                                                             \
  }                                                                                                   \
  __syncwarp();   /* every lane of the group has read the old LSE */                                  \
  if (active && lane == 0) acc_lse[b * al_sb + h * al_sh + row0 + r] = lse;                           \
}

FK_DEFINE_MERGE(flashkit_ring_merge_bf16, fk_bf16_to_float)
FK_DEFINE_MERGE(flashkit_ring_merge_f16, fk_f16_to_float)
"""

ENTRIES = {"torch.bfloat16": "flashkit_ring_merge_bf16", "torch.float16": "flashkit_ring_merge_f16"}


def threads_per_row(head_dim: int) -> int:
    """The power of two >= head_dim / VEC (a group never straddles a warp)."""
    need = -(-head_dim // VEC)
    tpr = 1
    while tpr < need:
        tpr *= 2
    return tpr


def fused_merge_applies(acc_o: Any, acc_lse: Any, part_o: Any, part_lse: Any) -> bool:
    """Whether the kernel can take these tensors (else the caller merges with torch ops)."""
    import torch
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    d = acc_o.shape[-1]
    tensors = (acc_o, acc_lse, part_o, part_lse)
    if not all(t.is_cuda and t.device == acc_o.device for t in tensors):
        return False
    if str(part_o.dtype) not in ENTRIES or acc_o.dtype != torch.float32 or acc_lse.dtype != torch.float32 \
            or part_lse.dtype != torch.float32:
        return False
    if d % VEC or d > MAX_HEAD_DIM or acc_o.stride(-1) != 1 or part_o.stride(-1) != 1 \
            or acc_lse.stride(-1) != 1 or part_lse.stride(-1) != 1:
        return False
    aligned = all(t.data_ptr() % 16 == 0 for t in (acc_o, part_o))
    aligned = aligned and all((s * 4) % 16 == 0 for s in acc_o.stride()[:-1])
    aligned = aligned and all((s * 2) % 16 == 0 for s in part_o.stride()[:-1])
    return aligned


@lru_cache(maxsize=None)
def _kernel(device_id: int, entry: str):
    import cupy
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=MERGE_SOURCE, options=("-std=c++17",)).get_function(entry)


def fused_merge(acc_o: Any, acc_lse: Any, part_o: Any, part_lse: Any, row0: int) -> None:
    """Launch the merge of part into acc rows [row0, row0 + n) on torch's current stream."""
    import cupy
    import numpy as np
    import torch
    b, n, h, d = part_o.shape
    dev = acc_o.device.index
    kernel = _kernel(dev, ENTRIES[str(part_o.dtype)])
    tpr = threads_per_row(d)
    rows_per_block = THREADS // tpr
    groups = b * n * h
    grid = (-(-groups // rows_per_block),)
    i64 = np.int64
    u64 = np.uint64
    args = (u64(acc_o.data_ptr()), u64(acc_lse.data_ptr()), u64(part_o.data_ptr()), u64(part_lse.data_ptr()),
            i64(b), i64(n), i64(h), i64(d), i64(row0),
            *(i64(s) for s in acc_o.stride()[:3]), i64(acc_lse.stride(0)), i64(acc_lse.stride(1)),
            *(i64(s) for s in part_o.stride()[:3]), i64(part_lse.stride(0)), i64(part_lse.stride(1)))
    stream = torch.cuda.current_stream(acc_o.device)
    with cupy.cuda.Device(dev), cupy.cuda.ExternalStream(stream.cuda_stream, dev):
        kernel(grid, (tpr, rows_per_block), args)
