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
#include "flashkit/tile.cuh"   // smem_u32

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

// Shared memory by address: the staging of a TMA store or a bulk operation, the tiles wgmma reads (st_shared_b32 and
// ld_shared_v4: tile.cuh). The word a thread itself stored there (no other thread's store to order against).
__device__ __forceinline__ u32 ld_shared_b32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
// The kernel's dynamic shared memory (the warp-specialized kernels' tiles and barriers; ws_smem_base aligns it).
__device__ __forceinline__ unsigned char* dynamic_smem() {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    return smem_raw;
}
// Two floats that a TMA or bulk copy wrote (addr 8 B aligned; read after the mbarrier wait that completes the copy).
// A plain load of the dynamic shared memory, not an asm statement: ordered after the wait (whose asm clobbers
// memory) and otherwise scheduled freely (a volatile asm load, with dsum staged too, made fp16 hd128 causal
// relative_bias spill 20 B).
__device__ __forceinline__ float2 ld_shared_f2(u32 addr) {
    unsigned char* smem = dynamic_smem();
    return *reinterpret_cast<const float2*>(smem + (addr - smem_u32(smem)));
}
// shared[addr .. addr + 16) = v[0..3] (addr 16 B aligned).
__device__ __forceinline__ void st_shared_v4(u32 addr, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void st_shared_v4(u32 addr, const float (&v)[4]) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
                 : "memory");
}

// Global memory accessed through both the generic proxy (loads, atomics) and the async one (bulk
// operations): orders this thread's accesses of one proxy before its later accesses of the other.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// shared[dst .. dst + bytes) = global[src .. src + bytes), completing `bytes` on the mbarrier at bar (a plain bulk
// copy, no tensor map: both 16 B aligned, bytes a multiple of 16).
__device__ __forceinline__ void bulk_load(u32 dst, const float* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// global[dst .. dst + bytes) += shared[src .. src + bytes), elementwise fp32 (the adds are atomic at L2); both
// 16 B aligned, bytes a multiple of 16. The same fence-and-synchronize discipline as tma_store.
__device__ __forceinline__ void bulk_reduce_add(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}

// The issuing thread's bulk operations (tma_store, bulk_reduce_add): close the group of those issued so far;
// wait until every one has read its shared memory (which may then be rewritten); wait until every one has
// completed its global writes.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace hopper
}  // namespace flashkit
