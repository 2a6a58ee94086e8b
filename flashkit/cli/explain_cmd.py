"""flashkit explain: which kernel a request would select, and why each other was rejected."""

from __future__ import annotations

import click

from .. import api
from ..errors import UnsupportedError
from .common import device_cc_or_none, emit_json, one_line_errors, parse_arch


@click.command("explain")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--head-dim-v", type=int, default=None, help="v's head dim (MLA: 128 under --head-dim 192); "
              "defaults to --head-dim.")
@click.option("--seqlen-q", type=int, default=1024, show_default=True)
@click.option("--seqlen-k", type=int, default=None, help="Defaults to --seqlen-q.")
@click.option("--heads", type=int, default=16, show_default=True)
@click.option("--kv-heads", type=int, default=None, help="Defaults to --heads.")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--causal", is_flag=True)
@click.option("--block-sparse", is_flag=True)
@click.option("--fp8", is_flag=True)
@click.option("--lse", is_flag=True, help="The call asks for the log-sum-exp.")
@click.option("--window", is_flag=True, help="The call passes window_size or attention_chunk.")
@click.option("--softcap", is_flag=True, help="The call passes softcap > 0.")
@click.option("--alibi", is_flag=True, help="The call passes alibi_slopes.")
@click.option("--varlen", is_flag=True, help="A packed variable-length batch (attention_varlen); seqlens are the longest.")
@click.option("--backward", is_flag=True, help="The call's backward (attention_backward) rather than its forward.")
@click.option("--arch", default=None, help="Compute capability to assume (sm_90, 9.0); default: this GPU's.")
@click.option("--variant", default=None, help="Explain forcing this variant.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def command(dtype, head_dim, head_dim_v, seqlen_q, seqlen_k, heads, kv_heads, batch, causal, block_sparse, fp8, lse, window,
            softcap, alibi, varlen, backward, arch, variant, as_json) -> None:
    """Explain kernel selection for a request, without running anything."""
    cc = parse_arch(arch) if arch else device_cc_or_none()
    kwargs = dict(dtype=dtype, head_dim=head_dim, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads=heads,
                  kv_heads=kv_heads, batch=batch, causal=causal, block_sparse=block_sparse, fp8=fp8, lse=lse,
                  cc=cc, variant=variant, window=window, softcap=softcap, alibi=alibi,
                  varlen=varlen, head_dim_v=head_dim_v, backward=backward)
    try:
        sel = api.explain(**kwargs)
    except UnsupportedError as e:
        if as_json:
            emit_json({"selected": None, "error": str(e), "rejected": e.reasons})
        else:
            click.echo(f"no kernel fits: {str(e).split(' -- ')[0]}")
            for name, why in e.reasons.items():
                click.echo(f"  {name}: " + "; ".join(why))
        raise SystemExit(1)
    if as_json:
        emit_json({"request": sel.request.summary(), "selected": sel.chosen.name, "notes": sel.notes,
                   "warning": sel.warning, "outranked": sel.outranked, "rejected": sel.rejected})
    else:
        click.echo(sel.report())
