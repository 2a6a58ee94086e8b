// The Tensor Memory Accelerator as seen from the device (sm_90): tensor maps, tile loads that
// complete on an mbarrier, and tile stores from shared memory.
//
// A tensor map (CUtensorMap, 128 opaque bytes) is encoded on the host by cuTensorMapEncodeTiled
// (flashkit/runtime/tma.py) and passed by value as a `const __grid_constant__` kernel parameter;
// the instructions take its generic address. flashkit's maps describe a contract tensor
// (batch, seqlen, heads, head_dim) as four dimensions, innermost first: (head_dim, seqlen, heads,
// batch), a box of (one 128 B panel of the head dim, rows, 1, 1), 128 B swizzle: each box lands as
// one panel of gmma::KMajorTile's layout (row r at r * 128 B, 16 B chunk c at c ^ (r % 8)), the
// layout wgmma's descriptors read. Elements outside the tensor read as zero and are never written.
#pragma once

#include "flashkit/numeric.cuh"

namespace flashkit {
namespace hopper {

constexpr int kTensorMapBytes = 128;
constexpr int kTmaPanelBytes = 128;   // the box's inner extent: the 128 B swizzle span

struct alignas(64) TensorMap {
    unsigned long long opaque[kTensorMapBytes / sizeof(unsigned long long)];
};

__device__ __forceinline__ unsigned long long map_address(const TensorMap& map) {
    return reinterpret_cast<unsigned long long>(&map);
}

// Fetch the descriptor into the TMA unit's cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_address(map)) : "memory");
}

// Box at coordinates (c0 = head-dim element, c1 = row, c2 = head, c3 = batch) -> shared memory
// at `dst`; its bytes count down the transaction count of mbarrier `bar`.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap& map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(dst),
        "l"(map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Shared memory at `src` -> the box at (c0, c1, c2, c3); clipped to the tensor. The writing
// threads fence (fence_proxy_async) and synchronize before one thread issues it.
__device__ __forceinline__ void tma_store(const TensorMap& map, u32 src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     map_address(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

// Close the group of stores issued so far, and wait until every store has read its shared memory.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace hopper
}  // namespace flashkit
