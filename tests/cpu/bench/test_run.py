"""flashkit.bench without a GPU: a failing kernel becomes a row; labels; the environment (bench/run.py)."""

from __future__ import annotations

import numpy as np

from flashkit.bench import run
from flashkit.bench.config import BenchConfig, BenchShape


def test_a_backend_that_raises_becomes_an_unavailable_row():
    shape = BenchShape(1, 64, 2, 64)
    q = np.zeros((1, 64, 2, 64), np.float32)
    r = run.bench_flashkit(shape, [(q, q, q)], None, BenchConfig(dtype="float32"), 1.0)
    assert not r.available and r.reason and r.ms is None


def test_environment_is_best_effort():
    meta = run.environment(BenchConfig(seqlens=(512,)))
    assert "date" in meta and meta["config"]["seqlens"] == [512]


def test_flashkit_label_names_a_forced_variant_and_falls_back_without_a_gpu():
    shape = BenchShape(1, 512, 16, 128)
    assert run.flashkit_label(shape, "standard", False) == "flashkit:standard"
    assert run.flashkit_label(shape, None, False).startswith("flashkit:")
