// Hopper warpgroup matrix multiply (wgmma, sm_90a): shared-memory matrix descriptors, the
// ordering instructions, and e4m3 (m64nNk32) or bf16 / f16 (m64nNk16) products into f32
// (N = 64, 128, 256; 96 and 192 for P V): 32 bytes of k per instruction either way.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; all 128 threads
// issue every wgmma together. Accumulator layout (PTX ISA, "Register Fragments" of wgmma), for
// the warp w of its warpgroup, g = lane / 4, t = lane % 4: d[i][0..1] = D[16 w + g][8 i + 2 t + {0, 1}],
// d[i][2..3] = D[16 w + g + 8][same columns] -- per warp exactly the C fragments of N / 8
// mma.m16n8 tiles, so masks, softmax and the epilogue of the mma.sync kernels apply unchanged.
// A from registers: the warp's rows 16 w .. 16 w + 15 in the A fragment of mma.m16n8k32 (8-bit:
// a0 = A[16 w + g][4 t .. 4 t + 3], a1 = rows + 8, a2 / a3 = 16 k-indices later) or of
// mma.m16n8k16 (16-bit: a0 = A[16 w + g][2 t, 2 t + 1], a1 = rows + 8, a2 / a3 = 8 k later).
// Both operands are read K-major here (8-bit operands have no other layout).
//
// Shared-memory operands (K-major, swizzled): a tile of R rows x K bytes is stored as panels of
// kPanelBytes = min(K, 128) bytes of every row; panel p holds bytes [p W, (p + 1) W) of each row,
// row r at r W, its 16 B chunk c at chunk c ^ swizzle(r): r % 8 for 128 B panels, (r / 2) % 4
// for 64 B panels -- the hardware's 128 B / 64 B swizzle modes, whose pattern repeats every
// 8 rows (the "stride byte offset" 8 W of the descriptor). Tiles start 1024 B aligned.
#pragma once

#include "flashkit/tile.cuh"

namespace flashkit {
namespace gmma {

typedef unsigned long long u64;

constexpr int kWarpgroupThreads = 128;
constexpr int kWarpgroupRows = 64;       // m of every wgmma
constexpr int kKBytes = 32;              // k of a wgmma in bytes (k32 e4m3, k16 bf16 / f16)
constexpr int kMaxPanelBytes = 128;      // the widest swizzle
constexpr int kSwizzleRepeatRows = 8;    // rows per swizzle pattern
constexpr int kTileAlign = 1024;         // 8 rows x 128 B: a tile start keeps the pattern's phase

// Descriptor fields (PTX ISA, "Matrix Descriptor Format"): addresses and offsets in 16 B units.
constexpr int kDescAddrShift = 4;
constexpr u32 kDescAddrMask = 0x3FFFF;
constexpr int kDescLeadingShift = 16;
constexpr int kDescStrideShift = 32;
constexpr int kDescSwizzleShift = 62;

template <int kPanelBytes>
struct Swizzle;
template <>
struct Swizzle<128> {
    static constexpr u64 kMode = 1;
    __device__ __forceinline__ static int key(int row) { return row & 7; }
};
template <>
struct Swizzle<64> {
    static constexpr u64 kMode = 2;
    __device__ __forceinline__ static int key(int row) { return (row >> 1) & 3; }
};

// A K-major tile of kRows rows x kRowBytes bytes in the panel layout above.
template <int kRows, int kRowBytes>
struct KMajorTile {
    static constexpr int kPanelBytes = kRowBytes < kMaxPanelBytes ? kRowBytes : kMaxPanelBytes;
    static constexpr int kPanels = kRowBytes / kPanelBytes;
    static constexpr int kPanelSize = kRows * kPanelBytes;
    static constexpr int kBytes = kRows * kRowBytes;
    static_assert(kRowBytes % kPanelBytes == 0 && (kPanelBytes == 64 || kPanelBytes == 128),
                  "rows of 64 B or a multiple of 128 B");
    static_assert(kRows % kSwizzleRepeatRows == 0, "whole swizzle patterns");

    // Byte offset of (row, 16 B chunk of the row).
    __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
        constexpr int kPanelChunks = kPanelBytes / kChunkBytes;
        const int panel = chunk / kPanelChunks;
        const int c = (chunk % kPanelChunks) ^ Swizzle<kPanelBytes>::key(row);
        return panel * kPanelSize + row * kPanelBytes + c * kChunkBytes;
    }

    // A descriptor of this layout: start address, leading byte offset (already in 16 B units),
    // the stride byte offset of one swizzle pattern (8 rows), and the swizzle mode.
    __device__ __forceinline__ static u64 encode(u32 addr, u32 leading_units) {
        constexpr u32 kStride = kSwizzleRepeatRows * kPanelBytes;
        return (static_cast<u64>((addr & kDescAddrMask) >> kDescAddrShift)) |
               (static_cast<u64>(leading_units) << kDescLeadingShift) |
               (static_cast<u64>(kStride >> kDescAddrShift) << kDescStrideShift) |
               (Swizzle<kPanelBytes>::kMode << kDescSwizzleShift);
    }

    // Descriptor of the (64 or N) x 32 B slab at rows [row0, ..), bytes [kbyte, kbyte + 32):
    // the start moves within the panel (the hardware swizzles the final address), the leading
    // byte offset is unused by swizzled K-major layouts (1 by convention).
    __device__ __forceinline__ static u64 desc(u32 tile_base, int row0, int kbyte) {
        return encode(tile_base + (kbyte / kPanelBytes) * kPanelSize + row0 * kPanelBytes + kbyte % kPanelBytes, 1);
    }

    // Descriptor of the same tile read MN-major (as a B operand with transpose-b): its rows are
    // the k dimension, a row's bytes the N dimension. The k-slab starts at row k_row0 (a multiple
    // of 8); the leading byte offset steps to the next 128 B of N (the next panel), the stride
    // byte offset to the next 8 rows of k (the swizzle pattern). 128 B panels only.
    __device__ __forceinline__ static u64 desc_mn_major(u32 tile_base, int k_row0) {
        static_assert(kPanelBytes == kMaxPanelBytes, "MN-major reads of 128 B panels");
        return encode(tile_base + k_row0 * kPanelBytes, kPanelSize >> kDescAddrShift);
    }

    // Asynchronously copy kRows rows (row r at gmem + r * row_stride) into the tile; rows >=
    // rows_valid are zero-filled (tile.cuh's load_rows_async with this layout).
    template <int kThreads>
    __device__ __forceinline__ static void load_async(u32 tile_base, const u8* gmem, index_t row_stride,
                                                      int rows_valid, int tid) {
        load_rows_async<kRows, kRowBytes, kThreads, KMajorTile>(tile_base, gmem, row_stride, rows_valid, tid);
    }
};

// ---- ordering ----------------------------------------------------------------------------
// Before the first wgmma of a batch (and after registers it reads were written otherwise).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most kPending committed batches are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) and read next by wgmma:
// each writing thread fences before the barrier that publishes it.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keep an asynchronous product's register operands in place (no spill, no reorder): its accumulators (float)
// across the product, and register A fragments (u32) formed before the fence that precedes it (else the compiler may
// sink their conversions past the fence, and ptxas inserts a warpgroup arrive of its own before the product, which
// in a loop it cannot prove uniform serializes every wgmma: C7519).
__device__ __forceinline__ void fence_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_register(u32& r) { asm volatile("" : "+r"(r)::"memory"); }
template <typename T, int kTiles>
__device__ __forceinline__ void fence_registers(T (&d)[kTiles][4]) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_register(d[i][e]);
}

// ---- D (+)= A B -> f32, m64nNk(32 bytes) -------------------------------------------------------
// Mma<T, kN>: T = float8_e4m3_t (k32), bfloat16_t or half_t (k16); kN = 32, 64, 128, 256 (and 112 for the
// 16-bit types).
// ss: A and B by descriptor; rs: A from registers (four 32-bit registers a thread: the
// m16n8k32 / m16n8k16 A fragment of the thread's warp). accumulate = 0 overwrites D (the
// hardware's scale-d). Both operands are K-major (16-bit types pass transpose = 0; e4m3 has no
// transpose). Inline asm takes no loops, so a macro spells out each (type, N): FLASHKIT_GMMA_N<N>_*
// are the accumulator operand list and the operand numbers after it.
#define FLASHKIT_GMMA_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define FLASHKIT_GMMA_ACC32(b)                                                                         \
    FLASHKIT_GMMA_ACC4(b), FLASHKIT_GMMA_ACC4(b + 1), FLASHKIT_GMMA_ACC4(b + 2), FLASHKIT_GMMA_ACC4(b + 3), \
        FLASHKIT_GMMA_ACC4(b + 4), FLASHKIT_GMMA_ACC4(b + 5), FLASHKIT_GMMA_ACC4(b + 6), FLASHKIT_GMMA_ACC4(b + 7)
#define FLASHKIT_GMMA_N64_ACC FLASHKIT_GMMA_ACC32(0)
#define FLASHKIT_GMMA_N128_ACC FLASHKIT_GMMA_ACC32(0), FLASHKIT_GMMA_ACC32(8)
#define FLASHKIT_GMMA_N256_ACC \
    FLASHKIT_GMMA_ACC32(0), FLASHKIT_GMMA_ACC32(8), FLASHKIT_GMMA_ACC32(16), FLASHKIT_GMMA_ACC32(24)
#define FLASHKIT_GMMA_N64_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASHKIT_GMMA_N64_SS "%32, %33"
#define FLASHKIT_GMMA_N64_SS_PRED "%34"
#define FLASHKIT_GMMA_N64_RS "{%32, %33, %34, %35}, %36"
#define FLASHKIT_GMMA_N64_RS_PRED "%37"
#define FLASHKIT_GMMA_N128_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLASHKIT_GMMA_N128_SS "%64, %65"
#define FLASHKIT_GMMA_N128_SS_PRED "%66"
#define FLASHKIT_GMMA_N128_RS "{%64, %65, %66, %67}, %68"
#define FLASHKIT_GMMA_N128_RS_PRED "%69"
#define FLASHKIT_GMMA_N256_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FLASHKIT_GMMA_N256_SS "%128, %129"
#define FLASHKIT_GMMA_N256_SS_PRED "%130"
#define FLASHKIT_GMMA_N256_RS "{%128, %129, %130, %131}, %132"
#define FLASHKIT_GMMA_N256_RS_PRED "%133"
// N = 32: the backward's S^T and dP^T of half a query block (split by columns, bwd_column_consumer.cuh).
#define FLASHKIT_GMMA_N32_ACC FLASHKIT_GMMA_ACC4(0), FLASHKIT_GMMA_ACC4(1), FLASHKIT_GMMA_ACC4(2), FLASHKIT_GMMA_ACC4(3)
#define FLASHKIT_GMMA_N32_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FLASHKIT_GMMA_N32_SS "%16, %17"
#define FLASHKIT_GMMA_N32_SS_PRED "%18"
#define FLASHKIT_GMMA_N32_RS "{%16, %17, %18, %19}, %20"
#define FLASHKIT_GMMA_N32_RS_PRED "%21"
// N = 96 and 192: the P V product of head dims 96 and 192 (MmaBT only).
#define FLASHKIT_GMMA_N96_ACC FLASHKIT_GMMA_ACC32(0), FLASHKIT_GMMA_ACC4(8), FLASHKIT_GMMA_ACC4(9), FLASHKIT_GMMA_ACC4(10), FLASHKIT_GMMA_ACC4(11)
#define FLASHKIT_GMMA_N96_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define FLASHKIT_GMMA_N96_SS "%48, %49"
#define FLASHKIT_GMMA_N96_SS_PRED "%50"
#define FLASHKIT_GMMA_N96_RS "{%48, %49, %50, %51}, %52"
#define FLASHKIT_GMMA_N96_RS_PRED "%53"
#define FLASHKIT_GMMA_N192_ACC FLASHKIT_GMMA_ACC32(0), FLASHKIT_GMMA_ACC32(8), FLASHKIT_GMMA_ACC32(16)
#define FLASHKIT_GMMA_N192_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define FLASHKIT_GMMA_N192_SS "%96, %97"
#define FLASHKIT_GMMA_N192_SS_PRED "%98"
#define FLASHKIT_GMMA_N192_RS "{%96, %97, %98, %99}, %100"
#define FLASHKIT_GMMA_N192_RS_PRED "%101"

// N = 112: the S = Q K^T product of hd96's 112-key tiles (three consumers, fa3.cu's sweep), 16-bit types only.
#define FLASHKIT_GMMA_N112_ACC FLASHKIT_GMMA_ACC32(0), FLASHKIT_GMMA_ACC4(8), FLASHKIT_GMMA_ACC4(9), FLASHKIT_GMMA_ACC4(10), FLASHKIT_GMMA_ACC4(11), FLASHKIT_GMMA_ACC4(12), FLASHKIT_GMMA_ACC4(13)
#define FLASHKIT_GMMA_N112_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}"
#define FLASHKIT_GMMA_N112_SS "%56, %57"
#define FLASHKIT_GMMA_N112_SS_PRED "%58"
#define FLASHKIT_GMMA_N112_RS "{%56, %57, %58, %59}, %60"
#define FLASHKIT_GMMA_N112_RS_PRED "%61"

template <typename T, int kN>
struct Mma;

// The two member functions every product type below defines, for m64nN with SHAPE_TYPES (the
// "k32.f32.e4m3.e4m3"-like suffix) and IMM, the immediates after the predicate (scale-a, scale-b[,
// transpose-a][, transpose-b]): ss, A and B by descriptor; rs, A from four 32-bit registers.
#define FLASHKIT_GMMA_SS(N, SHAPE_TYPES, IMM)                                                        \
    __device__ __forceinline__ static void ss(float (&d)[N / 8][4], u64 a, u64 b, int accumulate) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHKIT_GMMA_N##N##_SS_PRED ", 0;\n"         \
                     "wgmma.mma_async.sync.aligned.m64n" #N SHAPE_TYPES " " FLASHKIT_GMMA_N##N##_REGS       \
                     ", " FLASHKIT_GMMA_N##N##_SS ", p, " IMM ";\n}\n"                                   \
                     : FLASHKIT_GMMA_N##N##_ACC                                                     \
                     : "l"(a), "l"(b), "r"(accumulate));                                            \
    }
#define FLASHKIT_GMMA_RS(N, SHAPE_TYPES, IMM)                                                        \
    __device__ __forceinline__ static void rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 b,        \
                                              int accumulate) {                                   \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHKIT_GMMA_N##N##_RS_PRED ", 0;\n"         \
                     "wgmma.mma_async.sync.aligned.m64n" #N SHAPE_TYPES " " FLASHKIT_GMMA_N##N##_REGS       \
                     ", " FLASHKIT_GMMA_N##N##_RS ", p, " IMM ";\n}\n"                                   \
                     : FLASHKIT_GMMA_N##N##_ACC                                                     \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));        \
    }

// SS_IMM / RS_IMM: the immediates of Mma's two forms (both operands K-major).
#define FLASHKIT_GMMA_DEFINE(T, N, SHAPE_TYPES, SS_IMM, RS_IMM) \
    template <>                                              \
    struct Mma<T, N> {                                       \
        FLASHKIT_GMMA_SS(N, SHAPE_TYPES, SS_IMM)             \
        FLASHKIT_GMMA_RS(N, SHAPE_TYPES, RS_IMM)             \
    };

#define FLASHKIT_GMMA_DEFINE_TYPE(T, SHAPE_TYPES, SS_IMM, RS_IMM)  \
    FLASHKIT_GMMA_DEFINE(T, 32, SHAPE_TYPES, SS_IMM, RS_IMM)       \
    FLASHKIT_GMMA_DEFINE(T, 64, SHAPE_TYPES, SS_IMM, RS_IMM)       \
    FLASHKIT_GMMA_DEFINE(T, 128, SHAPE_TYPES, SS_IMM, RS_IMM)      \
    FLASHKIT_GMMA_DEFINE(T, 256, SHAPE_TYPES, SS_IMM, RS_IMM)

FLASHKIT_GMMA_DEFINE_TYPE(float8_e4m3_t, "k32.f32.e4m3.e4m3", "1, 1", "1, 1")
FLASHKIT_GMMA_DEFINE_TYPE(bfloat16_t, "k16.f32.bf16.bf16", "1, 1, 0, 0", "1, 1, 0")
FLASHKIT_GMMA_DEFINE_TYPE(half_t, "k16.f32.f16.f16", "1, 1, 0, 0", "1, 1, 0")

FLASHKIT_GMMA_DEFINE(bfloat16_t, 112, "k16.f32.bf16.bf16", "1, 1, 0, 0", "1, 1, 0")
FLASHKIT_GMMA_DEFINE(half_t, 112, "k16.f32.f16.f16", "1, 1, 0, 0", "1, 1, 0")

// MmaBT<T, kN>: D (+)= A B with B read MN-major (transpose-b = 1; 16-bit types only): B's rows are k, its N
// elements contiguous -- a row-major V tile for O += P V. rs: A from registers; ss: A by descriptor, K-major
// (the backward's P^T and dS^T tiles when split by columns).
template <typename T, int kN>
struct MmaBT;

#define FLASHKIT_GMMA_DEFINE_BT(T, N, SHAPE_TYPES)    \
    template <>                                      \
    struct MmaBT<T, N> {                             \
        FLASHKIT_GMMA_RS(N, SHAPE_TYPES, "1, 1, 1")    \
        FLASHKIT_GMMA_SS(N, SHAPE_TYPES, "1, 1, 0, 1") \
    };

FLASHKIT_GMMA_DEFINE_BT(bfloat16_t, 64, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_BT(bfloat16_t, 128, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_BT(bfloat16_t, 256, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_BT(half_t, 64, "k16.f32.f16.f16")
FLASHKIT_GMMA_DEFINE_BT(half_t, 128, "k16.f32.f16.f16")
FLASHKIT_GMMA_DEFINE_BT(half_t, 256, "k16.f32.f16.f16")
FLASHKIT_GMMA_DEFINE_BT(bfloat16_t, 96, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_BT(bfloat16_t, 192, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_BT(half_t, 96, "k16.f32.f16.f16")
FLASHKIT_GMMA_DEFINE_BT(half_t, 192, "k16.f32.f16.f16")

// MmaTT<T, kN>::ss: D (+)= A B with both operands from shared memory read MN-major (transpose-a =
// transpose-b = 1; 16-bit types only): A's rows are k, its M elements contiguous (the backward's dS^T
// tile [key][query] read as dS), B's rows are k, its N elements contiguous (the K tile read as B of
// dQ = dS K). The descriptors are KMajorTile::desc_mn_major of the stored tiles. N = 64 only: one whole
// 128 B swizzle atom along M and N, the canonical MN-major layout (a narrower N would start a descriptor
// inside an atom).
template <typename T, int kN>
struct MmaTT;

#define FLASHKIT_GMMA_DEFINE_TT(T, N, SHAPE_TYPES) \
    template <>                                   \
    struct MmaTT<T, N> {                          \
        FLASHKIT_GMMA_SS(N, SHAPE_TYPES, "1, 1, 1, 1") \
    };

FLASHKIT_GMMA_DEFINE_TT(bfloat16_t, 64, "k16.f32.bf16.bf16")
FLASHKIT_GMMA_DEFINE_TT(half_t, 64, "k16.f32.f16.f16")

}  // namespace gmma
}  // namespace flashkit
