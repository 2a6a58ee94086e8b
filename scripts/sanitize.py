"""One small call of every variant this GPU runs, on odd shapes: the workload compute-sanitizer checks.

Usage: compute-sanitizer --tool memcheck|racecheck|synccheck --error-exitcode 1 python3 scripts/sanitize.py [VARIANT ...]
(no variant named: every variant this GPU runs)
"""

from __future__ import annotations

import itertools

import cupy as cp

from flashkit import BlockMask, UnsupportedError, attention, attention_backward
from flashkit.api import variants
from flashkit.call.dtypes import BY_NAME
from flashkit.runtime.device import device_info
from flashkit.verify.arch_tiles import arch_tiles, tiles_of

SHAPE = (2, 77, 4, 2)   # batch, seqlen (odd, crosses no tile evenly), heads, kv heads (GQA 2:1)
DECODE_ROWS = 3         # query rows for the variants that only serve decode-sized calls
PREFIX = 20             # prefix_lm's bidirectional prefix: tiles of every state at SHAPE's lengths
WINDOW = (24, 8)        # window_size (left, right): visits cut on both sides at SHAPE's lengths
SOFTCAP = 2.0           # softcap: small, so that its slopes (1 - tanh^2) are far from 1
MLA = (192, 128)        # (head_dim, head_dim_v) of a backward with v narrower than q and k (V and dO zero-filled)
PASS_ROWS = 2113        # causal rows past 2048: the 192-row tiles (fa3 hd64, fa3_fp8 hd64 / hd128) and hd256's
                        # 64-key ones (fa3), whose top consumers pass key tiles by


def inputs(head_dim: int, dtype: str, seed: int, rows: int = SHAPE[1], head_dim_v: int | None = None):
    rng = cp.random.default_rng(seed)
    b, s, h, hk = SHAPE
    storage = BY_NAME[dtype].storage
    return [rng.standard_normal(shape, dtype=cp.float32).astype(storage)
            for shape in ((b, rows, h, head_dim), (b, s + 16, hk, head_dim), (b, s + 16, hk, head_dim_v or head_dim))]


def forward(spec, head_dim: int, causal: bool) -> None:
    """One forward call of the variant; a variant that only serves short queries gets DECODE_ROWS."""
    mask = BlockMask.random(SHAPE[0], SHAPE[2], SHAPE[1], SHAPE[1] + 16, 0.5, seed=4) \
        if spec.requires.get("block_sparse") else None
    if mask is not None and spec.supports("window"):   # the block mask over a window (both edges), softcap, ALiBi,
        q, k, v = inputs(head_dim, spec.dtypes[0], 3)   # and a score_mod functor under it
        slopes = cp.linspace(0.1, 0.5, SHAPE[2], dtype=cp.float32)
        attention(q, k, v, causal=causal, variant=spec.name, block_mask=mask, window_size=WINDOW, softcap=SOFTCAP,
                  alibi_slopes=slopes)
        attention(q, k, v, causal=causal, variant=spec.name, block_mask=mask, mod="relative_bias",
                  mod_args={"slopes": slopes})
    if mask is None and spec.supports("softcap") and spec.supports("score_mod"):   # the modified tables (hd64's
        for d in sorted({64, head_dim}):                                             # deferred, issuing freely)
            q, k, v = inputs(d, spec.dtypes[0], 5)
            slopes = cp.linspace(0.1, 0.5, SHAPE[2], dtype=cp.float32)
            attention(q, k, v, causal=causal, variant=spec.name, softcap=SOFTCAP, alibi_slopes=slopes)
            attention(q, k, v, causal=causal, variant=spec.name, mod="relative_bias", mod_args={"slopes": slopes})
    for rows in (SHAPE[1], DECODE_ROWS):
        q, k, v = inputs(head_dim, spec.dtypes[0], 2, rows)
        try:
            attention(q, k, v, causal=causal, variant=spec.name, return_lse=spec.supports("lse"),
                      block_mask=mask if rows == SHAPE[1] else None)
            return
        except UnsupportedError:
            if rows == DECODE_ROWS:
                raise


def passes_unseen(spec) -> bool:
    """Whether some build of the variant passes by the causal key tiles a consumer's rows never see."""
    return any(launch.get("pass_unseen") for launch in (spec.launch, *spec.overrides.values()))


def serial_head_dims(spec, cc) -> set[int]:
    """The head dims whose forward tables wait for each P V before the next S (serial_pv): their wide tiles and their
    own order of waits."""
    return {d for d in spec.head_dims.examples() for causal in spec.causal_options()
            if spec.launch_config(cc, d, (), causal).get("serial_pv")}


def main(names: list[str]) -> None:
    cc = device_info().cc
    for spec in variants():
        if not spec.runs_on(cc) or (names and spec.name not in names):
            continue
        # backward kernels at every head dim they are compiled for and a padded one below each (fa3_bwd's hd256
        # splits its consumers another way); forward ones at 128 where they take it
        head_dims = spec.head_dims.examples() if spec.supports("backward") else \
            sorted({128 if 128 in spec.head_dims else spec.head_dims.examples()[0]} | serial_head_dims(spec, cc))
        for head_dim, causal in itertools.product(head_dims, spec.causal_options()):
            if spec.requires.get("fp8"):
                q, k, v = inputs(head_dim, "bfloat16", 0)
                attention(q, k, v, causal=causal, fp8=True, variant=spec.name)
            elif spec.supports("backward"):
                q, k, v = inputs(head_dim, spec.dtypes[0], 1)
                out, lse = attention(q, k, v, causal=causal, return_lse=True)
                attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal, variant=spec.name)
                if spec.supports("window"):   # the dQ writers beside a window, in both orders; ALiBi's own blocks;
                    slopes = cp.linspace(0.1, 1.0, SHAPE[2], dtype=cp.float32)   # softcap's held slopes
                    for kw in (dict(window_size=WINDOW), dict(alibi_slopes=slopes), dict(softcap=SOFTCAP)):
                        out, lse = attention(q, k, v, causal=causal, return_lse=True, **kw)
                        for deterministic in (False, True):
                            attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal,
                                               deterministic=deterministic, variant=spec.name, **kw)
                if spec.supports("block_sparse"):   # a block mask's visit lists (bwd_lists.cuh), deterministic too;
                    mask = BlockMask.random(SHAPE[0], SHAPE[2], SHAPE[1], SHAPE[1] + 16, 0.5, seed=7)   # and with
                    slopes = cp.linspace(0.1, 1.0, SHAPE[2], dtype=cp.float32)   # a window, softcap and ALiBi
                    for kw in (dict(), dict(window_size=WINDOW, softcap=SOFTCAP, alibi_slopes=slopes)):
                        out, lse = attention(q, k, v, causal=causal, return_lse=True, block_mask=mask, **kw)
                        for deterministic in (False, True):
                            attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal, block_mask=mask,
                                               deterministic=deterministic, variant=spec.name, **kw)
                mods = []
                if spec.supports("mask_mod"):   # partial visits: the producer warpgroup's keep bits (bwd_keep.cuh)
                    mods.append(dict(mod="prefix_lm", mod_args={"prefix": PREFIX}))
                if spec.supports("score_mod"):   # a functor's queries clamped in the ragged last block only
                    mods.append(dict(mod="relative_bias",
                                     mod_args={"slopes": cp.linspace(0.1, 1.0, SHAPE[2], dtype=cp.float32)}))
                for mod in mods:
                    kw = dict(causal=causal, **mod)
                    out, lse = attention(q, k, v, return_lse=True, **kw)
                    attention_backward(cp.ones_like(out), q, k, v, out, lse, variant=spec.name, **kw)
            else:
                forward(spec, head_dim, causal)
            if causal and passes_unseen(spec):   # the stages a consumer hands back unread (hopper/ws_mainloop.cuh)
                rng = cp.random.default_rng(3)
                for d in (64, 128, 256):
                    q, k, v = (rng.standard_normal((1, rows, heads, d), dtype=cp.float32).astype(
                        BY_NAME["bfloat16"].storage) for rows, heads in ((PASS_ROWS, 2), (PASS_ROWS + 16, 1),
                                                                        (PASS_ROWS + 16, 1)))
                    attention(q, k, v, causal=True, variant=spec.name, fp8=bool(spec.requires.get("fp8")))
            cp.cuda.runtime.deviceSynchronize()
            print(f"{spec.name} hd{head_dim} causal={causal}: ran", flush=True)
        if spec.supports("backward") and spec.supports("head_dim_v"):   # v narrower: its columns zero-filled
            q, k, v = inputs(MLA[0], spec.dtypes[0], 6, head_dim_v=MLA[1])
            for causal in spec.causal_options():
                out, lse = attention(q, k, v, causal=causal, return_lse=True)
                attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal, variant=spec.name)
                cp.cuda.runtime.deviceSynchronize()
                print(f"{spec.name} hd{MLA[0]} / v{MLA[1]} causal={causal}: ran", flush=True)
        if spec.supports("backward"):   # the tiles of the GPUs with less shared memory (single-buffered Q and dO)
            for (arch, head_dim), causal in itertools.product(arch_tiles(spec, cc), spec.causal_options()):
                with tiles_of(spec.name, arch):
                    q, k, v = inputs(head_dim, spec.dtypes[0], 5)
                    out, lse = attention(q, k, v, causal=causal, return_lse=True)
                    attention_backward(cp.ones_like(out), q, k, v, out, lse, causal=causal, variant=spec.name)
                    cp.cuda.runtime.deviceSynchronize()
                print(f"{spec.name} hd{head_dim} causal={causal} with sm_{arch[0]}{arch[1]}'s tiles: ran", flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
