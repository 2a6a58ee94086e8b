// The visits of a backward CTA, shared by both backward kernels (sm80/bwd_walk.cuh, hopper/bwd_cta.cuh): the key
// block's CTA visits, for every query head of its kv head's group (GQA / MQA: dK, dV summed in the CTA), the query
// blocks that see any key of the block: from the mask's intervals (causal, a window: bwd_mask.cuh), or from the visit
// lists built on the GPU for a block mask or a mask_mod (bwd_lists.cuh).
#pragma once

#include "flashkit/bwd_lists.cuh"
#include "flashkit/traits.cuh"

namespace flashkit {

// One visit of a CTA: query block m_block of query head `head`; partial: a mask_mod's element mask applies.
struct BwdVisit {
    int head, m_block;
    bool partial;
};

// The visits of key block n_block: every query head of the kv head's group (GQA / MQA: dK, dV summed in
// the CTA), each over the query blocks that see any key of the block (Mask: bwd_mask.cuh).
template <int kBlockM, int kBlockN, class Mask, bool kListed = Mask::kListed>
struct BwdVisits {
    int group;     // query heads per kv head
    int m_begin;   // first visited query block of each head
    int n_m;       // visited query blocks per head
    int total;     // visits of the CTA (0: no query sees the block; dK = dV = 0)
    int head0;     // first query head of the group

    __device__ __forceinline__ BwdVisits(const Params& p, int n_block, int kv_head, int /*batch*/) {
        group = p.heads / p.kv_heads;
        head0 = kv_head * group;
        const Mask mask(p);
        const int n0 = n_block * kBlockN;
        m_begin = mask.m_begin(n0, kBlockM);
        n_m = max(mask.m_end(min(n0 + kBlockN, p.seqlen_k), kBlockM) - m_begin, 0);
        total = group * n_m;
    }
    __device__ __forceinline__ BwdVisit at(int i) const { return {head0 + i / n_m, m_begin + i % n_m, false}; }
    // Whether visit i exists; kFresh (BwdWsTraits::kFreshVisitCount): with the count formed again at each test from n_m
    // (live for at()) through a volatile move, rather than held over the visits as `total`.
    template <bool kFresh>
    __device__ __forceinline__ bool has(int i) const { return i < (kFresh ? group * fresh_value(n_m) : total); }
    // v = at(next), from v = at(next - 1), with no division (the loading thread's 24 registers).
    __device__ __forceinline__ void advance(BwdVisit& v, int /*next*/) const {
        if (++v.m_block == m_begin + n_m) {
            v.m_block = m_begin;
            ++v.head;
        }
    }
};

// With lists (a block mask or a mask_mod, bwd_lists.cuh): each head of the group visits its row's list of key
// block n_block (one row for every head where the lists broadcast over heads).
template <int kBlockM, int kBlockN, class Mask>
struct BwdVisits<kBlockM, kBlockN, Mask, true> {
    const Params& p;
    int head0, batch, n_block;
    int total;

    __device__ __forceinline__ BwdVisits(const Params& p_, int n_block_, int kv_head, int batch_)
        : p(p_), batch(batch_), n_block(n_block_) {
        const int group = p.heads / p.kv_heads;
        head0 = kv_head * group;
        if (p.bwd_lists.heads == 1) {
            total = group * count(head0)[1];
        } else {
            total = 0;
            for (int h = 0; h < group; ++h) total += count(head0 + h)[1];
        }
    }
    __device__ __forceinline__ int row(int head) const {
        return list_row(p.bwd_lists, batch, head, n_block, p.bwd_lists.k_tiles);
    }
    // {partial visits, all visits} of head's row
    __device__ __forceinline__ const int* count(int head) const { return p.bwd_lists.count + 2 * row(head); }
    __device__ __forceinline__ BwdVisit at(int i) const {
        int head = head0;
        if (p.bwd_lists.heads == 1) {
            const int n = count(head0)[1];
            head += i / n;
            i %= n;
        } else {
            for (int n = count(head)[1]; i >= n; n = count(head)[1]) {
                i -= n;
                ++head;
            }
        }
        const int r = row(head);
        return {head, p.bwd_lists.list[static_cast<index_t>(r) * p.bwd_lists.q_tiles + i],
                i < p.bwd_lists.count[2 * r]};
    }
    template <bool>
    __device__ __forceinline__ bool has(int i) const { return i < total; }
    __device__ __forceinline__ void advance(BwdVisit& v, int next) const {
        if (next < total) v = at(next);
    }
};

}  // namespace flashkit
