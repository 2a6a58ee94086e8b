"""Rendering benchmark results: text tables (throughput with ratios, memory) and JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from collections import OrderedDict
from typing import Any, Sequence

from .config import BenchRow

BASELINE_PREFIX = "torch:"
MIB = 2**20


def _groups(rows: Sequence[Any]) -> "OrderedDict[tuple, list]":
    """Rows by shape, in first-seen order."""
    groups: OrderedDict[tuple, list] = OrderedDict()
    for r in rows:
        groups.setdefault(r.shape_key, []).append(r)
    return groups


def baselines(rows: Sequence[Any]) -> list[str]:
    """The torch kernels that appear in rows, in first-seen order."""
    return list(OrderedDict.fromkeys(r.kernel for r in rows if r.kernel.startswith(BASELINE_PREFIX)))


def ratios(rows: Sequence[Any]) -> dict[tuple, dict[str, float]]:
    """{(shape_key, kernel): {baseline: tflops / baseline tflops}} for every available non-torch row."""
    out: dict[tuple, dict[str, float]] = {}
    for key, group in _groups(rows).items():
        base = {r.kernel: r.tflops for r in group if r.kernel.startswith(BASELINE_PREFIX) and r.available and r.tflops}
        for r in group:
            if r.kernel.startswith(BASELINE_PREFIX) or not (r.available and r.tflops):
                continue
            out[(key, r.kernel)] = {b: r.tflops / t for b, t in base.items()}
    return out


def _shape_label(r: Any) -> str:
    text = f"b{r.batch} s{r.seqlen} h{r.heads} d{r.head_dim}"
    if r.causal:
        text += " causal"
    if r.density is not None:
        text += f" dens={r.density:.3f}"
    return text


def _format(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_table(rows: Sequence[Any]) -> str:
    """One line per (shape, kernel): median ms, TFLOP/s, and flashkit's ratio to each torch backend."""
    if not rows:
        return "(no results)"
    names = baselines(rows)
    rat = ratios(rows)
    table = [["shape", "kernel", "ms", "TFLOP/s", *[f"vs {n}" for n in names], "note"]]
    for key, group in _groups(rows).items():
        for r in group:
            if not r.available:
                table.append([_shape_label(r), r.kernel, "-", "n/a", *["" for _ in names],
                              f"unavailable: {r.reason}"])
                continue
            rr = rat.get((key, r.kernel), {})
            cells = [f"{rr[n]:.2f}x" if n in rr else "" for n in names]
            table.append([_shape_label(r), r.kernel, f"{r.ms:.3f}", f"{r.tflops:.1f}", *cells, ""])
    return _format(table)


def render_memory_table(rows: Sequence[Any]) -> str:
    """Peak device memory each call allocates beyond its inputs (output, LSE, workspace), in MiB."""
    if not rows:
        return "(no results)"
    table = [["shape", "kernel", "peak MiB"]]
    for r in rows:
        peak = f"{r.peak_bytes / MIB:.1f}" if r.available and r.peak_bytes is not None else "n/a"
        table.append([_shape_label(r), r.kernel, peak])
    return _format(table)


def render_json(rows: Sequence[Any], meta: dict[str, Any] | None = None) -> str:
    """{"meta": ..., "rows": [...]} with each row's fields and its ratios to the torch backends."""
    from dataclasses import asdict
    rat = ratios(rows)
    items = []
    for r in rows:
        item = asdict(r)
        item["ratios"] = rat.get((r.shape_key, r.kernel), {})
        items.append(item)
    return json.dumps({"meta": meta or {}, "rows": items}, indent=2, sort_keys=False)


def rows_from_json(text: str) -> list[Any]:
    """BenchRows back from render_json's output."""
    from dataclasses import fields
    names = {f.name for f in fields(BenchRow)}
    return [BenchRow(**{k: v for k, v in item.items() if k in names}) for item in json.loads(text)["rows"]]


def script_main(doc: str, run, argv=None) -> int:
    """The command line of a standalone benchmark module: run(torch_baselines) -> rows, --json PATH, --no-torch."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    rows = run(not args.no_torch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0
