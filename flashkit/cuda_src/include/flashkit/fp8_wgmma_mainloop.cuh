// The FP8 forward of one query block on Hopper warpgroup products (fp8_hopper.cu, sm_90a).
//
// One CTA: kBlockM = 64 x (warpgroups) query rows of one (head, batch); warpgroup w owns rows
// [64 w, 64 w + 64), warp 4 w + i of it rows [16 i, 16 i + 16) of those -- the same per-warp rows
// as the mma.sync kernels (kWarpRows = 16), so fp8::Softmax, apply_mask and store_output serve
// unchanged. Per visited K/V tile j (keys [n0, n0 + kBlockN)):
//   S = Q K_j^T                          wgmma m64{kBlockN}k32 e4m3, Q and K from shared memory
//   x = S * q_scale(row) * k_scale(key block) * softmax_scale * log2(e),  masked to -inf
//   {m, l}, P = 448 exp2(x - m)          fp8::Softmax; O *= alpha * v_ref(j-1) / v_ref(j)
//   P *= v_scale(key block) / v_ref(j)   only where a tile spans two V scale blocks (v_ref = max)
//   O += e4m3(P) Vt_j                    wgmma m64{kHeadDim}k32, P from registers (A), Vt (B)
// O stays in units of v_ref of the current tile; the epilogue multiplies by it and divides by l.
// Vt_j is the V tile transposed (K-major for the second product, as e4m3 wgmma requires) by
// fp8_vt.cuh's pre-pass, its keys in the P V permutation of fp8.cuh.
// Shared memory: [ Q | K stages | Vt stages ] (kStages = 3), each 1024 B aligned. Pipeline, per
// visited tile i (FlashAttention-3's intra-warpgroup overlap):
//   barrier (tile i + 1 resident; every warpgroup done with tile i - 1)
//   cp.async tile i + 2 into the stage tile i - 1 used
//   issue S_{i+1} = Q K_{i+1}^T, then O += P_i Vt_i       (asynchronous, in that order)
//   wait for S_{i+1}; its softmax runs while the tensor cores compute P_i Vt_i
//   wait for P_i Vt_i; O *= alpha_{i+1}; P_{i+1} -> e4m3 registers
// The Q region stages O in the epilogue.
#pragma once

#include "flashkit/epilogue.cuh"
#include "flashkit/fp8.cuh"
#include "flashkit/mask.cuh"
#include "flashkit/wgmma.cuh"

namespace flashkit {
namespace fp8 {

constexpr unsigned kFullWarp = 0xffffffffu;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, typename OutT_>
struct WgmmaTraits {
    typedef OutT_ OutT;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kWarpgroups = kThreads / gmma::kWarpgroupThreads;
    static constexpr int kWarpRows = kMmaM;                  // rows per warp
    static constexpr int kMTiles = 1;
    static constexpr int kNTiles = kBlockN / kMmaN;          // 8-key column tiles of S
    static constexpr int kDTiles = kHeadDim / kMmaN;         // 8-wide column tiles of O
    static constexpr int kQKSteps = kHeadDim / gmma::kK8;
    static constexpr int kPVSteps = kBlockN / gmma::kK8;
    static constexpr int kStages = 3;
    // One warpgroup a CTA: two CTAs share an SM (<= 255 registers a thread) and drift apart, so
    // one's softmax overlaps the other's products.
    static constexpr int kCtasPerSm = kWarpgroups == 1 ? 2 : 1;
    // Scale blocks a tile may span (rows per scale block: a power of two >= kMinScaleBlock).
    static constexpr int kScaleParts = kBlockN > kMinScaleBlock ? kBlockN / kMinScaleBlock : 1;
    static constexpr int kPartTiles = kNTiles / kScaleParts;

    typedef gmma::KMajorTile<kBlockM, kHeadDim> QTile;
    typedef gmma::KMajorTile<kBlockN, kHeadDim> KTile;
    typedef gmma::KMajorTile<kHeadDim, kBlockN> VtTile;   // rows: head dim; K: keys

    __host__ __device__ static constexpr int align(int bytes) { return (bytes + gmma::kTileAlign - 1) / gmma::kTileAlign * gmma::kTileAlign; }
    static constexpr int kQOffset = 0;
    static constexpr int kKOffset = align(QTile::kBytes);
    static constexpr int kKStageBytes = align(KTile::kBytes);
    static constexpr int kVtOffset = kKOffset + kStages * kKStageBytes;
    static constexpr int kVtStageBytes = align(VtTile::kBytes);
    static constexpr int kTileBytes = kVtOffset + kStages * kVtStageBytes;
    static constexpr int kOStageBytes = kBlockM * kHeadDim * static_cast<int>(sizeof(OutT));
    // Slack to round the dynamic shared memory base up to kTileAlign.
    static constexpr int kSmemBytes = (kTileBytes > kOStageBytes ? kTileBytes : kOStageBytes) + gmma::kTileAlign;

    static_assert(kThreads % gmma::kWarpgroupThreads == 0, "whole warpgroups");
    static_assert(kBlockM == kWarpgroups * gmma::kWarpgroupRows, "64 query rows per warpgroup");
    static_assert(kBlockN == 64 || kBlockN == 128, "K/V tiles of 64 or 128 keys");
    static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim 64, 128 or 256");
    static_assert(sizeof(OutT) == 2, "output: float16 or bfloat16");
};

template <class Kt, class Mask>
struct WgmmaMainloop {
    static constexpr int kBN = Kt::kBlockN;
    typedef typename Kt::QTile QTile;
    typedef typename Kt::KTile KTile;
    typedef typename Kt::VtTile VtTile;

    const Mask& mask;
    const Params& params;
    const u8* k_gmem;     // row 0 of this (batch, kv head)
    const u8* vt_gmem;    // row 0 (head-dim index 0) of this (batch, kv head)'s transposed V
    index_t vt_row_stride;
    int kv_scale0;        // this (batch, kv head)'s first scale block
    u32 smem;             // the 1024 B aligned base
    int warpgroup;
    float row_scale[2];   // q_scale(row) * softmax_scale * log2(e), rows g and g + 8
    float v_ref;          // the V scale O is currently expressed in
    float acc_o[1][Kt::kDTiles][4];
    float s[1][Kt::kNTiles][4];        // scores of the next tile, then its P (floats)
    u32 p_frag[Kt::kPVSteps][4];       // e4m3 P of the tile being multiplied (wgmma A operand)
    float o_factor[1][2];              // what O owes before the next P V
    float next_ks[Kt::kScaleParts];    // scales of the tile whose scores come next
    float next_v_ratio[Kt::kScaleParts];
    float next_v_ref;
    Softmax<1> softmax;

    __device__ __forceinline__ WgmmaMainloop(const Mask& mask_, const Params& p, u32 smem_, int m0, int head,
                                             int batch, int tid)
        : mask(mask_), params(p), smem(smem_) {
        const int kv_head = head / (p.heads / p.kv_heads);   // GQA / MQA
        const int bh = batch * p.kv_heads + kv_head;
        k_gmem = static_cast<const u8*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
        vt_row_stride = static_cast<index_t>(ceil_div(p.seqlen_k, kBN)) * kBN;
        vt_gmem = static_cast<const u8*>(p.workspace) + static_cast<index_t>(bh) * Kt::kHeadDim * vt_row_stride;
        kv_scale0 = bh * p.k_scale_blocks;
        const int warp = tid / kWarpSize;
        const int lane = tid % kWarpSize;
        warpgroup = warp / (gmma::kWarpgroupThreads / kWarpSize);
        const float* q_scale = p.q_scale + (static_cast<index_t>(batch) * p.heads + head) * p.q_scale_blocks;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(m0 + warp * Kt::kWarpRows + lane / kQuadLanes + h * kFragRowHalf, p.seqlen_q - 1);
            row_scale[h] = q_scale[row / p.scale_block_rows] * p.softmax_scale_log2;
        }
#pragma unroll
        for (int nd = 0; nd < Kt::kDTiles; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][nd][e] = 0.f;
        v_ref = 1.f;
        softmax.init();
    }

    __device__ __forceinline__ u32 k_stage(int stage) const { return smem + Kt::kKOffset + stage * Kt::kKStageBytes; }
    __device__ __forceinline__ u32 vt_stage(int stage) const { return smem + Kt::kVtOffset + stage * Kt::kVtStageBytes; }

    // K_j and Vt_j into a stage (one cp.async group).
    __device__ __forceinline__ void load_kv_async(int stage, int n_block, int tid) const {
        const int n0 = n_block * kBN;
        KTile::template load_async<Kt::kThreads>(k_stage(stage), k_gmem + n0 * params.k_row_stride,
                                                 params.k_row_stride, params.seqlen_k - n0, tid);
        // Vt rows are padded to whole tiles with zero keys: every row is valid.
        VtTile::template load_async<Kt::kThreads>(vt_stage(stage), vt_gmem + n0, vt_row_stride, Kt::kHeadDim, tid);
        cp_async_commit();
    }

    // The K and V scales of the tile's key blocks; returns v_ref (their maximum) and sets the
    // ratios P is multiplied by where the tile spans two V scale blocks.
    __device__ __forceinline__ float tile_scales(int n_block, float (&ks)[Kt::kScaleParts],
                                                 float (&v_ratio)[Kt::kScaleParts]) const {
        float vs[Kt::kScaleParts];
        float vmax = 0.f;
#pragma unroll
        for (int part = 0; part < Kt::kScaleParts; ++part) {
            const int block = min((n_block * kBN + part * kMinScaleBlock) / params.scale_block_rows,
                                  params.k_scale_blocks - 1);
            ks[part] = params.k_scale[kv_scale0 + block];
            vs[part] = params.v_scale[kv_scale0 + block];
            vmax = fmaxf(vmax, vs[part]);
        }
#pragma unroll
        for (int part = 0; part < Kt::kScaleParts; ++part) v_ratio[part] = __fdividef(vs[part], vmax);
        return vmax;
    }

    // Issue S = Q K^T for the tile in `stage` (asynchronous; the first k-step overwrites s).
    __device__ __forceinline__ void issue_scores(int stage) {
        const int q_row0 = warpgroup * gmma::kWarpgroupRows;
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kQKSteps; ++kk)
            gmma::MmaE4m3<kBN>::ss(s[0], QTile::desc(smem + Kt::kQOffset, q_row0, kk * gmma::kK8),
                                   KTile::desc(k_stage(stage), 0, kk * gmma::kK8), kk > 0);
        gmma::commit();
    }

    // Issue O += e4m3(P) Vt for the tile in `stage` (asynchronous; p_frag stays untouched until
    // it completes).
    __device__ __forceinline__ void issue_pv(int stage) {
        gmma::fence();
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk)
            gmma::MmaE4m3<Kt::kHeadDim>::rs(acc_o[0], p_frag[kk], VtTile::desc(vt_stage(stage), 0, kk * gmma::kK8),
                                            1);
        gmma::commit();
    }

    // Fetch the K and V scales of tile n_block into registers (issued before the products whose
    // wait would otherwise expose the load latency).
    __device__ __forceinline__ void prefetch_scales(int n_block) {
        next_v_ref = tile_scales(n_block, next_ks, next_v_ratio);
    }

    // The landed scores of the prefetched tile n_block -> P (floats, in s); o_factor: what O owes
    // before the next product (alpha times the change of V scale unit).
    __device__ __forceinline__ void softmax_step(int n_block, bool masked, int row0, int col_lane) {
        gmma::fence_accumulators(s[0]);
        // x = S * q_scale * k_scale * softmax_scale * log2(e), before masking (the scale may be < 0).
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ni = 0; ni < Kt::kNTiles; ++ni) {
                const float c = row_scale[h] * next_ks[ni / Kt::kPartTiles];
                s[0][ni][2 * h] *= c;
                s[0][ni][2 * h + 1] *= c;
            }
        if (masked) apply_mask(mask, s, row0, n_block * kBN + col_lane);
        softmax.to_probabilities(s, o_factor);
        const float unit_change = __fdividef(v_ref, next_v_ref);   // O moves to units of this tile's V scale
#pragma unroll
        for (int h = 0; h < 2; ++h) o_factor[0][h] *= unit_change;
        v_ref = next_v_ref;
        if constexpr (Kt::kScaleParts > 1) {
            if (params.scale_block_rows < kBN) {   // the tile spans V scale blocks
#pragma unroll
                for (int ni = 0; ni < Kt::kNTiles; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[0][ni][e] *= next_v_ratio[ni / Kt::kPartTiles];
            }
        }
    }

    // After the previous P V completed: O *= o_factor, and P (s) -> e4m3 A fragments.
    __device__ __forceinline__ void rescale_and_pack() {
        gmma::fence_accumulators(acc_o[0]);
        // Once the row maxima settle most tiles owe nothing: skip the multiply warp by warp.
        if (!__all_sync(kFullWarp, o_factor[0][0] == 1.f && o_factor[0][1] == 1.f)) Softmax<1>::rescale(acc_o, o_factor);
#pragma unroll
        for (int kk = 0; kk < Kt::kPVSteps; ++kk) pack_p_fragment(p_frag[kk], s[0], kk);
    }
};

// The whole FP8 forward of query block m_block of (head, batch).
template <class Kt, class Mask>
__device__ __forceinline__ void fwd_block_wgmma(const Params& p, const Mask& mask, int m_block, int head,
                                                int batch) {
    typedef typename Kt::OutT OutT;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 smem = (smem_u32(smem_raw) + gmma::kTileAlign - 1) & ~static_cast<u32>(gmma::kTileAlign - 1);
    unsigned char* smem_ptr = smem_raw + (smem - smem_u32(smem_raw));
    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m0 = m_block * Kt::kBlockM;
    WgmmaMainloop<Kt, Mask> loop(mask, p, smem, m0, head, batch, tid);

    const int n_blocks = mask.num_kv_blocks();
    const int n_masked = mask.num_masked_blocks();   // the first n_masked visited tiles
    if (n_blocks > 0) {
        const u8* q_gmem = static_cast<const u8*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                           m0 * p.q_row_stride;
        const int row0 = m0 + warp * Kt::kWarpRows + lane / kQuadLanes;
        const int col_lane = kFragCols * (lane % kQuadLanes);
        // Visit i is tile mask.kv_block(n_blocks - 1 - i), in stage i % kStages.
        Kt::QTile::template load_async<Kt::kThreads>(smem + Kt::kQOffset, q_gmem, p.q_row_stride, p.seqlen_q - m0,
                                                     tid);
        loop.load_kv_async(0, mask.kv_block(n_blocks - 1), tid);   // Q and tile 0: one group
        if (n_blocks > 1) {
            loop.load_kv_async(1, mask.kv_block(n_blocks - 2), tid);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        gmma::fence_proxy_async();
        __syncthreads();
        loop.prefetch_scales(mask.kv_block(n_blocks - 1));
        loop.issue_scores(0);
        gmma::wait<0>();
        loop.softmax_step(mask.kv_block(n_blocks - 1), n_masked > 0, row0, col_lane);
        loop.rescale_and_pack();
        for (int i = 0; i + 1 < n_blocks; ++i) {
            cp_async_wait<0>();   // tile i + 1 landed (the only group in flight)
            gmma::fence_proxy_async();
            __syncthreads();      // ... for every thread; every warpgroup is done with tile i - 1
            if (i + 2 < n_blocks) loop.load_kv_async((i + 2) % Kt::kStages, mask.kv_block(n_blocks - 3 - i), tid);
            loop.prefetch_scales(mask.kv_block(n_blocks - 2 - i));
            loop.issue_scores((i + 1) % Kt::kStages);
            loop.issue_pv(i % Kt::kStages);
            gmma::wait<1>();   // S_{i+1} landed; P_i Vt_i still running
            loop.softmax_step(mask.kv_block(n_blocks - 2 - i), i + 1 < n_masked, row0, col_lane);
            gmma::wait<0>();
            loop.rescale_and_pack();
        }
        loop.issue_pv((n_blocks - 1) % Kt::kStages);
        gmma::wait<0>();
        gmma::fence_accumulators(loop.acc_o[0]);
    }

    float lse[1][2];
    loop.softmax.finalize(loop.acc_o, loop.v_ref, lse);   // O *= v_ref / l
    const int warp_row0 = m0 + warp * Kt::kWarpRows;
    OutT* o_gmem = static_cast<OutT*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                   warp_row0 * p.o_row_stride;
    float* lse_gmem = p.lse == nullptr
                          ? nullptr
                          : p.lse + (static_cast<index_t>(batch) * p.heads + head) * p.seqlen_q + warp_row0;
    __syncthreads();   // O staging overwrites tiles other warps' products read
    OutT* smem_warp = reinterpret_cast<OutT*>(smem_ptr) + warp * Kt::kWarpRows * Kt::kHeadDim;
    store_output<EpilogueTraits<Kt>>(loop.acc_o, lse, smem_warp, o_gmem, p.o_row_stride, lse_gmem,
                                     p.seqlen_q - warp_row0, lane);
}

}  // namespace fp8
}  // namespace flashkit
