// FP8 (e4m3) block quantization of a (batch, seqlen, heads, D) tensor, with optional Hadamard
// incoherent processing (flashkit/features/fp8.py compiles and launches it; sm_89+ for the e4m3 cvt).
//
// One CTA per (row block, head, batch). For each row x of the block:
//   hadamard:  x <- H (signs * x) / sqrt(D)   (random-sign Walsh-Hadamard, orthogonal)
//   amax       = max |x| over the block's rows
//   scale      = amax / 448 (1 when amax = 0);  q = e4m3_rn_satfinite(x * (448 / amax))
//
// Work split. A row is kLanesPerRow lanes (a power of two <= 32), each holding kPerLane
// contiguous elements (element e = lane_in_row * kPerLane + i), loaded as kVecBytes vectors; a
// warp covers kRowsPerWarp rows at once and the CTA kRowsPerStep. A tile is kSteps such steps
// (kTileRows rows) held in registers (kTileRegisters a thread at most: the raw words, or for
// Hadamard the rotated floats, RawTile / RotatedTile), all kSteps loads issued before any is
// used. A block of at most kTileRows rows (the default 128 rows up to head dim 256) is read from
// DRAM once: amax, then quantize from the registers. A taller block is read twice, tile by tile
// (the second read mostly hits L2). At head dim 128 this runs at about 93% of a device copy's
// bandwidth (H100; BENCHMARKS.md).
//
// Modes: 0 fused (amax, scale, quantize); 1 amax only (scales <- amax); 2 quantize with
// scales[] holding a given amax (written back as the scale), for per-tensor scales.
// Defines: FLASHKIT_DTYPE (input element), FLASHKIT_HEAD_DIM, FLASHKIT_HADAMARD (0 or 1),
// FLASHKIT_QUANT_THREADS (the launch's block size), FLASHKIT_ALIGN (a power of two <= 16 that
// divides the input's address and every stride in bytes).
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {
namespace fp8q {

__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int floor_pow2(int x) { return x < 2 ? 1 : 2 * floor_pow2(x / 2); }
__host__ __device__ constexpr int pow2_factor(int x) { return x & -x; }   // the largest power of two dividing x

constexpr int kThreads = FLASHKIT_QUANT_THREADS;
constexpr int kWarps = kThreads / 32;
constexpr int kD = FLASHKIT_HEAD_DIM;
constexpr bool kHadamard = FLASHKIT_HADAMARD != 0;
constexpr int kAlign = FLASHKIT_ALIGN;
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
static_assert(!kHadamard || (kD & (kD - 1)) == 0, "Hadamard: power-of-two head dim");
static_assert(kD >= 1 && kD <= 1024, "1 <= head dim <= 1024");
static_assert(kAlign >= 1 && kAlign <= 16 && (kAlign & (kAlign - 1)) == 0, "alignment: power of two <= 16");

constexpr int kElemBytes = sizeof(Element);
constexpr int kWordElems = 4 / kElemBytes;           // elements in a 32-bit word (2 or 1)
constexpr int kMinPerLane = 16 / kElemBytes;         // elements of one 16-byte load
constexpr int kLanesPerRow = floor_pow2(imin(32, imax(1, kD / kMinPerLane)));
// ceil(D / lanes), rounded up to whole words; elements past D are padding (0, never stored)
constexpr int kPerLane = ((kD + kLanesPerRow - 1) / kLanesPerRow + kWordElems - 1) / kWordElems * kWordElems;
constexpr int kWords = kPerLane / kWordElems;
constexpr int kChunkBytes = kPerLane * kElemBytes;
constexpr int kRowBytes = kD * kElemBytes;
// A vector must lie wholly inside or wholly past the row: its size divides D's bytes too.
constexpr int kVecBytes = imin(imin(16, kAlign), imin(pow2_factor(kChunkBytes), pow2_factor(kRowBytes)));
constexpr int kRowsPerWarp = 32 / kLanesPerRow;
constexpr int kRowsPerStep = kWarps * kRowsPerWarp;
constexpr int kTargetTileRows = 128;                 // the default scale block (features/fp8.py DEFAULT_BLOCK)
// Registers a thread spends on the tile: kSteps steps of raw words (kWords each) and, when it
// keeps rotated rows, their floats (kPerLane each); a raw tile also needs one row's floats.
constexpr int kTileRegisters = 48;
__host__ __device__ constexpr int steps_within(int step_registers, int fixed_registers) {
    return imax(1, imin(kTargetTileRows / kRowsPerStep, (kTileRegisters - fixed_registers) / step_registers));
}
// Hadamard keeps the rotated rows (the butterflies, bound by shuffles, then run once) when a
// default block still fits one tile; otherwise it re-derives them from the raw words.
constexpr bool kKeepRotated = kHadamard && steps_within(kWords + kPerLane, 0) * kRowsPerStep >= kTargetTileRows;
constexpr int kSteps = kKeepRotated ? steps_within(kWords + kPerLane, 0) : steps_within(kWords, kPerLane);
constexpr int kTileRows = kSteps * kRowsPerStep;
// e4m3 output: one byte an element, stored in vectors that divide the lane's bytes and D.
constexpr int kOutWords = (kPerLane + 3) / 4;
constexpr int kOutVecBytes = imin(16, imin(pow2_factor(kPerLane), pow2_factor(kD)));
// Two CTAs an SM (64 registers at 512 threads) overlap one's loads with the other's shuffles and
// stores. A Hadamard lane of more than 12 registers (words + floats: fp32 at head dim 256, 16-bit
// above 256) needs more than 64 for the butterflies' temporaries. The CPU tier compiles the grid.
constexpr int kLaneRegisters = kWords + kPerLane;
constexpr int kMinBlocksPerSm = (kHadamard && kLaneRegisters > 12) ? 1 : 2;
static_assert(!kHadamard || kD < 2 * kPerLane || kPerLane * kLanesPerRow == kD,
              "Hadamard: the row splits evenly over its lanes");

enum Mode { kFused = 0, kAmaxOnly = 1, kGivenAmax = 2 };

// ---- loads: a lane's kPerLane raw elements of one row, as 32-bit words (0 past D) ----------------
// (A template on the vector size, so that only the taken `if constexpr` branch is instantiated.)
template <int kVec = kVecBytes>
__device__ __forceinline__ void load_chunk(u32 (&w)[kWords], const u8* row, int lane_in_row, bool valid) {
    const int first = lane_in_row * kChunkBytes;
#pragma unroll
    for (int j = 0; j < kChunkBytes / kVec; ++j) {
        const int off = first + j * kVec;
        const bool in = valid && off < kRowBytes;
        const u8* p = row + off;
        if constexpr (kVec == 16) {
            const uint4 x = in ? *reinterpret_cast<const uint4*>(p) : uint4{0u, 0u, 0u, 0u};
            w[4 * j] = x.x, w[4 * j + 1] = x.y, w[4 * j + 2] = x.z, w[4 * j + 3] = x.w;
        } else if constexpr (kVec == 8) {
            const uint2 x = in ? *reinterpret_cast<const uint2*>(p) : uint2{0u, 0u};
            w[2 * j] = x.x, w[2 * j + 1] = x.y;
        } else if constexpr (kVec == 4) {
            w[j] = in ? *reinterpret_cast<const u32*>(p) : 0u;
        } else {   // 2-byte elements on a 2-byte alignment: two loads a word
            static_assert(kVec == 2 && kElemBytes == 2, "vectors hold whole elements");
            const u32 x = in ? *reinterpret_cast<const u16*>(p) : 0u;
            w[j / 2] = (j % 2 == 0) ? x : (w[j / 2] | (x << 16));
        }
    }
}

template <typename E = Element>
__device__ __forceinline__ float element(const u32 (&w)[kWords], int i) {
    if constexpr (sizeof(E) == 4) {
        return __uint_as_float(w[i]);
    } else {
        E x;
        x.bits = static_cast<u16>(w[i / 2] >> (16 * (i % 2)));
        return to_float(x);
    }
}

// The Hadamard signs of the lane's elements as a bit mask (bit i set: element i is negated),
// read once: the lane's elements are the same in every row.
static_assert(!kHadamard || kPerLane <= 32, "Hadamard: at most 32 elements a lane (one mask word)");
__device__ __forceinline__ u32 sign_flips(const float* signs, int lane_in_row) {
    u32 flips = 0;
    if constexpr (kHadamard) {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int e = lane_in_row * kPerLane + i;
            if (e < kD && signs[e] < 0.f) flips |= 1u << i;
        }
    }
    return flips;
}

// The lane's elements of the row as floats, Hadamard-rotated when asked.
__device__ __forceinline__ void row_values(float (&v)[kPerLane], const u32 (&w)[kWords], u32 flips,
                                           int lane_in_row) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] = element(w, i);
    if constexpr (kHadamard) {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)   // x * sign: flip the sign bit
            v[i] = __uint_as_float(__float_as_uint(v[i]) ^ (((flips >> i) & 1u) << 31));
        // Butterflies (a, b) -> (a + b, a - b) for index pairs h apart: h < kPerLane within a
        // lane, larger h across the row's lanes (lane bit h / kPerLane).
        constexpr int kLocal = imin(kPerLane, kD);
#pragma unroll
        for (int h = 1; h < kLocal; h <<= 1)
#pragma unroll
            for (int i = 0; i < kPerLane; ++i)
                if ((i & h) == 0) {
                    const float a = v[i], b = v[i + h];
                    v[i] = a + b;
                    v[i + h] = a - b;
                }
#pragma unroll
        for (int ls = 1; ls < kLanesPerRow; ls <<= 1)
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const float other = __shfl_xor_sync(0xffffffffu, v[i], ls);
                v[i] = (lane_in_row & ls) ? other - v[i] : v[i] + other;
            }
        const float norm = rsqrtf(static_cast<float>(kD));
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) v[i] *= norm;
    }
}

// ---- stores: the lane's e4m3 bytes of one row ----------------------------------------------------
template <int kVec = kOutVecBytes>
__device__ __forceinline__ void store_chunk(u8* row, const float (&v)[kPerLane], float inv, int lane_in_row) {
    u32 b[kOutWords];
#pragma unroll
    for (int j = 0; j < kOutWords; ++j) {
        float x[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = 4 * j + i < kPerLane ? v[4 * j + i] * inv : 0.f;
        b[j] = pack_e4m3x4(x[0], x[1], x[2], x[3]);
    }
    const int first = lane_in_row * kPerLane;
#pragma unroll
    for (int j = 0; j < kPerLane / kVec; ++j) {
        const int off = first + j * kVec;
        if (off >= kD) continue;
        u8* p = row + off;
        if constexpr (kVec == 16) {
            *reinterpret_cast<uint4*>(p) = uint4{b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]};
        } else if constexpr (kVec == 8) {
            *reinterpret_cast<uint2*>(p) = uint2{b[2 * j], b[2 * j + 1]};
        } else if constexpr (kVec == 4) {
            *reinterpret_cast<u32*>(p) = b[j];
        } else {   // 2 or 1 bytes
            constexpr int kPerWord = 4 / kVec;
            const u32 x = b[j / kPerWord] >> (8 * kVec * (j % kPerWord));
            if constexpr (kVec == 2) *reinterpret_cast<u16*>(p) = static_cast<u16>(x);
            else *p = static_cast<u8>(x);
        }
    }
}

// Where this thread's rows of a tile are: row(step) = tile_row0 + step * kRowsPerStep + my_row.
struct TileLanes {
    int my_row;        // warp * kRowsPerWarp + lane / kLanesPerRow
    int lane_in_row;   // lane % kLanesPerRow
};

__device__ __forceinline__ void load_tile(u32 (&raw)[kSteps][kWords], const u8* base, long long row_bytes,
                                          int tile_row0, int row_end, TileLanes t) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {   // every load issued before any is used
        const int r = tile_row0 + s * kRowsPerStep + t.my_row;
        load_chunk(raw[s], base + r * row_bytes, t.lane_in_row, r < row_end);
    }
}

// A tile as a thread keeps it from the amax pass to the quantize pass; values(s, v) gives the
// floats (rotated when Hadamard) of its row of step s (rows past the block read as 0).
// RawTile keeps the loaded words: converting them again is a few instructions (and, for a
// Hadamard tile too tall to keep rotated, the butterflies again).
struct RawTile {
    u32 raw[kSteps][kWords];
    __device__ __forceinline__ void load(const u8* base, long long row_bytes, int tile_row0, int row_end,
                                         TileLanes t, const float*) {
        load_tile(raw, base, row_bytes, tile_row0, row_end, t);
    }
    __device__ __forceinline__ void values(int s, float (&v)[kPerLane], TileLanes t, const float* signs) const {
        row_values(v, raw[s], sign_flips(signs, t.lane_in_row), t.lane_in_row);
    }
};

// RotatedTile (Hadamard, kKeepRotated) keeps the rotated floats: the butterflies run once.
struct RotatedTile {
    float x[kSteps][kPerLane];
    __device__ __forceinline__ void load(const u8* base, long long row_bytes, int tile_row0, int row_end,
                                         TileLanes t, const float* signs) {
        u32 raw[kSteps][kWords];
        load_tile(raw, base, row_bytes, tile_row0, row_end, t);
        const u32 flips = sign_flips(signs, t.lane_in_row);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) row_values(x[s], raw[s], flips, t.lane_in_row);
    }
    __device__ __forceinline__ void values(int s, float (&v)[kPerLane], TileLanes, const float*) const {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) v[i] = x[s][i];
    }
};

template <bool kRotated> struct TileFor { typedef RawTile type; };
template <> struct TileFor<true> { typedef RotatedTile type; };
typedef TileFor<kKeepRotated>::type Tile;

}  // namespace fp8q
}  // namespace flashkit

extern "C" __global__ void __launch_bounds__(flashkit::fp8q::kThreads, flashkit::fp8q::kMinBlocksPerSm)
    flashkit_fp8_quantize(const flashkit::Element* __restrict__ x, long long batch_stride, long long row_stride,
                          long long head_stride, unsigned char* __restrict__ out, float* scales,
                          const float* __restrict__ signs, int seqlen, int heads, int block_rows, int mode) {
    using namespace flashkit;
    using namespace flashkit::fp8q;
    const int blk = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const TileLanes t{warp * kRowsPerWarp + lane / kLanesPerRow, lane % kLanesPerRow};
    const int r0 = blk * block_rows;
    const int r1 = min(r0 + block_rows, seqlen);
    const int tiles = (r1 - r0 + kTileRows - 1) / kTileRows;
    const u8* base = reinterpret_cast<const u8*>(x + batch * batch_stride + head * head_stride);
    const long long row_bytes = row_stride * kElemBytes;
    float* scale = scales + (static_cast<long long>(batch) * heads + head) * gridDim.x + blk;
    __shared__ float warp_amax[kWarps];
    Tile tile;
    float v[kPerLane];

    float amax;
    if (mode == kGivenAmax) {
        amax = *scale;
    } else {
        float m = 0.f;
        for (int n = 0; n < tiles; ++n) {
            tile.load(base, row_bytes, r0 + n * kTileRows, r1, t, signs);
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {   // rows past the block read as 0
                tile.values(s, v, t, signs);
#pragma unroll
                for (int i = 0; i < kPerLane; ++i)
                    if (t.lane_in_row * kPerLane + i < kD) m = fmaxf(m, fabsf(v[i]));
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (lane == 0) warp_amax[warp] = m;
        __syncthreads();
        amax = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
        if (mode == kAmaxOnly) {
            if (threadIdx.x == 0) *scale = amax;
            return;
        }
    }
    __syncthreads();   // every thread has read *scale before thread 0 overwrites it
    const bool nonzero = amax > 0.f;
    if (threadIdx.x == 0) *scale = nonzero ? amax / kE4m3Max : 1.f;
    const float inv = nonzero ? kE4m3Max / amax : 1.f;   // x / scale, as 448 / amax
    const bool resident = tiles == 1 && mode == kFused;  // the block's one tile is still held
    for (int n = 0; n < tiles; ++n) {
        const int tile_row0 = r0 + n * kTileRows;
        if (!resident) tile.load(base, row_bytes, tile_row0, r1, t, signs);   // Hadamard: the whole warp
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            const int r = tile_row0 + s * kRowsPerStep + t.my_row;
            tile.values(s, v, t, signs);
            if (r < r1)
                store_chunk(out + ((static_cast<long long>(batch) * seqlen + r) * heads + head) * kD, v, inv,
                            t.lane_in_row);
        }
    }
}
