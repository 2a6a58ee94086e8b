"""The GPU-less NVRTC compile of every kernel for every architecture its manifest declares.

Fails on any compile error, any spill, any stack frame, any wgmma ptxas serialized, an entry ptxas did not report, or
more shared memory than a block of the target may have. Nothing is cached.
Compiles run in 2 processes (verify.compile_matrix.compile_matrix); the whole matrix takes a few minutes on 2 cores.
"""

from __future__ import annotations

import pytest

from flashkit.cli.common import parse_arch
from flashkit.verify.compile_matrix import compile_matrix, plan_compiles, spec_configs
from flashkit.registry import discover_kernels
from flashkit.runtime.build import cache_dir
from flashkit.runtime.cubin import SMEM_PER_BLOCK_OPTIN

JOBS = 2
# Named exceptions, each with its bound and why it stands: (variant, target, words all among the config's) -> bytes.
# fa2_bwd at hd128: up to 32 B, the walk's loop scalars (the visit count, the group's first head, the block range),
# stored once before the walk and reloaded once a visit (2-4 LDL a visit of about 1,300 instructions a warp). Each
# warp holds 128 fp32 registers of dK and dV, and ptxas keeps up to 12 ldmatrix results (48 registers) in flight in
# the 32 x 32 S^T and dP^T products; the 16-key warp strips it replaces had no spill and ran 0.92-0.96x as fast
# (BENCHMARKS.md). On Hopper fa3_bwd serves these calls; fa2_bwd runs them there only with attention_chunk or when
# forced. The bound covers window + softcap + ALiBi in float16 too (24 B before).
# fa2_bwd at hd256: up to 48 B, the same loop scalars (six reloads a visit, no store in the walk) beside the same 128
# registers of dK and dV (FlashAttention-2's 64-key blocks, 32 x 64 of dK and dV a warp) and dQ's 32 x 64 accumulator:
# sm_80's single-buffered build 48 B under NVRTC 13.0, 36 B under 13.5.
# fa2_bwd at hd192 (the hd256 grid, 96 fp32 registers of dK and dV): up to 32 B of the same loop scalars (24 B under
# NVRTC 13.0 and 13.5, sm_80's causal builds).
# fa2_bwd's block-mask builds at hd128 / hd192 / hd256: up to 64 B, the same loop scalars beside the visit lists' walk
# (six reloads a visit of about 1,300 instructions, no store in the walk; 48-56 B under NVRTC 13.0, 40-56 B at hd192);
# hd128's up to 72 B (sm_90 under NVRTC 13.0 since dK and dV go out through shared memory, sm80/bwd_epilogue.cuh; 48 B
# under 13.5; on Hopper fa3_bwd serves block masks, fa2_bwd only when forced).
# fa2_bwd at hd64 with softcap, ALiBi and a window on sm_90, bfloat16: 8 B under NVRTC 13.5, since softcap's slopes
# are taken where S^T is recomputed (sm80/bwd_mainloop.cuh's kStashSlopes; read back from the 16-bit P they were wrong
# beside small caps). On Hopper fa3_bwd serves these calls; fa2_bwd runs them only with attention_chunk or when forced.
KNOWN_SPILLS = {("fa2_bwd", target, words): bound for target in ("sm_80", "sm_86", "sm_90")
                for words, bound in ((("hd128",), 32), (("hd192",), 32), (("hd256",), 48),
                                     (("hd128", "block_sparse"), 72), (("hd192", "block_sparse"), 64),
                                     (("hd256", "block_sparse"), 64))}
KNOWN_SPILLS[("fa2_bwd", "sm_90", ("hd64", "window", "softcap", "alibi"))] = 16


def known_spill(variant: str, target: str, config: str) -> int:
    return max([limit for (v, t, words), limit in KNOWN_SPILLS.items()
                if v == variant and t == target and set(words) <= set(config.split())], default=0)


def _targets() -> list[tuple[str, str]]:
    cat = discover_kernels(refresh=True)
    return [(name, target) for name, spec in sorted(cat.specs.items()) for target in spec.declared_archs()]


TARGETS = _targets()


def test_every_variant_declares_targets():
    names = {name for name, _ in TARGETS}
    assert names == set(discover_kernels().specs) and "standard" in names


def test_plan_matches_the_declared_archs():
    for name, spec in discover_kernels().specs.items():
        planned = set()
        for target in spec.declared_archs():
            jobs, skipped = plan_compiles([name], [parse_arch(target)])
            assert jobs and not skipped, (name, target, skipped)
            planned |= {t for _, _, t in jobs}
        assert planned == set(spec.declared_archs()), name


def test_plan_skips_archs_below_the_minimum():
    jobs, skipped = plan_compiles(["standard"], [(7, 0)])
    assert jobs == []
    assert skipped == ["standard on sm_70: needs compute capability >= 7.5"]


def test_spec_configs_cover_dtypes_head_dims_and_causal():
    spec = discover_kernels().specs["standard"]
    configs = spec_configs(spec, (8, 0))
    assert {c.dtype for c in configs} == set(spec.dtypes)
    assert {c.head_dim for c in configs} == set(spec.head_dims.examples())
    assert {c.causal for c in configs} == {False, True}
    assert len(configs) == len(spec.dtypes) * len(spec.head_dims.examples()) * 2
    only = spec_configs(spec, (8, 0), dtypes=["float16"], head_dims=[64])
    assert [(c.dtype, c.head_dim) for c in only] == [("float16", 64)] * 2


@pytest.mark.parametrize("variant,target", TARGETS, ids=[f"{v}-{t}" for v, t in TARGETS])
def test_compiles_without_spills(variant, target):
    spec = discover_kernels().get(variant)
    jobs, skipped = plan_compiles([variant], [parse_arch(target)])
    assert jobs, f"nothing planned for {variant} on {target}: {skipped}"
    assert {t for _, _, t in jobs} == {target}
    rows = compile_matrix(jobs, jobs=JOBS, to_cache=False)
    assert len(rows) == len(jobs)
    problems = []
    for row in rows:
        where = f"{variant} {target} [{row['config']}]"
        if row["error"]:
            problems.append(f"{where}: compile error\n{row['error']}")
            continue
        allowed = known_spill(variant, target, row["config"])
        if row["spill_bytes"] > allowed:
            problems.append(f"{where}: {row['spill_bytes']} bytes of spills")
        if row["stack_bytes"] > allowed:
            problems.append(f"{where}: {row['stack_bytes']} bytes stack frame")
        if row["serialized_wgmma"]:
            problems.append(f"{where}: ptxas serialized the wgmma of {row['serialized_wgmma']}")
        reported = {e["entry"] for e in row["entries"]}
        missing = set(spec.entries) - reported
        if missing:
            problems.append(f"{where}: ptxas reported no entry {sorted(missing)} (reported {sorted(reported)})")
        for e in row["entries"]:
            if e["registers"] > 255:
                problems.append(f"{where}: {e['entry']} uses {e['registers']} registers")
            if e["static_smem"] > 48 * 1024:
                problems.append(f"{where}: {e['entry']} has {e['static_smem']} bytes of static shared memory")
        limit = SMEM_PER_BLOCK_OPTIN[parse_arch(target)]
        if row["block_smem_bytes"] > limit:
            problems.append(f"{where}: {row['block_smem_bytes']} bytes of shared memory a block (static and dynamic), "
                            f"over the {limit} a block of {target} may have")
    assert not problems, f"{len(problems)} of {len(rows)} compiles failed:\n" + "\n".join(problems)
    assert not any(cache_dir().glob("*.cubin")), "the CI compile must cache nothing"
