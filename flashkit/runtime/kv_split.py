"""The split-KV plan of the decode kernel: how many key chunks per (row block, kv head, sequence).

A decode call reads each key and value once; the question is how many CTAs read them. Measured on the H100
(`python3 -m flashkit.bench.decode`, BENCHMARKS.md): one CTA of the decode kernel on each of 64 SMs already
reads K and V at the device-copy rate (8 x 32k keys, 32/8 heads, unsplit: 103% of the copy rate; 1 x 128k in
8 splits: 98%), while every further split costs its chunk's fixed work (the Q load, the ring's fill, the
warps' merge, the partial's write and its read in the combine pass) and a second CTA on an SM makes a tail
(1 x 128k: 32 splits, two CTAs an SM, 91%; 17 splits, 136 CTAs, 86%). So split only when the unsplit grid
holds fewer CTAs than it takes to draw the device's bandwidth (fill_ctas), into the fewest chunks that reach that
many, never past one CTA an SM, and with every warp of a CTA still walking at least MIN_TILES_PER_WARP tiles of its
chunk.

How many CTAs draw the bandwidth: the H100's 60 (45% of its SMs) at its 3.35 TB/s peak, so one CTA draws about
CTA_READ_BPS; the H200 (4.8 TB/s, the same 132 SMs) needs about 86, measured (BENCHMARKS.md): 8 x 32k keys went from
0.92x to 0.98x cuDNN with 2 splits in place of 1, 1 x 128k from 0.91x to 0.97x with 12 in place of 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARP_SIZE = 32
ROW_TILE = 16                   # packed rows per CTA (one m16 tile)
KEY_TILE = 16                   # keys per warp tile
CTA_READ_BPS = 56e9             # peak DRAM bytes a second one decode CTA draws: the H100's 3.35e12 over 60 CTAs
REFERENCE_BPS_PER_SM = 3.35e12 / 132   # where the device's bandwidth is unknown: the H100 SXM's peak per SM
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


def fill_ctas(sms: int, bandwidth: float = 0.0) -> int:
    """CTAs (one an SM) that read at the copy rate on `sms` SMs of `bandwidth` peak bytes a second (0: unknown, the
    H100's per SM)."""
    bandwidth = bandwidth or REFERENCE_BPS_PER_SM * sms
    return max(1, min(sms, math.ceil(round(bandwidth / CTA_READ_BPS, 6))))


def split_count(base_ctas: int, key_tiles: int, sms: int, warps: int, bandwidth: float = 0.0) -> int:
    """Splits for base_ctas unsplit CTAs over key_tiles tiles of keys on `sms` SMs of `bandwidth` bytes a second."""
    fill = fill_ctas(sms, bandwidth)
    if base_ctas >= fill:
        return 1
    most = min(MAX_SPLITS, key_tiles // (warps * MIN_TILES_PER_WARP), sms // max(base_ctas, 1))
    return max(1, min(most, -(-fill // max(base_ctas, 1))))


def plan(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
         cfg: dict[str, int], sms: int | None = None, smem_per_sm: int | None = None,
         bandwidth: float = 0.0) -> SplitPlan:
    """The split plan of a call; seqlen_k is the longest sequence (a cache's capacity), head_dim the compiled class;
    bandwidth the device's peak (0: unknown)."""
    sms = sms or DEFAULT_SMS
    per_sm = ctas_per_sm(cfg, head_dim, smem_per_sm or DEFAULT_SMEM_PER_SM)
    row_blocks = -(-seqlen_q * (heads // kv_heads) // ROW_TILE)
    base = row_blocks * kv_heads * batch
    splits = split_count(base, -(-seqlen_k // KEY_TILE), sms, cfg["warps"], bandwidth)
    return SplitPlan(splits, row_blocks, base * splits, per_sm, sms)


def split_note(spec, req, sms: int | None = None, smem_per_sm: int | None = None, bandwidth: float = 0.0) -> str:
    """The explain line of a split-KV variant: which path a request takes and with how many splits."""
    assumed = "" if sms else f" (assumed: {DEFAULT_SMS} SMs, no device)"
    cfg = spec.launch_config(req.cc, req.head_dim, req.build_mods, req.causal, req.seqlen_q)
    sp = plan(req.batch, req.heads, req.kv_heads, req.seqlen_q, req.seqlen_k, spec.head_dims.class_of(req.head_dim),
              cfg, sms, smem_per_sm, bandwidth)
    return sp.describe() + assumed
