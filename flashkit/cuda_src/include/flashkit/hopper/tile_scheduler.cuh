// The tile scheduler of the warp-specialized Hopper forward (the `tiles` grid kind). Persistent (the launch
// parameter `persistent: 1`): a grid of one CTA per SM (min(tiles, SMs) CTAs) walks every (query block,
// head, batch) tile of the call, so that a CTA's next tile loads while its previous tile's epilogue runs,
// and no CTA pays a launch, barrier set-up and pipeline fill per tile. Otherwise CTA t runs tile t alone.
//
// Tiles are numbered as the non-persistent grid (ceil(seqlen_q / block_m), heads, batch) was:
//   t = m + n_m (head + heads batch),   query block m_block = m, or n_m - 1 - m when heaviest-first
// (causal: a block further down sees more keys, so each head's heaviest block comes first). Consecutive
// tiles share a head, so the CTAs running at one time read the K and V of a few heads (L2 reuse).
// Static "snake" order over the G CTAs: round r takes tiles [rG, rG + G), CTA b the r-th tile of slot b in
// even rounds and of slot G - 1 - b in odd ones. A CTA given a heavy slot in one round gets a light one in
// the next, which balances causal work (per-head weights n_m, n_m - 1, ..., 1 repeating) to within about 3%
// of the ideal makespan when a head has few blocks against G, as a dynamic (atomic) queue does, with no
// counter to reset between launches and no hand-off of tile numbers from the producer to the consumers:
// every role walks the same sequence. When a head has about G blocks the pairing fails (1.5x at 128 blocks
// and 132 CTAs); the host then launches one CTA a tile instead (runtime/tile_balance.py), which this loop
// runs as its first round only.
#pragma once

#include "flashkit/mask.cuh"
#include "flashkit/params.cuh"

#ifndef FLASHKIT_PERSISTENT
#define FLASHKIT_PERSISTENT 0   // the launch parameter `persistent`: 0, one tile a CTA (grid = tiles)
#endif

namespace flashkit {
namespace hopper {

struct TileIndex {
    int m_block;
    int head;
    int batch;
};

// The parameter block lives in the constant bank: the scheduler reads the problem's extents from it
// on each tile rather than holding them in registers, which the consumers' main loop needs (hd64's
// three consumers and hd256 run at their setmaxnreg budgets). Its only register is the round.
template <int kBlockM, bool kHeaviestFirst>
struct SnakeScheduler {
    const Params& p;

    __device__ __forceinline__ explicit SnakeScheduler(const Params& p_) : p(p_) {}

    __device__ __forceinline__ int n_m() const { return ceil_div(p.seqlen_q, kBlockM); }   // varlen: the longest
    __device__ __forceinline__ int n_tiles() const { return n_m() * p.heads * p.batch; }
    __device__ __forceinline__ TileIndex tile(int t) const {
        const int n = n_m();
        const int m = t % n;
        const int hb = t / n;
        return TileIndex{kHeaviestFirst ? n - 1 - m : m, hb % p.heads, hb / p.heads};
    }

    // f(TileIndex) for each tile of this CTA, in its order.
    template <class F>
    __device__ __forceinline__ void for_each_tile(F&& f) const {
        if constexpr (!FLASHKIT_PERSISTENT) {
            if (static_cast<int>(blockIdx.x) < n_tiles()) f(tile(blockIdx.x));
            return;
        }
        const int ctas = gridDim.x;
        for (int round = 0; round * ctas < n_tiles(); ++round) {
            const int slot = (round & 1) ? ctas - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
            const int t = round * ctas + slot;
            if (t < n_tiles()) f(tile(t));
        }
    }
};

}  // namespace hopper
}  // namespace flashkit
