"""bench/backward.py: the FLOP count and the command line (the timing itself needs a GPU and PyTorch)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from flashkit.bench.backward import backward_flops
from flashkit.cli import cli
from flashkit.runtime.device import device_count


def test_backward_flops_are_two_and_a_half_forwards_halved_when_causal():
    forward = 4 * 2 * 16 * 8192 * 8192 * 128
    assert backward_flops(2, 16, 8192, 128, False) == 2.5 * forward
    assert backward_flops(2, 16, 8192, 128, True) == 2.5 * forward / 2
    assert backward_flops(2, 16, 8192, 128, False, 128) == 2.5 * forward


def test_backward_flops_count_v_s_products_over_head_dim_v():
    """q k^T, dQ, dK over head_dim; P V, dP, dV over head_dim_v: 2.5 x 2 B H S^2 (D + Dv)."""
    assert backward_flops(1, 8, 1024, 192, False, 128) == 2.5 * 2 * 8 * 1024 * 1024 * (192 + 128)


@pytest.mark.skipif(device_count() > 0, reason="checks the GPU-less error")
def test_bench_backward_needs_a_device_and_says_so():
    result = CliRunner().invoke(cli, ["bench", "--backward", "--seqlen", "2048"])
    assert result.exit_code == 1 and "no CUDA device found" in result.output


def test_bench_head_dim_v_reaches_the_backward_bench(monkeypatch):
    """`flashkit bench --backward --head-dim 192 --head-dim-v 128` hands v's head dim to flashkit.bench.backward; without
    --backward it is a one-line error naming the option (before any device is asked)."""
    import flashkit.bench.backward as backward_bench
    import flashkit.cli.bench_cmd as bench_cmd
    seen = []
    monkeypatch.setattr(bench_cmd, "require_device", lambda: None)
    monkeypatch.setattr(backward_bench, "main", seen.append)
    result = CliRunner().invoke(cli, ["bench", "--backward", "--head-dim", "192", "--head-dim-v", "128"])
    assert result.exit_code == 0, result.output
    assert seen == [["--head-dims", "192", "--head-dim-v", "128"]]
    result = CliRunner().invoke(cli, ["bench", "--head-dim-v", "128"])
    assert result.exit_code == 1 and "--head-dim-v: times the backward only" in result.output

