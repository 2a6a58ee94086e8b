"""Compile the matrix of specializations (variant x arch x dtype x head dim x causal), in parallel."""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from ..errors import CompileError
from ..registry import discover_kernels
from ..registry.manifest import KernelSpec
from ..runtime.build import BuildConfig, compile_variant, launch_table, make_config, smem_bytes, store_cubin

MODS = ("window", "softcap", "alibi")   # built-in modifications (features/mods.py), compiled together
# (head_dim, head_dim_v) compiled for variants declaring head_dim_v: MLA's 192 / 128 and both head dims padded below
# their classes, with each modification set; and V / O tiles of fewer 128 B panels than Q / K's (the Hopper core's
# V tiles, P V's N and O's TMA store), without modifications (they touch S only).
HEAD_DIM_V_PAIRS = ((192, 128), (200, 136))
HEAD_DIM_V_GEOMETRY_PAIRS = ((96, 64), (128, 64), (256, 192), (256, 64))


def spec_configs(spec: KernelSpec, cc: tuple[int, int], dtypes=None, head_dims=None) -> list[BuildConfig]:
    """Every specialization a variant can be asked for on this arch (with its declared modifications all on too,
    each modification alone where the manifest gives it a table of its own (own_table; for the first dtype: the dtypes
    differ in no register or shared-memory figure), and varlen where the variant takes packed sequences; a backward taking block masks with one too, alone and with
    the modifications; with each of
    its tile tables by call length): of its
    example head dims, or of the named head dims it takes, that the arch takes (head_dims' max_by_arch).

    A head dim below its class (a padded compile: the class's code plus column predicates) is compiled for the
    variant's first dtype only, unless dtypes are named: the dtypes differ in no register or shared-memory figure;
    and without varlen (the packed-sequence offsets and the column predicates touch different code). A variant
    declaring head_dim_v also compiles HEAD_DIM_V_PAIRS and HEAD_DIM_V_GEOMETRY_PAIRS (whose head_dim was named, if
    any), in the same way.
    """
    causal_opts = spec.causal_options()
    sparse = spec.requires.get("block_sparse", False)
    listed = not sparse and spec.supports("block_sparse") and spec.supports("backward")
    mods = tuple(m for m in MODS if spec.supports(m))
    mod_sets = [()] + ([mods] if mods else [])
    if spec.supports("varlen"):   # packed sequences (their combinations with modifications compile on demand)
        mod_sets.append(("varlen",))
    out = []
    for dt in spec.dtypes:
        if dtypes and dt not in dtypes:
            continue
        out_dtypes = ["bfloat16", "float16"] if dt == "float8_e4m3" else [None]
        for hd in [d for d in head_dims or spec.head_dims.examples() if d in spec.head_dims]:
            if not spec.head_dims.on_arch(hd, cc) or (spec.head_dims.class_of(hd) != hd and not dtypes and
                                                      dt != spec.dtypes[0]):
                continue
            for c in causal_opts:
                for od in out_dtypes:
                    out += [make_config(spec, dt, hd, c, cc, sparse, od, m, seqlen_q=sq) for m in mod_sets
                            for sq in lengths(spec, hd) if "varlen" not in m or spec.head_dims.class_of(hd) == hd]
                    if dt == spec.dtypes[0]:   # each modification the manifest gives a table of its own
                        out += [make_config(spec, dt, hd, c, cc, sparse, od, (m,), seqlen_q=sq)
                                for sq in lengths(spec, hd) for m in mods
                                if own_table(spec, cc, hd, m, mods, c, sparse, sq)]
                    if listed:   # a backward over a block mask's lists, alone and with the modifications
                        out += [make_config(spec, dt, hd, c, cc, True, od, m, seqlen_q=sq) for sq in lengths(spec, hd)
                                for m in mod_sets if "varlen" not in m]
    if spec.supports("head_dim_v"):
        out += head_dim_v_configs(spec, cc, causal_opts, mod_sets, dtypes, head_dims)
    return list(dict.fromkeys(out))   # head dims of one class and padding share a specialization


MAX_FIRST_MODS = ("softcap", "alibi")   # what max_first acts on, each alone (score_mod.cuh's MonotoneMod, LinearBias)


def own_table(spec: KernelSpec, cc: tuple[int, int], hd: int, mod: str, mods: tuple[str, ...], causal: bool,
              sparse: bool, seqlen_q: int | None) -> bool:
    """Whether a modification alone builds code the set's build does not: a launch table unlike the set's (hd64's
    non-causal softcap on three consumers), or a max_first that the set's build carries but cannot exercise (it acts
    on softcap or ALiBi alone, not composed)."""
    alone = launch_table(spec, cc, hd, (mod,), causal, sparse, seqlen_q)
    return alone != launch_table(spec, cc, hd, mods, causal, sparse, seqlen_q) or \
        (mod in MAX_FIRST_MODS and alone.get("max_first", 0) == 1)


def head_dim_v_configs(spec: KernelSpec, cc: tuple[int, int], causal_opts, mod_sets, dtypes=None,
                       head_dims=None) -> list[BuildConfig]:
    """HEAD_DIM_V_PAIRS' specializations: each causal option and modification set (varlen at class head dims);
    HEAD_DIM_V_GEOMETRY_PAIRS': each causal option, unmodified."""
    out = []
    pairs = [(pair, mod_sets) for pair in HEAD_DIM_V_PAIRS] + [(pair, [()]) for pair in HEAD_DIM_V_GEOMETRY_PAIRS]
    for dt in [d for d in spec.dtypes if d in dtypes] if dtypes else spec.dtypes[:1]:
        for (hd, hdv), sets in pairs:
            if (head_dims and hd not in head_dims) or hd not in spec.head_dims or hdv not in spec.head_dims or \
                    not spec.head_dims.on_arch(max(hd, hdv), cc):
                continue
            exact = spec.head_dims.class_of(hd) == hd
            out += [make_config(spec, dt, hd, c, cc, False, None, m, head_dim_v=hdv, seqlen_q=sq)
                    for c in causal_opts for m in sets for sq in lengths(spec, hd) if "varlen" not in m or exact]
    return out


def plan_compiles(variants, ccs, dtypes=None, head_dims=None):
    """(spec, config, target) jobs for the variants on the archs, and lines for what is skipped."""
    cat = discover_kernels()
    specs = [cat.get(v) for v in variants] if variants else sorted(cat.specs.values(), key=lambda s: s.name)
    jobs, skipped = [], []
    for cc in ccs:
        for spec in specs:
            if not spec.runs_on(cc):
                skipped.append(f"{spec.name} on sm_{cc[0]}{cc[1]}: needs compute capability "
                               f"{spec.arch_requirement()}")
                continue
            jobs += [(spec, cfg, spec.target(cc)) for cfg in spec_configs(spec, cc, dtypes, head_dims)]
    return jobs, skipped


def functor_jobs(mods=None, variants=None, ccs=((8, 0), (9, 0)), dtypes=("bfloat16",), head_dims=(64, 128),
                 causal_opts=(False, True)) -> list:
    """(spec, config, target) jobs building each drop-in functor into each variant that builds its functions in (a
    backward: mask_mod functors, and score_mod functors with their score_mod_grad); a block-sparse forward's under
    its block mask, a score_mod into a backward taking block masks with one too."""
    from ..features.functors import build_key
    cat = discover_kernels()
    mod_specs = [cat.get_mod(m) for m in mods] if mods else sorted(cat.mods.values(), key=lambda m: m.name)
    specs = [cat.get(v) for v in variants] if variants else sorted(cat.specs.values(), key=lambda s: s.name)
    jobs = []
    for cc in ccs:
        for spec in specs:
            if not (spec.runs_on(cc) and (spec.supports("score_mod") or spec.supports("mask_mod"))):
                continue
            for mod in [m for m in mod_specs if m.builds_into(spec)]:
                sparse = {spec.requires.get("block_sparse", False)} | (
                    {True} if spec.supports("block_sparse") and spec.supports("backward") and not mod.mask else set())
                for dt, hd, bs in itertools.product(dtypes, head_dims, sorted(sparse)):
                    for c in spec.causal_options(tuple(causal_opts)):
                        jobs += [(spec, make_config(spec, dt, hd, c, cc, bs, None, mod.build_features, build_key(mod),
                                                    seqlen_q=sq), spec.target(cc)) for sq in lengths(spec, hd)]
    return list({(spec.name, config, target): (spec, config, target) for spec, config, target in jobs}.values())


def lengths(spec: KernelSpec, head_dim: int) -> tuple[int | None, ...]:
    """The seqlen_q of one call per tile table of the head dim: the longest calls' (None) and each length bound's
    (KernelSpec.length_bounds; equal tables are one specialization)."""
    return (None,) + spec.length_bounds(head_dim)


def _compile_one(job, to_cache: bool) -> dict:
    spec, config, target = job
    row = {"variant": spec.name, "target": target, "config": config.describe(), "error": None,
           "registers": 0, "smem_bytes": 0, "dynamic_smem_bytes": 0, "block_smem_bytes": 0, "stack_bytes": 0,
           "spill_bytes": 0, "serialized_wgmma": [], "seconds": 0.0}
    try:
        compiled = compile_variant(spec, config, target)
        if to_cache:
            store_cubin(spec, config, target, compiled)
    except CompileError as e:
        row["error"] = str(e)
        return row
    reports = compiled.reports()
    dynamic = dict(zip(spec.entries, smem_bytes(spec, compiled.cubin)[1]))   # what each entry launches with
    row.update(registers=max((r.registers for r in reports), default=0),
               smem_bytes=max((r.static_smem for r in reports), default=0),
               dynamic_smem_bytes=max(dynamic.values(), default=0),
               # a block's whole shared memory: the largest entry's static plus dynamic
               block_smem_bytes=max((r.static_smem + dynamic.get(r.entry, 0) for r in reports), default=0),
               stack_bytes=max((r.stack_bytes for r in reports), default=0),
               spill_bytes=sum(r.spill_stores + r.spill_loads for r in reports),
               serialized_wgmma=[r.entry for r in reports if r.serialized_wgmma],
               seconds=compiled.seconds, entries=[r.__dict__ for r in reports])
    return row


def compile_matrix(work: list, jobs: int = 1, to_cache: bool = False,
                   progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Compile every job (in `jobs` processes); each row carries ptxas's report or the error."""
    rows = []
    if jobs <= 1:
        results = (_compile_one(w, to_cache) for w in work)
        for row in results:
            rows.append(row)
            if progress:
                progress(row)
        return rows
    with ProcessPoolExecutor(jobs) as pool:
        for row in pool.map(_compile_one, work, [to_cache] * len(work)):
            rows.append(row)
            if progress:
                progress(row)
    return rows
