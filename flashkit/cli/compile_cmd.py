"""flashkit compile: ahead-of-time compilation, with each kernel's registers, shared memory and spills."""

from __future__ import annotations

import click

from ..runtime.cubin import SMEM_PER_BLOCK_OPTIN
from ..verify.compile_matrix import compile_matrix, plan_compiles
from .common import device_cc_or_none, emit_json, one_line_errors, parse_arch


@click.command("compile")
@click.option("--variant", "variants", multiple=True, help="Variant(s) to compile (default: all).")
@click.option("--arch", "archs", multiple=True, help="Target(s) such as sm_80, sm_90; works with no GPU.")
@click.option("--dtype", "dtypes", multiple=True, help="Restrict to these dtypes.")
@click.option("--head-dim", "head_dims", multiple=True, type=int, help="Restrict to these head dims.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="Parallel compiles.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def command(variants, archs, dtypes, head_dims, jobs, as_json) -> None:
    """Compile kernels ahead of time (into the cache when for this GPU) and report their resources."""
    ccs = [parse_arch(a) for a in archs] or [device_cc_or_none()]
    if ccs == [None]:
        raise click.ClickException("no CUDA device found: pass --arch (e.g. --arch sm_80 --arch sm_90) "
                                   "to compile without a GPU")
    jobs_list, skipped = plan_compiles(list(variants) or None, ccs, list(dtypes) or None, list(head_dims) or None)
    rows = compile_matrix(jobs_list, jobs=jobs, to_cache=not archs,
                          progress=None if as_json else lambda r: click.echo(format_row(r)))
    if as_json:
        emit_json({"compiled": rows, "skipped": skipped})
    for s in skipped if not as_json else ():
        click.echo(f"skipped: {s}")
    failed = [r for r in rows if r["error"]]
    if not as_json:
        spills = sum(1 for r in rows if r["spill_bytes"])
        serialized = sum(1 for r in rows if r.get("serialized_wgmma"))
        click.echo(f"{len(rows)} compiled, {len(failed)} failed, {spills} with spills, "
                   f"{serialized} with serialized wgmma")
    if failed:
        raise SystemExit(1)


def format_row(r: dict) -> str:
    """One build: registers, shared memory a block (static + dynamic, the largest entry's), stack, spills."""
    if r["error"]:
        return f"FAIL {r['variant']:<13} {r['target']:<7} {r['config']}\n{r['error']}"
    smem = r.get("block_smem_bytes", r["smem_bytes"])
    limit = SMEM_PER_BLOCK_OPTIN.get(parse_arch(r["target"]))
    return (f"ok   {r['variant']:<13} {r['target']:<7} {r['config']:<60} regs {r['registers']:>3}  "
            f"smem {smem:>6}  stack {r['stack_bytes']:>3}  spill {r['spill_bytes']:>3}  "
            f"{r['seconds']:.1f}s" + ("  SERIALIZED wgmma" if r.get("serialized_wgmma") else "")
            + (f"  OVER {r['target']}'s {limit} B of shared memory" if limit and smem > limit else ""))
