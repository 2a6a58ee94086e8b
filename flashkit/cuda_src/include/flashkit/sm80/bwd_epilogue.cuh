// The FlashAttention-2 backward's epilogue (sm80/bwd_mainloop.cuh's BwdMainloop): dK and dV of the warp's keys from
// their fp32 registers to the gradients, 16-bit. A member of the main loop defined here, as its dQ is in
// sm80/bwd_dq.cuh (the same inlined code).
#pragma once

#include "flashkit/sm80/bwd_mainloop.cuh"

namespace flashkit {

// dK = scale dK, dV: this warp's keys and columns, rows past seqlen_k and columns past head_dim (dV's: past
// head_dim_v) not written.
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::store_dk_dv() const {
    const int g = lane / kQuadLanes;
    const int c2 = kFragCols * (lane % kQuadLanes);
    int k_row = k_row0, seqlen_k = p.seqlen_k;
    if constexpr (FLASHKIT_VARLEN != 0) reload_range(p.varlen.cu_seqlens_k, batch, k_row, seqlen_k);   // not live
    Element* dk = static_cast<Element*>(p.bwd.dk) + t_batch * p.bwd.dk_batch_stride +
                  kv_head * p.bwd.dk_head_stride + static_cast<index_t>(k_row) * p.bwd.dk_row_stride;
    Element* dv = static_cast<Element*>(p.bwd.dv) + t_batch * p.bwd.dv_batch_stride +
                  kv_head * p.bwd.dv_head_stride + static_cast<index_t>(k_row) * p.bwd.dv_row_stride;
#pragma unroll
    for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = n0 + key_row0() + mi * kMmaM + g + h * kFragRowHalf;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nd = 0; nd < Kt::kColTiles; ++nd) {
                const int col = col0() + nd * kMmaN + c2;
                if (!kPadded || col < p.head_dim)   // zero columns past a padded call's head dim: not stored
                    *reinterpret_cast<u32*>(dk + key * p.bwd.dk_row_stride + col) = pack_float2<Element>(
                        acc_dk[mi][nd][2 * h] * p.softmax_scale, acc_dk[mi][nd][2 * h + 1] * p.softmax_scale);
                if (nd >= Kt::kColTilesV) continue;
                // dV's column (dK's where v's class is q's), likewise up to head_dim_v
                const int col_v = kDv == kD ? col : cols0<kDv>() + nd * kMmaN + c2;
                if (BwdVColumns::past<kVPadded>(p, col_v)) continue;
                *reinterpret_cast<u32*>(dv + key * p.bwd.dv_row_stride + col_v) =
                    pack_float2<Element>(acc_dv[mi][nd][2 * h], acc_dv[mi][nd][2 * h + 1]);
            }
        }
}

}  // namespace flashkit
