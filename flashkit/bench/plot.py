"""A PNG of benchmark results: TFLOP/s against seqlen, one panel per (head_dim, causal, density)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

from ..errors import FlashkitError


def write_plot(rows: Sequence[Any], path: str, title: str | None = None) -> str:
    """PNG of TFLOP/s vs seqlen, one panel per (head_dim, causal, density), one line per kernel."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise FlashkitError("--plot needs matplotlib: pip install matplotlib") from exc
    panels: OrderedDict[tuple, list] = OrderedDict()
    for r in rows:
        if r.available and r.tflops:
            density = None if r.density is None else round(r.density, 2)
            panels.setdefault((r.head_dim, r.causal, density), []).append(r)
    if not panels:
        raise FlashkitError("plot: no available results to draw")
    n = len(panels)
    cols = min(3, n)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, ((hd, causal, density), group) in zip(axes.flat, panels.items()):
        for kernel in OrderedDict.fromkeys(r.kernel for r in group):
            pts = sorted((r.seqlen, r.tflops) for r in group if r.kernel == kernel)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kernel)
        name = f"head_dim {hd}" + (", causal" if causal else "") + (f", density {density}" if density else "")
        ax.set_title(name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
