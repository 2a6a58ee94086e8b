// Forward epilogue: O (already divided by l) -> output type -> global, and the LSE.
// Each warp stages its own rows of O in its slice of the (no longer needed) Q shared tile,
// in the swizzled layout, then writes them with coalesced 16 B stores; rows >= seqlen_q are
// never written. Only warp-level synchronization: a warp reads and writes only its own rows.
#pragma once

#include "flashkit/tile.cuh"

namespace flashkit {

// What store_output reads of a kernel whose input type differs from its 16-bit output (fp8,
// or any kernel staging O where its inputs were): store_output<EpilogueTraits<Kt>>. kOutDim is the
// width of O (the FA2 family's Kt::kHeadDimV, which may be below the Q / K head dim).
template <class Kt, int kOutDim = Kt::kHeadDim>
struct EpilogueTraits {
    typedef typename Kt::OutT Element;
    typedef typename Kt::OutT OutT;
    static constexpr int kMTiles = Kt::kMTiles;
    static constexpr int kDTiles = kOutDim == Kt::kHeadDim ? Kt::kDTiles : kOutDim / kMmaN;
    static constexpr int kHeadDim = kOutDim;
    static constexpr int kWarpRows = Kt::kWarpRows;
};

// o_frag: the warp's O in mma C layout; smem_warp: the warp's kWarpRows x kHeadDim slice;
// o_gmem / lse_gmem: the warp's first row (lse_gmem null when no LSE is asked for);
// rows_valid: how many of the warp's rows exist (may be <= 0); with kClipCols only the first
// cols_valid columns are written (a head dim below the compiled class).
template <class Kt, bool kClipCols = false>
__device__ __forceinline__ void store_output(
    const float (&o_frag)[Kt::kMTiles][Kt::kDTiles][4], const float (&lse)[Kt::kMTiles][2],
    typename Kt::OutT* smem_warp, typename Kt::OutT* o_gmem, index_t o_row_stride,
    float* lse_gmem, int rows_valid, int lane, int cols_valid = Kt::kHeadDim) {
    typedef typename Kt::OutT OutT;
    static_assert(sizeof(OutT) == sizeof(typename Kt::Element), "O staged in the Q tile");
    const int g = lane / kQuadLanes;
    const int t = lane % kQuadLanes;
    __syncwarp();   // this warp's last ldmatrix reads of its Q rows are done
#pragma unroll
    for (int mi = 0; mi < Kt::kMTiles; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = mi * kMmaM + h * kFragRowHalf + g;
#pragma unroll
            for (int nd = 0; nd < Kt::kDTiles; ++nd) {
                const int col = nd * kMmaN + kFragCols * t;
                *reinterpret_cast<u32*>(smem_warp + swizzle_offset<Kt::kHeadDim>(row, col)) =
                    pack_float2<OutT>(o_frag[mi][nd][2 * h], o_frag[mi][nd][2 * h + 1]);
            }
            // LSE: lane t == 0 of each quad writes its two rows.
            if (lse_gmem != nullptr && t == 0 && row < rows_valid) lse_gmem[row] = lse[mi][h];
        }
    __syncwarp();
    store_tile_warp<Kt::kWarpRows, Kt::kHeadDim, OutT, kClipCols>(smem_warp, o_gmem, o_row_stride,
                                                                  rows_valid, lane, cols_valid);
}

}  // namespace flashkit
