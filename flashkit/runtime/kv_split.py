"""The split-KV plan of the decode kernel: how many key chunks per (row block, kv head, sequence).

Split only when the unsplit grid cannot fill the GPU: the chunk count is the smallest whose waves of CTAs
are at least 95% as full as the best count's (flash-decoding's heuristic), with every warp of a CTA still
walking at least MIN_TILES_PER_WARP tiles of its chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32
ROW_TILE = 16                   # packed rows per CTA (one m16 tile)
KEY_TILE = 16                   # keys per warp tile
FILLED = 0.8                    # an unsplit grid this full (of one wave) is left alone
NEAR_BEST = 0.95                # the smallest split count within this fraction of the best wave efficiency
MAX_SPLITS = 128
MIN_TILES_PER_WARP = 4
SMEM_RESERVED = 1024            # per CTA, the runtime's own
MAX_THREADS_PER_SM = 2048
DEFAULT_SMS = 132               # an H100 SXM, when no device is known (explain without a GPU)
DEFAULT_SMEM_PER_SM = 228 * 1024


@dataclass(frozen=True)
class SplitPlan:
    splits: int
    row_blocks: int            # blocks of 16 packed (query row, group head) rows per kv head
    ctas: int                  # CTAs of the first stage
    ctas_per_sm: int
    sms: int

    def describe(self) -> str:
        combine = "no combine pass" if self.splits == 1 else "then a combine pass"
        return (f"path: split-KV decode, {self.splits} split{'s' if self.splits > 1 else ''} of the keys "
                f"({self.ctas} CTAs = {self.splits} x {self.row_blocks} row block(s) x kv heads x batch, "
                f"{self.ctas_per_sm} per SM on {self.sms} SMs), {combine}")


def smem_bytes(cfg: dict[str, int], head_dim: int, elem_bytes: int = 2) -> int:
    """DecodeTraits::kSmemBytes: the Q tile plus each warp's ring of (K, V) tile pairs."""
    row = head_dim * elem_bytes
    return ROW_TILE * row + cfg["warps"] * cfg["stages"] * 2 * KEY_TILE * row


def ctas_per_sm(cfg: dict[str, int], head_dim: int, smem_per_sm: int = DEFAULT_SMEM_PER_SM) -> int:
    by_smem = smem_per_sm // (smem_bytes(cfg, head_dim) + SMEM_RESERVED)
    return max(1, min(by_smem, MAX_THREADS_PER_SM // (cfg["warps"] * WARP_SIZE)))


def split_count(base_ctas: int, key_tiles: int, slots: int, warps: int) -> int:
    """Splits for base_ctas unsplit CTAs over key_tiles tiles of keys on `slots` concurrent CTAs."""
    if base_ctas >= FILLED * slots:
        return 1
    most = min(MAX_SPLITS, max(1, key_tiles // (warps * MIN_TILES_PER_WARP)), max(1, slots // max(base_ctas, 1) * 2))
    if most <= 1:
        return 1
    eff = {}
    for s in range(1, most + 1):
        waves = base_ctas * s / slots
        eff[s] = waves / -(-waves // 1)
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= NEAR_BEST * best)


def plan(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
         cfg: dict[str, int], sms: int | None = None, smem_per_sm: int | None = None) -> SplitPlan:
    """The split plan of a call; seqlen_k is the longest sequence (a cache's capacity)."""
    sms = sms or DEFAULT_SMS
    per_sm = ctas_per_sm(cfg, head_dim, smem_per_sm or DEFAULT_SMEM_PER_SM)
    row_blocks = -(-seqlen_q * (heads // kv_heads) // ROW_TILE)
    base = row_blocks * kv_heads * batch
    splits = split_count(base, -(-seqlen_k // KEY_TILE), sms * per_sm, cfg["warps"])
    return SplitPlan(splits, row_blocks, base * splits, per_sm, sms)


def split_note(spec, req, sms: int | None = None, smem_per_sm: int | None = None) -> str:
    """The explain line of a split-KV variant: which path a request takes and with how many splits."""
    assumed = "" if sms else f" (assumed: {DEFAULT_SMS} SMs, no device)"
    cfg = spec.launch_config(req.cc, req.head_dim)
    sp = plan(req.batch, req.heads, req.kv_heads, req.seqlen_q, req.seqlen_k, req.head_dim, cfg, sms, smem_per_sm)
    return sp.describe() + assumed
