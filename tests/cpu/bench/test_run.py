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


def _rows(n):
    return [run.BenchRow(f"k{i}", 1, 64, 2, 64, False, "bfloat16", 2e9) for i in range(n)]


def test_interleaved_timing_gives_each_prepared_call_its_time_in_order():
    """time_together times only the calls that were prepared, in one interleaved timer call, and fills each row."""
    seen = []

    def timer(calls, warmup, iters):
        seen.append((len(calls), warmup, iters))
        return [1.0, 4.0][:len(calls)]

    a, b, c = _rows(3)
    c.available, c.reason = False, "RuntimeError: refused"
    config = BenchConfig(warmup=3, iters=7)
    out = run.time_together([(a, lambda i: None), (c, None), (b, lambda i: None)], config, timer)
    assert out == [a, c, b] and seen == [(2, 3, 7)]
    assert (a.ms, b.ms, c.ms) == (1.0, 4.0, None)
    assert a.tflops == 2.0 and b.tflops == 0.5 and not c.available


def test_a_timer_that_raises_marks_every_interleaved_row_unavailable():
    def timer(calls, warmup, iters):
        raise RuntimeError("out of memory")

    a, b = _rows(2)
    out = run.time_together([(a, lambda i: None), (b, lambda i: None)], BenchConfig(), timer)
    assert [r.available for r in out] == [False, False] and all("out of memory" in r.reason for r in out)


def test_interleave_is_refused_beside_the_benches_that_choose_their_own_timing():
    from click.testing import CliRunner
    from flashkit.cli import cli
    for mode in ("--backward", "--functors", "--block-mods"):
        result = CliRunner().invoke(cli, ["bench", "--interleave", mode])
        assert result.exit_code == 1 and "--interleave: an option of the sweep" in result.output, result.output


def test_the_torch_baselines_of_a_shape():
    """flex alone beside a block mask (when configured), else the configured SDPA backends; none without torch."""
    config = BenchConfig(torch_backends=("flash", "cudnn", "flex"))
    assert run._torch_backends(config, None, True) == ("flash", "cudnn", "flex")
    assert run._torch_backends(config, object(), True) == ("flex",)
    assert run._torch_backends(BenchConfig(torch_backends=("cudnn",)), object(), True) == ()
    assert run._torch_backends(config, None, False) == ()
