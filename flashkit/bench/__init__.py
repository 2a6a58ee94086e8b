"""Benchmarks: flashkit's kernels beside PyTorch's attention backends; each feature registers its part."""

from . import block_sparse, fp8  # noqa: F401  (each feature registers its hooks with the run)
from .config import HEAD_DIMS, SDPA_BACKENDS, SEQLENS, TORCH_BACKENDS, BenchConfig, BenchResult, BenchRow, BenchShape
from .plot import write_plot
from .report import render_json, render_memory_table, render_table, rows_from_json
from .run import run_benchmark

__all__ = ["HEAD_DIMS", "SDPA_BACKENDS", "SEQLENS", "TORCH_BACKENDS", "BenchConfig", "BenchResult", "BenchRow",
           "BenchShape", "render_json", "render_memory_table", "render_table", "rows_from_json", "run_benchmark",
           "write_plot"]
