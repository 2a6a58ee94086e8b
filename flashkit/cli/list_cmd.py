"""flashkit list: every variant, its capabilities, and whether this device can run it."""

from __future__ import annotations

import click

from ..registry import discover_kernels
from .common import device_cc_or_none, emit_json, one_line_errors


def describe_spec(spec, cc) -> dict:
    runs = None
    if cc is not None:
        runs = "yes" if spec.runs_on(cc) else f"no: needs compute capability {spec.arch_requirement()}"
    return {"name": spec.name, "priority": spec.priority, "summary": spec.summary,
            "arch_min": f"{spec.arch_min[0]}.{spec.arch_min[1]}", "dtypes": list(spec.dtypes),
            "head_dims": spec.head_dims.describe(),
            "features": [f for f, on in spec.features.items() if on],
            "requires": {k: v for k, v in spec.requires.items()}, "path": str(spec.path), "runs_here": runs}


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@one_line_errors
def command(as_json: bool) -> None:
    """List every kernel variant with its capabilities."""
    cat = discover_kernels(refresh=True)
    cc = device_cc_or_none()
    rows = [describe_spec(s, cc) for s in sorted(cat.specs.values(), key=lambda s: (-s.priority, s.name))]
    mods = [{"name": m.name, "summary": m.summary, "functions": list(m.functions),
             "args": {a.name: a.kind for a in m.args}, "reference": m.reference is not None, "path": str(m.path)}
            for m in sorted(cat.mods.values(), key=lambda m: m.name)]
    if as_json:
        emit_json({"variants": rows, "mods": mods, "problems": cat.problems})
        return
    for r in rows:
        click.echo(f"{r['name']:<14} prio {r['priority']:>3}  sm>={r['arch_min']}  {','.join(r['dtypes'])}  "
                   f"hd {r['head_dims']}  [{', '.join(r['features'])}]"
                   + (f"  runs here: {r['runs_here']}" if r["runs_here"] else ""))
        click.echo(f"{'':<14} {r['summary']}")
    if mods:
        click.echo("\ndrop-in functors (attention(..., mod=NAME, mod_args={...})):")
    for m in mods:
        args = ", ".join(f"{n}:{k}" for n, k in m["args"].items())
        ref = "" if m["reference"] else "  (no Python reference: verify cannot check it)"
        click.echo(f"{m['name']:<14} {'+'.join(m['functions'])}" + (f" ({args})" if args else "") + ref)
        click.echo(f"{'':<14} {m['summary']}")
    for p in cat.problems:
        click.echo(f"skipped: {p}", err=True)
