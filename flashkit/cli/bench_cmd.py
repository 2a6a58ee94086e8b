"""flashkit bench: TFLOP/s of variants on the FlashAttention papers' convention, beside PyTorch."""

from __future__ import annotations

import click

from .. import bench
from ..errors import InputError
from ..runtime.device import require_device
from .common import one_line_errors


def _floats(text: str | None) -> list[float] | None:
    return [float(x) for x in text.split(",") if x.strip()] if text else None


def _ints(values: tuple[str, ...]) -> list[int]:
    return [int(x) for v in values for x in v.split(",") if x.strip()]


@click.command("bench")
@click.option("--variant", "variants", multiple=True, help="Variant(s) to time (default: what flashkit selects).")
@click.option("--head-dim", "head_dims", multiple=True, help="Head dims (repeat or comma list; default 64,128,256).")
@click.option("--seqlen", "seqlens", multiple=True, help="Seqlens (repeat or comma list; default 512..16384).")
@click.option("--causal/--no-causal", default=None, help="Only causal / only non-causal (default: both).")
@click.option("--density", default=None, help="Block-sparse mode: comma list of densities, e.g. 1.0,0.5,0.25,0.1.")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--compare", type=click.Choice(["torch", "none"]), default="none", show_default=True,
              help="Time PyTorch's SDPA backends (and flex_attention) on the same inputs in the same run.")
@click.option("--interleave", is_flag=True, help="Time each shape's kernels (and PyTorch's) interleaved call by call, "
                                                  "so that their ratios hold under one clock.")
@click.option("--iters", type=int, default=30, show_default=True)
@click.option("--warmup", type=int, default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write JSON to this file.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG of TFLOP/s vs seqlen.")
@click.option("--functors", is_flag=True, help="Drop-in functors against the built-ins and flex_attention "
                                               "(flashkit.bench.functors; first seqlen and head dim given).")
@click.option("--block-mods", is_flag=True, help="Block masks with softcap / ALiBi / a window against the block mask "
                                                 "alone, the dense kernel and flex_attention (flashkit.bench.block_mods;"
                                                 " first seqlen, --head-dim, --density).")
@click.option("--backward", is_flag=True, help="attention_backward against PyTorch SDPA's flash and cuDNN backward "
                                               "(flashkit.bench.backward; --seqlen, --head-dim, --variant).")
@click.option("--deterministic", is_flag=True, help="With --backward: the deterministic backward.")
@click.option("--head-dim-v", type=int, default=None,
              help="With --backward: v's head dim, below each --head-dim (DeepSeek's MLA: 128 under 192).")
@one_line_errors
def command(variants, head_dims, seqlens, causal, density, dtype, compare, interleave, iters, warmup, as_json,
            json_out, plot, functors, block_mods, backward, deterministic, head_dim_v) -> None:
    """Time kernels with CUDA events (median, L2-rotated inputs) and report TFLOP/s and ratios."""
    if head_dim_v is not None and not backward:
        raise InputError(f"--head-dim-v: times the backward only (add --backward), got {head_dim_v}")
    if interleave and (backward or functors or block_mods):
        raise InputError("--interleave: an option of the sweep (--functors and --block-mods always interleave, "
                         "--backward times its kernels one after the other)")
    require_device()
    if backward:
        from ..bench import backward as backward_bench
        argv = (["--seqlens", *map(str, _ints(seqlens))] if seqlens else []) + (
            ["--head-dims", *map(str, _ints(head_dims))] if head_dims else [])
        argv += (["--deterministic"] if deterministic else []) + (["--json", json_out] if json_out else [])
        argv += ["--variant", *variants] if variants else []
        argv += ["--head-dim-v", str(head_dim_v)] if head_dim_v is not None else []
        backward_bench.main(argv)
        return
    if functors:
        from ..bench import functors as functor_bench
        argv = ["--iters", str(iters), "--warmup", str(warmup)] + (["--out", json_out] if json_out else [])
        argv += (["--seqlen", str(_ints(seqlens)[0])] if seqlens else []) + (
            ["--head-dim", str(_ints(head_dims)[0])] if head_dims else []) + ([] if compare == "torch" else ["--no-flex"])
        functor_bench.main(argv)
        return
    if block_mods:
        from ..bench import block_mods as block_mods_bench
        argv = ["--iters", str(iters), "--warmup", str(warmup)] + (["--out", json_out] if json_out else [])
        argv += (["--seqlen", str(_ints(seqlens)[0])] if seqlens else []) + (
            ["--head-dims", ",".join(map(str, _ints(head_dims)))] if head_dims else []) + (
            ["--densities", ",".join(map(str, _floats(density)))] if density else []) + (
            [] if compare == "torch" else ["--no-flex"])
        block_mods_bench.main(argv)
        return
    config = bench.BenchConfig(
        seqlens=_ints(seqlens) or bench.SEQLENS, head_dims=_ints(head_dims) or bench.HEAD_DIMS,
        causal=(False, True) if causal is None else (causal,), dtype=dtype,
        variants=tuple(variants) or (None,), densities=_floats(density), iters=iters, warmup=warmup,
        interleave=interleave,
        torch_backends=(bench.TORCH_BACKENDS if density else bench.SDPA_BACKENDS) if compare == "torch" else ())
    say = (lambda msg: click.echo(msg, err=True)) if not as_json else (lambda msg: None)
    result = bench.run_benchmark(config, progress=say)
    text = bench.render_json(result.rows, result.meta)
    if json_out:
        with open(json_out, "w") as f:
            f.write(text)
    if as_json:
        click.echo(text)
    else:
        click.echo(bench.render_table(result.rows))
        click.echo("")
        click.echo(bench.render_memory_table(result.rows))
    if plot:
        bench.write_plot(result.rows, plot)
        click.echo(f"plot written to {plot}", err=not as_json)
