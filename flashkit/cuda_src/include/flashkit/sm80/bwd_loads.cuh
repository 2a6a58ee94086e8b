// The FlashAttention-2 backward's tile loads (sm80/bwd_mainloop.cuh's BwdMainloop): K and V of the CTA's key block,
// each visit's Q, dO and its rows of lse2 and dsum (cp.async into tile.cuh's swizzled tiles, zero-filled past the
// sequences and past a padded call's head dims), and V's fragments where they are held in registers. Members of the
// main loop defined here, as its products are in sm80/bwd_products.cuh (the same inlined code).
#pragma once

#include "flashkit/sm80/bwd_mainloop.cuh"

namespace flashkit {

template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::hold_v() {
    const LdsmLane<kDv> la = ldsm_rows16<kDv>(lane);
#pragma unroll
    for (int mi = 0; mi < Kt::kKeyTiles; ++mi)
#pragma unroll
        for (int kk = 0; kk < Kt::kDvSteps; ++kk) ldsm_x4(v_frag[mi][kk], la.addr(sV, key_row0() + mi * kMmaM, kk));
}

template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::load_kv_async() const {
    const Element* k = static_cast<const Element*>(p.k) + t_batch * p.k_batch_stride +
                       kv_head * p.k_head_stride + (k_row0 + n0) * p.k_row_stride;
    const Element* v = static_cast<const Element*>(p.v) + t_batch * p.v_batch_stride +
                       kv_head * p.v_head_stride + (k_row0 + n0) * p.v_row_stride;
    load_tile_async<kN, kD, Kt::kThreads, Element, kPadded>(sK, k, p.k_row_stride, p.seqlen_k - n0, threadIdx.x,
                                                            p.head_dim);
    load_tile_async<kN, kDv, Kt::kThreads, Element, kVPadded>(sV, v, p.v_row_stride, p.seqlen_k - n0, threadIdx.x,
                                                              BwdVColumns::call(p));
}

template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::load_q_async(int head, int m_block, int buf) const {
    const int m0 = m_block * kM;
    int q_row = q_row0, seqlen_q = p.seqlen_q;
    if constexpr (FLASHKIT_VARLEN != 0) reload_range(p.varlen.cu_seqlens_q, batch, q_row, seqlen_q);
    const int tb = kHeld ? t_batch : fresh_value(t_batch);   // (see the thread index below)
    const Element* q = static_cast<const Element*>(p.q) + tb * p.q_batch_stride + head * p.q_head_stride +
                       (q_row + m0) * p.q_row_stride;
    const Element* dout = static_cast<const Element*>(p.bwd.dout) + tb * p.bwd.do_batch_stride +
                          head * p.bwd.do_head_stride + (q_row + m0) * p.bwd.do_row_stride;
    // The batch, the thread index and a padded call's head dim (where the loads clip) go through volatile
    // moves where registers are short (the 32-key warp grid, a padded call), so that the tiles' addresses and the
    // clip are formed here rather than hoisted out of the walk and held across it: at the register limit ptxas
    // spilled them (4 B in the sm_80 float16 causal build of the 128 class; 20-56 B at hd128 with the 32-key
    // grid). Where they fit (hd64's 16-key grid) they stay held, as before the 32-key grid.
    const int tid = kHeld ? static_cast<int>(threadIdx.x) : fresh_value(threadIdx.x);
    int cols = kD, v_cols = kDv;
    if constexpr (kPadded) cols = fresh_value(p.head_dim);
    if constexpr (kVPadded) v_cols = FLASHKIT_OWN_HEAD_DIM_V ? fresh_value(p.head_dim_v) : cols;
    load_tile_async<kM, kD, Kt::kThreads, Element, kPadded>(q_buf(buf), q, p.q_row_stride, seqlen_q - m0, tid,
                                                            cols);
    load_tile_async<kM, kDv, Kt::kThreads, Element, kVPadded>(do_buf(buf), dout, p.bwd.do_row_stride,
                                                              seqlen_q - m0, tid, v_cols);
    // lse2 and dsum are padded to whole blocks: 2 x kM floats, 16 B a lane of the first warp.
    constexpr int kChunks = kM * 4 / kChunkBytes;
    const int t = threadIdx.x;
    if (t < 2 * kChunks) {
        const float* src = (t < kChunks ? ws.lse2 : ws.dsum) + ws.row0(p, batch, head) + m0 + (t % kChunks) * 4;
        float* dst = (t < kChunks ? s_lse2 : s_dsum) + buf * kM + (t % kChunks) * 4;
        cp_async_16(smem_u32(dst), src, true);
    }
    cp_async_commit();
}

}  // namespace flashkit
