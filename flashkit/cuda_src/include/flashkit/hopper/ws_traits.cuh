// Tile geometry, thread roles, register budgets and shared-memory layout of the warp-specialized
// Hopper forward (FlashAttention-3's design; fa3.cu).
//
// One CTA: one producer warpgroup (its first warp issues every TMA load) and kConsumers = kBlockM / 64
// consumer warpgroups, consumer c owning query rows [64 c, 64 c + 64) of the block. Warp w of a
// consumer owns rows [16 w, 16 w + 16) of those, so the mma.sync fragment conventions (apply_mask,
// OnlineSoftmax, pack_a_fragment) serve unchanged. Shared memory, each tile 1024 B aligned in
// gmma::KMajorTile's layout (what TMA's 128 B swizzle writes, one 128 B panel per box):
//   [ Q: kBlockM rows | K: kStages tiles of kBlockN rows | V: likewise | (O: kBlockM rows) | mbarriers:
//     q_full, q_empty, the rings | (8-bit: each stage's scales) ]
// Each consumer stages its O for the TMA store in its own rows of the O tile: a tile of its own after the
// V stages when kOwnOTile (the persistent kernels: Q is handed back for the next tile as soon as the last
// S product has read it, and the O store drains under the next tile's main loop), else the Q tile. Either
// has the Q tile's layout.
//
// kHeadDimV (default kHeadDim) is the head dim of V and O, at most kHeadDim (DeepSeek's MLA: 192 / 128):
// S = Q K^T runs over kHeadDim (Q and K rows of kRowBytes), O += P V, the O accumulator and the epilogue
// over kHeadDimV (V rows of kVRowBytes). Every panel is 128 B wide, so O's first kOPanels panels are a
// prefix of the Q tile's panels in the same swizzle: O staged there is the O tile TMA stores.
// 8-bit inputs (e4m3, fa3_fp8.cu): OutT is 16-bit, so O rows are twice Q's bytes and O always has a tile of
// its own; and e4m3 wgmma reads B K-major only, so V arrives transposed (Vt: kHeadDimV rows of kBlockN keys,
// the pre-pass of v_transpose.cuh) and P V reads it K-major (kVTransposed).
#pragma once

#include "flashkit/hopper/pipeline.cuh"
#include "flashkit/hopper/tma.cuh"
#include "flashkit/hopper/wgmma.cuh"

namespace flashkit {
namespace hopper {

// Named barrier ids: 0 is __syncthreads; then one scheduling barrier per consumer (ping-pong),
// then one epilogue barrier per consumer.
constexpr int kSchedulerBarrierBase = 1;
constexpr int kMaxConsumers = 3;
constexpr int kEpilogueBarrierBase = kSchedulerBarrierBase + kMaxConsumers;
constexpr int kRegisterFile = 65536;   // 32-bit registers of one SM
constexpr int kStageScaleBytes = 16;   // an 8-bit K stage's scales: four floats (stage_scales.cuh)

// The roles of a warp-specialized CTA, shared by the forward (ws_cta.cuh) and the backward (bwd_cta.cuh):
// warpgroup 0 produces (its thread 0 issues every load), warpgroups 1 .. kConsumers consume.
struct WsRoles {
    u32 smem;        // 1024 B aligned base of the CTA's shared-memory layout
    int tid;
    int warpgroup;   // 0: producer; 1..kConsumers: consumer warpgroup - 1

    __device__ __forceinline__ explicit WsRoles(u32 smem_)
        : smem(smem_), tid(threadIdx.x), warpgroup(tid / gmma::kWarpgroupThreads) {}
    __device__ __forceinline__ bool producer() const { return warpgroup == 0; }
    __device__ __forceinline__ bool issuer() const { return tid == 0; }   // the producer thread that loads
    __device__ __forceinline__ int consumer() const { return warpgroup - 1; }
};

// The thread's index in its warpgroup from a fresh read of %tid.x (fresh_thread_index, traits.cuh).
__device__ __forceinline__ int fresh_warpgroup_thread() { return fresh_thread_index() % gmma::kWarpgroupThreads; }

// Where a tile starts in a contract tensor: the TMA coordinates past the head-dim panel.
struct TileCoords {
    int row;    // first row (query or key index)
    int head;   // head (Q, O) or kv head (K, V)
    int batch;
};

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, int kHeadDimV_ = kHeadDim_,
          bool kOwnOTile_ = false, typename OutT_ = Element_>
struct WsTraits {
    typedef Element_ Element;
    typedef OutT_ OutT;
    static constexpr int kElemBytes = static_cast<int>(sizeof(Element));
    static constexpr int kHeadDim = kHeadDim_;     // Q and K (the S = Q K^T product)
    static constexpr int kHeadDimV = kHeadDimV_;   // V and O (the P V product, the epilogue)
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kStages = kStages_;
    static constexpr bool kOwnOTile = kOwnOTile_;

    static constexpr int kConsumers = kBlockM / gmma::kWarpgroupRows;
    static constexpr int kConsumerThreads = kConsumers * gmma::kWarpgroupThreads;
    static constexpr int kThreads = kConsumerThreads + gmma::kWarpgroupThreads;   // + the producer warpgroup
    // setmaxnreg budgets (multiples of 8): the producer keeps a few, the consumers share the rest.
    static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
    static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
    // The consumer index warp-uniform (warp_uniform) on three consumers and beside a mask_mod functor, so that ptxas
    // keeps what derives from it (the Q tile's descriptors) in uniform registers: the persistent loop held them in 8
    // registers a thread over every tile and spilled them (hd64 / hd96 packed 12-56 B, hd96 causal 8 B, hd128's causal
    // mask_mods 20-40 B). On two consumers without a mask_mod it measured 1-3% slower (hd128, hd192, the block mask).
    static constexpr bool kUniformConsumer = kConsumers > 2 || FLASHKIT_MASK_MOD;

    static constexpr int kWarpRows = kMmaM;
    static constexpr int kMTiles = 1;
    static constexpr int kNTiles = kBlockN / kMmaN;          // 8-key column tiles of S
    static constexpr int kDTiles = kHeadDimV / kMmaN;        // 8-wide column tiles of O
    // Tile rows in shared memory: whole 128 B panels (hd96: two, the second half zero-filled by TMA's
    // out-of-bounds fill and never read by a product); the products run over kHeadDim / kHeadDimV only.
    __host__ __device__ static constexpr int whole_panels(int bytes) {
        return (bytes + kTmaPanelBytes - 1) / kTmaPanelBytes * kTmaPanelBytes;
    }
    static constexpr bool kVTransposed = kElemBytes == 1;   // 8-bit: V arrives as Vt (K-major keys)
    static constexpr int kRowBytes = whole_panels(kHeadDim * kElemBytes);   // a Q or K row
    static constexpr int kVRowBytes =
        kVTransposed ? kBlockN * kElemBytes : whole_panels(kHeadDimV * kElemBytes);   // a V (Vt) row
    static constexpr int kORowBytes = whole_panels(kHeadDimV * static_cast<int>(sizeof(OutT)));   // a staged O row
    static constexpr int kQKSteps = kHeadDim * kElemBytes / gmma::kKBytes;
    static constexpr int kPVSteps = kBlockN * kElemBytes / gmma::kKBytes;
    static constexpr int kStepKeys = gmma::kKBytes / kElemBytes;   // keys per k-step of P V
    static constexpr int kPanelElems = kTmaPanelBytes / kElemBytes;
    static constexpr int kPanels = kRowBytes / kTmaPanelBytes;      // of a Q or K tile
    static constexpr int kOPanels = kORowBytes / kTmaPanelBytes;    // of the staged O
    static constexpr int kOPanelElems = kTmaPanelBytes / static_cast<int>(sizeof(OutT));

    typedef gmma::KMajorTile<kBlockM, kRowBytes> QTile;
    typedef gmma::KMajorTile<kBlockN, kRowBytes> KTile;
    // V: K's layout at V's row bytes, read MN-major; Vt: kHeadDimV rows of the tile's keys, read K-major.
    typedef gmma::KMajorTile<kVTransposed ? kHeadDimV : kBlockN, kVRowBytes> VTile;
    typedef gmma::KMajorTile<kBlockM, kORowBytes> OTile;   // O staged for the TMA store
    typedef StageRing<kStages> Ring;

    __host__ __device__ static constexpr int align(int bytes) {
        return (bytes + gmma::kTileAlign - 1) / gmma::kTileAlign * gmma::kTileAlign;
    }
    static constexpr int kQOffset = 0;
    static constexpr int kKOffset = align(QTile::kBytes);
    static constexpr int kKStageBytes = align(KTile::kBytes);
    static constexpr int kVStageBytes = align(VTile::kBytes);
    static constexpr int kVOffset = kKOffset + kStages * kKStageBytes;
    static constexpr int kOOffset = kOwnOTile ? kVOffset + kStages * kVStageBytes : kQOffset;   // O staging
    static constexpr int kOTileBytes = align(QTile::kBytes > OTile::kBytes ? QTile::kBytes : OTile::kBytes);
    static constexpr int kQBarOffset = kVOffset + kStages * kVStageBytes + (kOwnOTile ? kOTileBytes : 0);
    static constexpr int kQEmptyBarOffset = kQBarOffset + kBarrierBytes;       // q_empty
    static constexpr int kKRingOffset = kQEmptyBarOffset + kBarrierBytes;
    static constexpr int kVRingOffset = kKRingOffset + Ring::kBytes;
    // 8-bit inputs: each K stage's K and V scales, staged by the producer (stage_scales.cuh).
    static constexpr bool kStagedScales = kElemBytes == 1;
    static constexpr int kScaleOffset = kVRingOffset + Ring::kBytes;
    static constexpr int kSmemBytes =
        kScaleOffset + (kStagedScales ? kStages * kStageScaleBytes : 0) + gmma::kTileAlign;   // + alignment slack

    static_assert(kConsumers >= 2 && kConsumers <= kMaxConsumers, "2 or 3 consumer warpgroups");
    static_assert(kBlockM == kConsumers * gmma::kWarpgroupRows, "64 query rows per consumer warpgroup");
    static_assert(kBlockN == 64 || kBlockN == 128 || kBlockN == 256 || (kElemBytes == 2 && kBlockN == 112),
                  "K/V tiles of 64, 128 or 256 keys (16-bit: also 112; gmma::Mma's widths)");
    static_assert(kElemBytes == 2 || (kElemBytes == 1 && kOwnOTile && kHeadDimV == kHeadDim),
                  "16-bit inputs, or 8-bit with an O tile of its own (no head_dim_v)");
    static_assert(kHeadDim * kElemBytes % gmma::kKBytes == 0, "head dims of whole 32 B product steps (16 elements)");
    static_assert(kHeadDimV % kMmaN == 0 && kHeadDimV <= kHeadDim,
                  "head_dim_v: whole 8-column tiles, at most the head dim (O is staged in the Q tile's panels)");
    static_assert(kOwnOTile || (OTile::kBytes <= QTile::kBytes && QTile::kPanelBytes == OTile::kPanelBytes),
                  "O staged in the Q tile: its panels are a prefix of the Q tile's");
    static_assert((kProducerRegs + kConsumers * kConsumerRegs) * gmma::kWarpgroupThreads <= kRegisterFile,
                  "register budgets fit the register file");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
};

}  // namespace hopper
}  // namespace flashkit
