"""flashkit verify: run variants over the shape matrix against the float64 reference."""

from __future__ import annotations

import click

from .. import verify as harness
from ..runtime.device import require_device
from .common import emit_json, one_line_errors

FUZZ_APIS = ("attention", "kvcache")   # what --fuzz calls: verify/fuzz.py's cases, verify/fuzz_kvcache.py's


def format_result(r: harness.CheckResult) -> str:
    lse = f"  lse {r.lse_error:.2e} <= {r.lse_bound:.2e}" if r.lse_error is not None else ""
    mark = "pass" if r.passed else "FAIL"
    return f"{mark}  {r.variant:<13} {r.label:<44} err {r.max_error:.2e} <= {r.bound:.2e}{lse}  {r.note}".rstrip()


@click.command("verify")
@click.option("--variant", "variants", multiple=True, help="Variant(s) to verify.")
@click.option("--all", "all_variants", is_flag=True, help="Every variant this device supports.")
@click.option("--dtype", "dtypes", multiple=True, help="Restrict to these dtypes.")
@click.option("--head-dim", "head_dims", multiple=True, type=int, help="Restrict to these head dims.")
@click.option("--causal/--no-causal", default=None, help="Only causal / only non-causal (default: both).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quick", is_flag=True, help="A smaller shape matrix.")
@click.option("--mod", "mod", default=None, help="A drop-in functor: check it fused into each variant that builds "
                                                "functors (or the --variant ones) against its Python reference.")
@click.option("--fuzz", "fuzz", type=click.IntRange(min=1), default=None,
              help="N random calls through the public API (any head dim, layout, mask and modification, "
                   "backward, varlen; the kernel the API picks), drawn from --seed.")
@click.option("--fuzz-api", "fuzz_api", type=click.Choice(FUZZ_APIS), default=FUZZ_APIS[0], show_default=True,
              help="What --fuzz calls: attention (and varlen, backward), or attention_with_kvcache (paged caches, "
                   "appends, speculative rows).")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def command(variants, all_variants, dtypes, head_dims, causal, seed, quick, mod, fuzz, fuzz_api, as_json) -> None:
    """Check variants against the float64 reference (DESIGN.md's rule); exits 1 on any failure."""
    if not variants and not all_variants and not mod and not fuzz:
        raise click.UsageError("name a --variant, a --mod, or pass --all or --fuzz N")
    if fuzz and (variants or all_variants or mod or dtypes or head_dims or causal is not None or quick):
        raise click.UsageError("--fuzz draws its own calls: it takes only --seed, --fuzz-api and --json")
    if fuzz_api != "attention" and not fuzz:
        raise click.UsageError("--fuzz-api goes with --fuzz N")
    causal_opts = None if causal is None else (causal,)
    skipped = {}
    if fuzz:
        if fuzz_api == "kvcache":
            from ..verify.fuzz_kvcache import fuzz_kvcache_checks as fuzz_checks
        else:
            from ..verify.fuzz import fuzz_checks
        require_device()
        checks = fuzz_checks(fuzz, seed)
    elif mod:
        from ..registry import discover_kernels
        from ..verify.functors import functor_checks, load_reference
        mod_spec = discover_kernels().get_mod(mod)
        load_reference(mod_spec)   # says so, before any device work, when the functor cannot be checked
        require_device()
        specs, skipped = harness.runnable_variants(variants or None)
        checks = functor_checks(mod_spec, specs, dtypes or None, head_dims or None, causal_opts, quick)
    else:
        require_device()
        specs, skipped = harness.runnable_variants(None if all_variants else variants)
        checks = [c for s in specs for c in harness.checks_for(s, dtypes or None, head_dims or None, causal_opts,
                                                                quick)]
    progress = None if as_json else (lambda r: click.echo(format_result(r)))
    results = harness.run_checks(checks, seed, progress)
    failed = [r for r in results if not r.passed]
    if as_json:
        emit_json({"results": [r.as_dict() for r in results], "skipped": skipped, "failed": len(failed)})
    else:
        for name, why in skipped.items():
            click.echo(f"skipped {name}: {why}")
        per = {}
        for r in results:
            per.setdefault(r.variant, [0, 0])[0 if r.passed else 1] += 1
        for name, (ok, bad) in per.items():
            click.echo(f"{name}: {ok} passed, {bad} failed")
        click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed or not results:
        raise SystemExit(1)
