"""Synthetic benchmark rows for the report and plot tests."""

from __future__ import annotations

from flashkit.bench.config import BenchRow, attention_flops


def row(kernel, tflops=None, seqlen=1024, head_dim=128, causal=False, reason="", density=None):
    flops = attention_flops(16, 2048 // head_dim, seqlen, seqlen, head_dim, causal)
    ms = flops / (tflops * 1e12) * 1e3 if tflops else None
    return BenchRow(kernel, 16, seqlen, 2048 // head_dim, head_dim, causal, "bfloat16", flops, density=density,
                    ms=ms, tflops=tflops, peak_bytes=3 * 2**20 if tflops else None, available=tflops is not None,
                    reason=reason)


def sample_rows():
    return [row("flashkit", 300.0), row("torch:flash", 150.0), row("torch:cudnn", 200.0),
            row("torch:efficient", reason="RuntimeError: No available kernel"),
            row("flashkit", 100.0, seqlen=2048, causal=True), row("torch:flash", 50.0, seqlen=2048, causal=True)]
