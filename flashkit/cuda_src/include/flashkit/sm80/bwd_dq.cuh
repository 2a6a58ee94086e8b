// The FlashAttention-2 backward's dQ (sm80/bwd_mainloop.cuh's BwdMainloop::accumulate_dq): after the barrier that
// completes dS^T, each warp's part of dQ_i = dS K_j, added to dq_accum by fp32 reductions, in key-block order when
// p.bwd.deterministic (bwd_mask.cuh's dq_turn, bwd_passes.cuh's semaphores). A member of the main loop defined
// here (the same inlined code; as a free function, ptxas spilled 36-40 B at hd128).
#pragma once

#include "flashkit/reduce.cuh"
#include "flashkit/sm80/bwd_mainloop.cuh"

namespace flashkit {

// dQ_i += scale dS K_j: this warp's (kDqMTiles x 16) x (kDqDTiles x 8) part of the tile, then fp32
// atomics into dq_accum (in key-block order when deterministic).
template <class Kt, class Mask, class Mod>
__device__ __forceinline__ void BwdMainloop<Kt, Mask, Mod>::accumulate_dq(int head, int m_block) const {
    const int wm = warp % Kt::kDqWarpsM;
    const int wd = warp / Kt::kDqWarpsM;
    const int d0 = wd * Kt::kDqDTiles * kMmaN;
    const LdsmLane<kM> la = ldsm_rows8x2<kM>(lane);   // dS from dS^T [key][query]: .trans A
    const LdsmLane<kD> lb = ldsm_rows16<kD>(lane);    // K [key][d]: .trans B
    // The warp's columns in kDqParts parts (bwd_traits.cuh), each summed over the keys and reduced before the next is
    // formed, so that a part's reductions drain under the next part's products rather than all of them queue at the
    // visit's end (ncu at hd256: the global queue's throttle 0.67 cycles a instruction against FlashAttention-2's 0);
    // dS's fragments are read once a part.
    constexpr int kParts = Kt::kDqParts, kPartTiles = Kt::kDqDTiles / kParts;
    const bool ordered = p.bwd.deterministic != 0;
    int* sema = ws.semaphore(p, batch, head, m_block);
    float* dq = ws.dq_accum + (ws.row0(p, batch, head) + m_block * kM) * kD;
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
        float acc[Kt::kDqMTiles][kPartTiles][4];
        zero_fragments(acc);
#pragma unroll
        for (int kk = 0; kk < Kt::kNSteps; ++kk) {
            u32 a[Kt::kDqMTiles][4];
#pragma unroll
            for (int mt = 0; mt < Kt::kDqMTiles; ++mt)
                ldsm_x4_trans(a[mt], la.addr(sdS, kk * kMmaK, wm * Kt::kDqMTiles + mt));
#pragma unroll
            for (int dp = 0; dp < kPartTiles / 2; ++dp) {
                u32 b[4];
                ldsm_x4_trans(b, lb.addr(sK, kk * kMmaK, wd * Kt::kDqDTiles / 2 + part * kPartTiles / 2 + dp));
#pragma unroll
                for (int mt = 0; mt < Kt::kDqMTiles; ++mt) {
                    mma_16816<Element>(acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_16816<Element>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        // Before the first part's reductions: wait for the key blocks before this one that visit m_block
        // (bwd_mask.cuh's dq_turn).
        if (part == 0 && ordered) {
            if (threadIdx.x == 0) wait_semaphore(sema, dq_turn<kM, kN>(mask, m_block, n0 / kN, head, batch));
            __syncthreads();
        }
        if constexpr (Kt::kDqFragments) {   // fragment order (Kt::DqLayout, bwd_traits.cuh): a 16-byte reduction a tile
            // The warp's column tiles lie in one 64-column panel, so its tiles' addresses are one base plus
            // compile-time offsets (formed one by one, they took about 80 integer instructions a visit at hd128).
            static_assert(Kt::DqLayout::kTilesPerPanel % Kt::kDqDTiles == 0, "a warp's dQ columns stay in one panel");
            float* frag = dq + Kt::DqLayout::fragment(d0 / kMmaN, wm * Kt::kDqMTiles, lane);
#pragma unroll
            for (int mt = 0; mt < Kt::kDqMTiles; ++mt)   // unscaled: bwd_convert_dq scales
#pragma unroll
                for (int nd = 0; nd < kPartTiles; ++nd)
                    red_add_v4(frag + Kt::DqLayout::run_offset(part * kPartTiles + nd, mt), acc[mt][nd][0],
                               acc[mt][nd][1], acc[mt][nd][2], acc[mt][nd][3]);
        } else {
            const int g = lane / kQuadLanes;
            const int c2 = kFragCols * (lane % kQuadLanes);
#pragma unroll
            for (int mt = 0; mt < Kt::kDqMTiles; ++mt) {
                float* row = dq + ((wm * Kt::kDqMTiles + mt) * kMmaM + g) * kD + d0 + part * kPartTiles * kMmaN + c2;
                // rows (Kt::DqLayout); reduce.cuh: 16 bytes a reduction on sm_90
#pragma unroll
                for (int nd = 0; nd < kPartTiles; ++nd)
                    red_add_fragment(row + nd * kMmaN, kD, lane, acc[mt][nd][0], acc[mt][nd][1], acc[mt][nd][2],
                                     acc[mt][nd][3], p.softmax_scale);
            }
        }
    }
    if (ordered) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(sema, 1);
    }
}

}  // namespace flashkit
