// Tile geometry, thread roles, register budgets and shared-memory layout of the warp-specialized Hopper
// backward (FlashAttention-3's backward; fa3_bwd.cu).
//
// One CTA per (key block of kBlockN keys, kv head, batch): one producer warpgroup (its thread 0 issues every
// TMA load) and kConsumers consumer warpgroups, which split the key block's work one of two ways:
//   by keys (kBlockN = 64 kConsumers; hd128: 128 keys, two consumers; hd64: 192 keys, three consumers;
//     bwd_consumer.cuh): consumer c owns keys [64 c, 64 c + 64): its rows of S^T, dP^T, dS^T and of the dK,
//     dV accumulators, every head-dim column. Per visited query block of kBlockM queries, dQ = dS K needs
//     every key of the block: at hd128 the consumers exchange dS^T through a shared tile and split dQ's
//     head-dim columns; at hd64 the consumers take the whole dQ of a visit by turns (kDqTurns).
//   by head-dim columns (kBlockN = 64, two consumers; hd192 and hd256, where one warpgroup's dK and dV of every
//     column would take all of its registers; bwd_column_consumer.cuh): both consumers own the 64 keys, each its
//     share of the columns of dK, dV and dQ (BwdShare, below: halves at hd256; at hd192's three panels dQ 2 + dK 1
//     panels for consumer 0, dQ 1 + dK 2 for consumer 1); consumer c computes S^T and dP^T for queries
//     [kSQueries c, kSQueries (c + 1)) only, and the two halves of P^T and dS^T meet in shared tiles.
// Warp w of a consumer owns keys [16 w, 16 w + 16) of its 64 (the m16n8 fragment conventions of
// fragment.cuh apply).
// Shared memory, each tile 1024 B aligned in gmma::KMajorTile's layout (what TMA's 128 B swizzle writes; V and dO
// rows of v's head dim kHeadDimV, the others of kHeadDim):
//   [ K: kBlockN rows | V: kBlockN rows | Q: kStages x kBlockM rows | dO: kStages x kBlockM rows |
//     dS^T: 2 x (kBlockN rows of kBlockM 16-bit queries) | P^T: the same, split by columns only |
//     dQ: one fp32 panel (64 x 64, DqLayout's order) a consumer split by keys; split by columns, the block's
//       kPanels panels where they fit (hd192; not at hd256) |
//     lse2: kStages x kBlockM floats (bulk copies beside the Q tiles), two consumers split by keys only |
//     mbarriers: kv_full, the Q ring, the dO ring | a mask_mod's keep bits: kStages x a word a consumer thread |
//     softcap's slopes on dS on three consumers: 16 B a consumer thread a k-step of queries (stashes_slopes) ]
// dS^T (and P^T) are double-buffered by visit parity, so one named barrier a visit over every consumer orders
// their writes and reads (see bwd_consumer.cuh).
// Why three consumers at hd64: a visit's products there are short (m64n64k16, 4 k-steps each) beside its
// serial chain (S^T wait, exponentials, dS^T, barrier, dQ staging), and a third warpgroup's chain fills the
// tensor pipe's gaps: 15-23% faster than two at 8k (BENCHMARKS.md). It fits 160 registers a consumer; hd128's
// dK and dV (64 x 128 fp32 each) do not.
#pragma once

#include "flashkit/dq_layout.cuh"
#include "flashkit/functor.cuh"   // KernelScoreMod: the build's score modification (its slopes' stash)
#include "flashkit/hopper/ws_traits.cuh"   // TileCoords, kRegisterFile, the stage ring, tma, wgmma

#ifndef FLASHKIT_MASK_WARPS
#define FLASHKIT_MASK_WARPS 0   // a mask_mod's element mask from the producer warpgroup's warps (bwd_keep.cuh)
#endif

namespace flashkit {
namespace hopper {

// Named barrier ids of the backward (0 is __syncthreads): dS^T of a visit complete in shared memory (every
// consumer thread), the deterministic dQ order (every consumer thread, around the semaphore), and one
// barrier a consumer over its own warpgroup (its dS^T rows written where it reads only those; its dQ panel
// written).
constexpr int kBwdDsReadyBarrier = 1;
constexpr int kBwdDqOrderBarrier = 2;
constexpr int kBwdConsumerBarrier = 3;   // + consumer
// The dQ writer's handshake with consumer c (bwd_dq_writer.cuh): its panel stored; its panel read by the reduction.
constexpr int kBwdDqFullBarrier = kBwdConsumerBarrier + kMaxConsumers;   // + consumer
constexpr int kBwdDqEmptyBarrier = kBwdDqFullBarrier + kMaxConsumers;    // + consumer
static_assert(kBwdDqEmptyBarrier + kMaxConsumers <= kNamedBarriers, "the backward's named barriers fit 16");

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, int kHeadDimV_ = kHeadDim_>
struct BwdWsTraits {
    typedef Element_ Element;
    static constexpr int kElemBytes = static_cast<int>(sizeof(Element));
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;   // queries per visited block
    static constexpr int kBlockN = kBlockN_;   // keys per CTA
    static constexpr int kStages = kStages_;   // Q and dO stages

    // The split (see above): by head-dim columns when the key block is one wgmma row block.
    static constexpr bool kSplitColumns = kBlockN == gmma::kWarpgroupRows;
    static constexpr int kConsumerKeys = gmma::kWarpgroupRows;   // keys (wgmma rows) of a consumer's dK, dV
    static constexpr int kConsumers = kSplitColumns ? 2 : kBlockN / kConsumerKeys;
    static constexpr int kOwnCols = kSplitColumns ? kHeadDim / kConsumers : kHeadDim;   // its dK columns (even shares)
    // V, dO and dV: v's head-dim class (kHeadDimV_, below kHeadDim where v is narrower: MLA's 128 under 192's 256),
    // raised to whole 128 B panels a consumer (a column split of 64 columns each needs 128: v of 64 runs at 128,
    // zero-filled past head_dim_v as a padded V is).
    static constexpr int kPanelElems = kTmaPanelBytes / kElemBytes;   // a TMA box's head-dim extent; N of a dQ product
    static constexpr int kMinHeadDimV = (kSplitColumns ? kConsumers : 1) * kPanelElems;
    static constexpr int kHeadDimV = kHeadDimV_ > kMinHeadDimV ? kHeadDimV_ : kMinHeadDimV;
    static constexpr int kOwnColsV = kSplitColumns ? kHeadDimV / kConsumers : kHeadDimV;   // its dV columns (even)
    static constexpr int kPanels = kHeadDim / kPanelElems;     // q / k's 128 B panels
    static constexpr int kPanelsV = kHeadDimV / kPanelElems;   // v's
    // Split by columns, the panels do not halve (hd192's three): each consumer's share is its own (BwdShare<Kt, c>).
    static constexpr bool kUnevenColumns = kSplitColumns && (kPanels % kConsumers != 0 || kPanelsV % kConsumers != 0);
    static constexpr int kSQueries = kSplitColumns ? kBlockM / kConsumers : kBlockM;    // its S^T, dP^T columns
    static constexpr int kConsumerThreads = kConsumers * gmma::kWarpgroupThreads;
    static constexpr int kThreads = kConsumerThreads + gmma::kWarpgroupThreads;   // + the producer warpgroup
    static constexpr int kWarps = kThreads / kWarpSize;
    // A mask_mod's element mask evaluated by the producer warpgroup's warps besides its loading thread's
    // (FLASHKIT_MASK_WARPS, hopper/bwd_keep.cuh), or by the consumers themselves (0).
    static constexpr int kMaskWarps =
        FLASHKIT_MASK_MOD && FLASHKIT_MASK_WARPS ? gmma::kWarpgroupThreads / kWarpSize - 1 : 0;
    static constexpr int kMaskThreads = kMaskWarps * kWarpSize;
    static constexpr bool kListedVisits = FLASHKIT_BLOCK_SPARSE || FLASHKIT_MASK_MOD;   // bwd_lists.cuh's visit lists
    // The consumers' visit count formed again at each test of their loop (BwdVisits::has) rather than held over it:
    // held, it spilled beside a score_mod functor on three consumers (hd64, 4 B); on two consumers split by keys
    // (hd128's) the re-formed count measured 3-4% faster causal (the same non-causal), while hd64's dense three
    // consumers ran 3% slower with it (their group division moved out of the uniform registers).
    static constexpr bool kFreshVisitCount = !kSplitColumns && (kConsumers == 2 || FLASHKIT_SCORE_MOD);

    static constexpr int kRowBytes = kHeadDim * kElemBytes;         // a Q or K row
    static constexpr int kRowBytesV = kHeadDimV * kElemBytes;       // a V or dO row
    static constexpr int kStepElems = gmma::kKBytes / kElemBytes;   // k of one wgmma (16)
    static constexpr int kDSteps = kRowBytes / gmma::kKBytes;       // k-steps over the head dim (S^T)
    static constexpr int kDvSteps = kRowBytesV / gmma::kKBytes;     // over v's (dP^T)
    static constexpr int kQSteps = kBlockM / kStepElems;            // k-steps over queries (dV, dK)
    static constexpr int kQTiles = kSQueries / kMmaN;               // 8-query column tiles of S^T
    // dQ = dS K over every key of the block (k): at hd128 the consumers split the head-dim columns (N = 64 each, one
    // 128 B panel of the K tile); at hd64 half the columns would be N = 32 starting inside a swizzle atom, so they
    // take the visit's whole dQ by turns (kDqTurns): in visit `slot` consumer slot % kConsumers alone computes it
    // (N = 64) and adds it by one bulk reduction. (Each consumer adding the dQ of its own 64 keys staged, read and
    // added in L2 kConsumers 64 x 64 fp32 partials a visit: 1.10-1.18x slower non-causal, 1.73x deterministic.)
    // Split by columns (hd192, hd256): the consumer's own dQ columns (BwdShare), one N = 64 product a 128 B panel,
    // k = the 64 keys.
    static constexpr bool kDqTurns = !kSplitColumns && kHeadDim / kConsumers * kElemBytes < kTmaPanelBytes;
    // The consumer index as a warp-uniform value (a shuffle from lane 0), so that ptxas keeps what derives from it (the
    // consumer's K and V rows, its descriptors, its dQ turn) in uniform registers: three consumers at 160 registers
    // spill 20-68 B without it, and hd64's two consumers (dQ by turns) had every wgmma serialized beside softcap's
    // slopes taken at the recompute (C7519: ptxas took the turn's test as divergent), and beside ALiBi and a window
    // it measured 1.24x faster. Plain elsewhere: hd128's two consumers measured no faster with it and hd128 causal
    // spilled 36 B; hd64's two beside visit lists (a block mask, a mask_mod) without such slopes ran 3-10% slower.
    static constexpr bool kUniformConsumer =
        kConsumers > 2 || (kDqTurns && (!kListedVisits || RecomputedSlopes<KernelScoreMod>::value));
    static constexpr int kDqCols = kDqTurns ? kHeadDim : kHeadDim / kConsumers;   // dQ columns a consumer
    static constexpr int kDqTiles = kDqCols / kMmaN;
    static constexpr int kDqKeySteps = kBlockN / kStepElems;   // dQ's k-steps
    // dK += dS^T Q with dS^T from the consumer's registers (wgmma's A from registers) where the consumers split the
    // keys (hd64: its m64n64 products read both operands from shared memory, which bounds them; 1.02-1.08x), else
    // from its shared tile (16 registers fewer at the visit's peak, where hd128 causal spilled). Not on three
    // consumers of 160 registers beside a modification that reads each score's indices (ALiBi spilled 8-32 B).
    template <class Mod>
    __host__ __device__ static constexpr bool ds_in_registers() {
        return kDqTurns && !(Mod::kIndexed && kConsumers > 2);
    }
    // A modification's slopes on dS (softcap's 1 - tanh^2) taken at the recompute (score_mod.cuh's RecomputedSlopes)
    // as f16 pairs (kQTiles x 2 words a thread), rather than read back from P with a log2 and the LSE row re-read
    // (which also makes them wrong beside caps below the scores); 1.17-1.19x at hd96 / hd128, 1.04-1.06x at hd192 /
    // hd256, softcap with ALiBi 1.07-1.22x. Held in registers on two consumers (hd64's too: softcap with ALiBi, on a
    // block mask); on three of 160 registers (hd64), where held they spilled 72-176 B, stashed in shared memory by each
    // thread for itself (kSlopeBytes).
    static constexpr bool kSlopeStash = kConsumers > 2;   // where such slopes are stashed
    template <class Mod>
    __host__ __device__ static constexpr bool takes_slopes() {   // held or stashed: dS takes them (ds_pair)
        return RecomputedSlopes<Mod>::value;
    }
    template <class Mod>
    __host__ __device__ static constexpr bool holds_slopes() {
        return takes_slopes<Mod>() && !kSlopeStash;
    }
    template <class Mod>
    __host__ __device__ static constexpr bool stashes_slopes() {
        return takes_slopes<Mod>() && kSlopeStash;
    }
    // How dQ reaches dq_accum (DqLayout's order): split by keys, a consumer's 64 x 64 fp32 dQ (its columns at hd128,
    // the whole visit's in its turn at hd64) goes through its own shared panel and one bulk reduction
    // (cp.reduce.async.bulk); split by columns, the whole 64 x kHeadDim block goes through shared panels (hd192: 48 KB
    // beside 176 KB of tiles), each consumer's panels by one bulk reduction, or at hd256 (no shared memory left for
    // 64 KB) by 16-byte reductions from the registers.
    static constexpr bool kDqBulk = !kSplitColumns || kPanels < 4;
    // The staged panels' reductions issued by warps of the producer warpgroup, one a consumer (bwd_dq_writer.cuh): the
    // consumers arrive on a barrier rather than synchronize their warpgroup and wait for their thread 0's issue.
    // Measured (BENCHMARKS.md) 4-11% faster at hd128 (two consumers, dQ split by columns), 2-4% at hd64 by turns (1.45x
    // deterministic; when each of the three consumers added its own keys' dQ, 6% slower causal). Not beside visit lists
    // (a block mask, a mask_mod): with the writers in its region, the loading thread's walk of the lists spilled 8-16 B
    // at 24 registers; nor beside a score_mod functor by turns (hd64: ptxas serialized its wgmma, C7514). With a
    // window, the writer's deterministic turn takes the window's first key block without a chunk's division
    // (bwd_mask.cuh's BwdLocalMask<false>).
    static constexpr bool kDqWriter = kDqBulk && !kListedVisits && !(kDqTurns && FLASHKIT_SCORE_MOD);
    // A writer's panels: every visit of its consumer, or by turns every kConsumers-th visit from its consumer's index;
    // the panels a visit adds to its query block (the deterministic order counts them).
    static constexpr int kDqTurnStride = kDqTurns ? kConsumers : 1;
    static constexpr int kDqVisitPanels = kDqTurns ? 1 : kConsumers;
    static constexpr int kDqWriterWarp0 = 1;   // consumer c's writer: warp kDqWriterWarp0 + c of the producer warpgroup
    static constexpr int kDqHandshake = gmma::kWarpgroupThreads + kWarpSize;   // a consumer and the writer warp
    // setmaxnreg budgets (multiples of 8), as the forward's: 24 + 2 x 240 or 24 + 3 x 160 a lane, within what the
    // launch allocates (kLaunchRegs, below); with mask warps 32 + 2 x 232 (at 24 their evaluation loop spilled
    // 44-104 B).
    static constexpr int kProducerRegs = kMaskWarps > 0 ? 32 : 24;
    static constexpr int kConsumerRegs = kConsumers == 2 ? (kMaskWarps > 0 ? 232 : 240) : 160;
    // Consumer c's first dQ column.
    __host__ __device__ static constexpr int dq_col0(int c) { return kDqTurns ? 0 : c * kDqCols; }
    typedef DqFragments<kBlockM, false> DqLayout;   // dq_accum (dq_layout.cuh), unscaled

    typedef gmma::KMajorTile<kBlockM, kRowBytes> QTile;                 // Q: [query][d]
    typedef gmma::KMajorTile<kBlockN, kRowBytes> KTile;                 // K: [key][d]
    typedef gmma::KMajorTile<kBlockM, kRowBytesV> DoTile;               // dO: [query][dv]
    typedef gmma::KMajorTile<kBlockN, kRowBytesV> VTile;                // V: [key][dv]
    typedef gmma::KMajorTile<kBlockN, kBlockM * kElemBytes> DsTile;     // dS^T: [key][query]
    typedef StageRing<kStages> Ring;

    __host__ __device__ static constexpr int align(int bytes) {
        return (bytes + gmma::kTileAlign - 1) / gmma::kTileAlign * gmma::kTileAlign;
    }
    static constexpr int kKVTileBytes = align(KTile::kBytes);
    static constexpr int kVTileBytes = align(VTile::kBytes);
    static constexpr int kQStageBytes = align(QTile::kBytes);
    static constexpr int kDoStageBytes = align(DoTile::kBytes);
    static constexpr int kDsBufferBytes = align(DsTile::kBytes);
    static constexpr int kDsBuffers = 2;
    static constexpr int kPtBuffers = kSplitColumns ? kDsBuffers : 0;   // P^T shared only when split by columns
    static constexpr int kKOffset = 0;
    static constexpr int kVOffset = kKOffset + kKVTileBytes;
    static constexpr int kQOffset = kVOffset + kVTileBytes;
    static constexpr int kDoOffset = kQOffset + kStages * kQStageBytes;
    static constexpr int kDsOffset = kDoOffset + kStages * kDoStageBytes;
    static constexpr int kPtOffset = kDsOffset + kDsBuffers * kDsBufferBytes;
    static constexpr int kDqBuffers = kDqBulk ? (kSplitColumns ? kPanels : kConsumers) : 0;   // 64 x 64 fp32 panels
    static constexpr int kDqBufferBytes = DqLayout::kPanelBytes;
    static constexpr int kDqOffset = kPtOffset + kPtBuffers * kDsBufferBytes;
    // A visit's lse2 row (kBlockM floats), loaded with Q into its stage's row where two consumers split the keys
    // (hd128). Elsewhere the consumers read it from the workspace: split by columns (hd256) the rows overran shared
    // memory beside a mask_mod's keep bits, and staged they measured no faster; three consumers of 160 registers
    // (hd64) spilled 20 B in one build or another under NVRTC 13.0 or 13.5 in every form tried, staged.
    static constexpr bool kStagedRows = !kSplitColumns && kConsumers == 2;
    static constexpr int kRowVecBytes = kBlockM * static_cast<int>(sizeof(float));
    static constexpr int kLse2Offset = kDqOffset + kDqBuffers * kDqBufferBytes;
    static constexpr int kKvBarOffset = kLse2Offset + (kStagedRows ? kStages * kRowVecBytes : 0);   // kv_full
    static constexpr int kQRingOffset = kKvBarOffset + kBarrierBytes;
    static constexpr int kDoRingOffset = kQRingOffset + Ring::kBytes;
    // A mask_mod's keep bits: one word a consumer thread, written by the consumer thread itself before the visit's
    // products (bwd_consumer_base.cuh's stage_keep), or one a Q stage written by the mask warps (hopper/bwd_keep.cuh:
    // their arrivals complete the stage).
    static constexpr int kKeepRowBits = 2 * kQTiles;   // a key row's bits in a word: its S^T fragment's queries
    static_assert(2 * kKeepRowBits <= 32, "a consumer thread's keep bits fit one word");
    static constexpr int kKeepSets = kMaskWarps > 0 ? kStages : 1;
    static constexpr int kKeepStageBytes = kConsumerThreads * 4;   // (at hd256 two stages overrun shared memory)
    static constexpr int kKeepBytes = FLASHKIT_MASK_MOD ? kKeepSets * kKeepStageBytes : 0;
    static constexpr int kKeepOffset = kDoRingOffset + Ring::kBytes;
    // The slope stash (stashes_slopes, for the build's modification): [consumer][k-step of queries][thread] of 16 B,
    // the four f16 pairs of a k-step's two column tiles (a warp's access: 512 contiguous bytes).
    static constexpr int kSlopeStepBytes = 16;
    static constexpr int kSlopeBytes =
        RecomputedSlopes<KernelScoreMod>::value && kSlopeStash ? kConsumerThreads * kQSteps * kSlopeStepBytes : 0;
    static constexpr int kSlopeOffset =   // 16 B aligned (the barriers before it are 8 B)
        (kKeepOffset + kKeepBytes + kSlopeStepBytes - 1) / kSlopeStepBytes * kSlopeStepBytes;
    static constexpr int kSmemBytes = kSlopeOffset + kSlopeBytes + gmma::kTileAlign;   // + alignment slack

    static_assert(kElemBytes == 2, "16-bit inputs (wgmma's transposed operands are 16-bit only)");
    static_assert(kBlockM == gmma::kWarpgroupRows, "one wgmma row block of queries: dQ's M is 64");
    static_assert(kBlockN == kConsumers * kConsumerKeys || kSplitColumns,
                  "key blocks of 64 keys a consumer, or 64 (by columns)");
    static_assert(kConsumers >= 2 && kConsumers <= kMaxConsumers, "2 or 3 consumer warpgroups");
    static_assert(kConsumers == 2 || kDqTurns, "more than two consumers take dQ by turns");
    static_assert(kRowBytes % kTmaPanelBytes == 0, "head dims of whole 128 B panels (64, 128, 256)");
    static_assert(kRowBytesV % kTmaPanelBytes == 0 && kHeadDimV <= kHeadDim, "v's: whole panels, at most q's");
    static_assert(kBlockM * kElemBytes == kTmaPanelBytes, "a dS^T row is one 128 B swizzle panel");
    static_assert(kUnevenColumns || kDqCols % kPanelElems == 0, "dQ's N: whole 128 B panels of the K tile");
    static_assert(kStages >= 2, "Q and dO of the next visit load under this one");
    static_assert(!kDqBulk || kSplitColumns || kDqCols == DqLayout::kPanelCols,
                  "split by keys: a staged dQ is one panel");
    // setmaxnreg moves registers within what the launch gave the CTA (__launch_bounds__(kThreads, 1): the file's
    // share of a thread, in granules of 8, for each thread); a budget over it makes the consumers' setmaxnreg.inc wait
    // forever (32 + 2 x 240 hung at hd128, where the launch gives 384 x 168).
    static constexpr int kLaunchRegs = kRegisterFile / kThreads / 8 * 8;
    static_assert((kProducerRegs + kConsumers * kConsumerRegs) * gmma::kWarpgroupThreads <= kLaunchRegs * kThreads,
                  "register budgets fit what the launch allocates");
    static_assert(!kDqWriter || (kMaskWarps == 0 && kDqWriterWarp0 + kConsumers <= gmma::kWarpgroupThreads / kWarpSize),
                  "the dQ writers: warps of the producer warpgroup besides the loading thread's, no mask warps");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
    static_assert(kSlopeBytes == 0 || (kSlopeStepBytes == 2 * 2 * sizeof(u32) && kQTiles == 2 * kQSteps),
                  "a slope stash step: the f16 pairs (two a column tile) of a k-step's two column tiles");
};

// The head-dim columns of dK, dV and dQ a consumer owns (its share; every consumer's the same size where kC is
// kAnyConsumer, at columns formed from its runtime index):
//   split by keys (hd64, hd128): every column of dK and dV; dQ's kDqCols from Kt::dq_col0;
//   split by columns, even (hd256): half of each, consumer c's from c kOwnCols;
//   split by columns, uneven (Kt::kUnevenColumns: hd192's three 128 B panels): consumer kC's own, a compile-time
//     constant: dQ's first ceil(P / 2) panels to consumer 0 and dK's last ceil(P / 2) to consumer 1, so that each
//     issues the same number of panels' products a visit (hd192: dQ 2 + dK 1, dQ 1 + dK 2) and holds the same number
//     of accumulator panels where dV's first ceil(PV / 2) panels go to consumer 0 (192 / 128: dK 1 + dV 1 against
//     dK 2 + dV 1; 192: dK 1 + dV 2 against dK 2 + dV 1). The 96-column halves would start dQ's and dK's products
//     inside a 128 B swizzle panel of K and Q.
constexpr int kAnyConsumer = -1;

template <class Kt, int kC = kAnyConsumer>
struct BwdShare {
    static constexpr bool kByIndex = kC == kAnyConsumer;
    static constexpr int kPe = Kt::kPanelElems;
    static constexpr int kDqPanels0 = (Kt::kPanels + 1) / 2;    // consumer 0's dQ panels (uneven)
    static constexpr int kDkPanels0 = Kt::kPanels / 2;          // its dK panels
    static constexpr int kDvPanels0 = (Kt::kPanelsV + 1) / 2;   // its dV panels
    static constexpr int kDkCols = kByIndex ? Kt::kOwnCols : (kC == 0 ? kDkPanels0 : Kt::kPanels - kDkPanels0) * kPe;
    static constexpr int kDvCols = kByIndex ? Kt::kOwnColsV : (kC == 0 ? kDvPanels0 : Kt::kPanelsV - kDvPanels0) * kPe;
    static constexpr int kDqCols = kByIndex ? Kt::kDqCols : (kC == 0 ? kDqPanels0 : Kt::kPanels - kDqPanels0) * kPe;
    static constexpr int kDkTiles = kDkCols / kMmaN;   // 8-wide column tiles of dK
    static constexpr int kDvTiles = kDvCols / kMmaN;   // of dV
    static constexpr int kDqTiles = kDqCols / kMmaN;   // of dQ
    static constexpr int kDqPanels = kDqCols / kPe;    // dQ products a k-step (split by columns)
    static constexpr int kAccTiles = kDkTiles > kDvTiles ? kDkTiles : kDvTiles;

    // Consumer `consumer`'s first dK, dV and dQ column.
    __host__ __device__ static constexpr int dk_col0(int consumer) {
        if constexpr (kByIndex) return Kt::kSplitColumns ? consumer * Kt::kOwnCols : 0;
        return kC == 0 ? 0 : kDkPanels0 * kPe;
    }
    __host__ __device__ static constexpr int dv_col0(int consumer) {
        if constexpr (kByIndex) return Kt::kSplitColumns ? consumer * Kt::kOwnColsV : 0;
        return kC == 0 ? 0 : kDvPanels0 * kPe;
    }
    __host__ __device__ static constexpr int dq_col0(int consumer) {
        if constexpr (kByIndex) return Kt::dq_col0(consumer);
        return kC == 0 ? 0 : kDqPanels0 * kPe;
    }

    static_assert(kByIndex ? !Kt::kUnevenColumns : Kt::kUnevenColumns && kC >= 0 && kC < Kt::kConsumers,
                  "a consumer's own share only where the shares differ");
    static_assert(!Kt::kSplitColumns || (kDkCols % kPe == 0 && kDvCols % kPe == 0 && kDqCols % kPe == 0),
                  "split by columns: whole 128 B panels a consumer");
    static_assert(kDkTiles > 0 && kDvTiles > 0 && kDqTiles > 0, "every consumer owns columns of each");
};

// Consumer c's dQ share from its runtime index (the dQ writer's view, bwd_dq_writer.cuh): its first column and its
// 64 x 64 fp32 panels; where the shares differ, as sums linear in c (a select of the two consumers' constants took the
// writer warp, at 24 registers, a register over them beside a window: 4 B spilled).
template <class Kt>
struct BwdDqShares {
    typedef BwdShare<Kt, Kt::kUnevenColumns ? 0 : kAnyConsumer> First;
    typedef BwdShare<Kt, Kt::kUnevenColumns ? 1 : kAnyConsumer> Second;
    __device__ __forceinline__ static int col0(int c) {
        if constexpr (Kt::kUnevenColumns) return c * Second::dq_col0(1);
        else return First::dq_col0(c);
    }
    __device__ __forceinline__ static int panels(int c) {
        if constexpr (Kt::kUnevenColumns) return First::kDqPanels + c * (Second::kDqPanels - First::kDqPanels);
        else return First::kDqPanels;
    }
    static_assert(!Kt::kUnevenColumns || Kt::kConsumers == 2, "two consumers, c = 0, 1");
};

}  // namespace hopper
}  // namespace flashkit
