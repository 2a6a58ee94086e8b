"""flashkit.bench without a GPU: FLOP counts, the shape convention, timing arithmetic, rendering."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from flashkit import bench
from flashkit.bench import block_sparse, config, fp8, plot, report, run, timing, torch_baselines
from flashkit.bench.config import BenchConfig, BenchRow, BenchShape
from flashkit.errors import FlashkitError


def row(kernel, tflops=None, seqlen=1024, head_dim=128, causal=False, reason="", density=None):
    flops = config.attention_flops(16, 2048 // head_dim, seqlen, seqlen, head_dim, causal)
    ms = flops / (tflops * 1e12) * 1e3 if tflops else None
    return BenchRow(kernel, 16, seqlen, 2048 // head_dim, head_dim, causal, "bfloat16", flops, density=density,
                    ms=ms, tflops=tflops, peak_bytes=3 * 2**20 if tflops else None, available=tflops is not None,
                    reason=reason)


# ---- FLOPs and shapes ----------------------------------------------------------------------------

def test_attention_flops_formula():
    assert config.attention_flops(2, 16, 1024, 512, 128) == 4.0 * 2 * 16 * 1024 * 512 * 128
    assert config.attention_flops(2, 16, 1024, 512, 128, causal=True) == 2.0 * 2 * 16 * 1024 * 512 * 128


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_convention_shapes_keep_tokens_and_hidden(head_dim):
    shapes = config.convention_shapes(head_dims=[head_dim], causal=[False])
    assert [s.seqlen for s in shapes] == list(config.SEQLENS)
    for s in shapes:
        assert s.batch * s.seqlen == 16384
        assert s.heads * s.head_dim == 2048
        assert not s.causal


def test_convention_shapes_cover_every_combination_and_small_token_budgets():
    shapes = config.convention_shapes(causal=[False, True])
    assert len(shapes) == len(config.SEQLENS) * len(config.HEAD_DIMS) * 2
    assert {(s.head_dim, s.causal) for s in shapes} == {(d, c) for d in config.HEAD_DIMS for c in (False, True)}
    assert config.convention_shapes(seqlens=[4096], head_dims=[64], causal=[False], tokens=1024)[0].batch == 1
    with pytest.raises(ValueError, match="does not divide"):
        config.convention_shapes(head_dims=[96], hidden=2048)


def test_block_sparse_flops_full_mask_equals_dense():
    blocks = np.ones((1, 1, 8, 8), dtype=bool)
    got = block_sparse.block_sparse_flops(blocks, 2, 4, 1024, 1024, 64, 128, 128)
    assert got == config.attention_flops(2, 4, 1024, 1024, 64)


def test_block_sparse_flops_counts_ragged_blocks_and_per_head_masks():
    # seqlen 300 with 128-blocks: rows/keys per block 128, 128, 44.
    blocks = np.zeros((2, 3, 3, 3), dtype=bool)
    blocks[0, 0, 2, 2] = True      # 44 x 44
    blocks[1, 2, 0, 1] = True      # 128 x 128
    blocks[1, 1, 2, 0] = True      # 44 x 128
    got = block_sparse.block_sparse_flops(blocks, 2, 3, 300, 300, 32, 128, 128)
    assert got == 4.0 * 32 * (44 * 44 + 128 * 128 + 44 * 128)
    assert block_sparse.block_sparse_flops(np.zeros((1, 1, 3, 3), bool), 2, 3, 300, 300, 32, 128, 128) == 0.0


def test_block_sparse_flops_matches_element_count_of_a_random_mask():
    from flashkit.features.block_mask import BlockMask
    mask = BlockMask.random(2, 3, 700, 500, 0.4, seed=3, block=128, xp=np)
    bq, bk = mask.block
    elements = np.broadcast_to(mask.to_element_mask(700, 500), (2, 3, 700, 500)).sum()
    assert block_sparse.block_sparse_flops(mask.dense_blocks(), 2, 3, 700, 500, 64, bq, bk) == 4.0 * 64 * elements


def test_tflops_and_rotation():
    assert config.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert config.tflops(1.0, None) is None
    assert config.rotation_copies(192 * 2**20, 50 * 2**20) == 2            # one set already exceeds the L2
    n = config.rotation_copies(3 * 2**20, 50 * 2**20)
    assert n * 3 * 2**20 > 50 * 2**20 and (n - 1) * 3 * 2**20 <= 50 * 2**20


def test_time_cuda_takes_the_median_of_event_pairs():
    clock = [0]
    calls = []

    class Event:
        def record(self):
            self.t = clock[0]

    def fn(i):
        calls.append(i)
        clock[0] += 10 if i == 4 else 1     # one slow run: the median ignores it

    ms = timing.time_cuda(fn, warmup=2, iters=5, event=Event, elapsed_ms=lambda a, b: float(b.t - a.t),
                         sync=lambda: None)
    assert calls == list(range(7))
    assert ms == 1.0


# ---- robustness ----------------------------------------------------------------------------------

def test_a_backend_that_raises_becomes_an_unavailable_row():
    shape = BenchShape(1, 64, 2, 64)
    q = np.zeros((1, 64, 2, 64), np.float32)
    r = run.bench_flashkit(shape, [(q, q, q)], None, BenchConfig(dtype="float32"), 1.0)
    assert not r.available and r.reason and r.ms is None


def test_torch_missing_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    ok, reason = torch_baselines.available()
    assert not ok and "torch" in reason


# ---- rendering -----------------------------------------------------------------------------------

def sample_rows():
    return [row("flashkit", 300.0), row("torch:flash", 150.0), row("torch:cudnn", 200.0),
            row("torch:efficient", reason="RuntimeError: No available kernel"),
            row("flashkit", 100.0, seqlen=2048, causal=True), row("torch:flash", 50.0, seqlen=2048, causal=True)]


def test_ratios_compare_flashkit_with_each_backend_of_the_same_shape():
    rat = report.ratios(sample_rows())
    rows = sample_rows()
    assert rat[(rows[0].shape_key, "flashkit")] == {"torch:flash": 2.0, "torch:cudnn": 1.5}
    assert rat[(rows[4].shape_key, "flashkit")] == {"torch:flash": 2.0}
    assert all(not k[1].startswith("torch:") for k in rat)


def test_render_table_shows_throughput_ratios_and_reasons():
    text = report.render_table(sample_rows())
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["shape", "kernel", "ms", "TFLOP/s"]
    assert "vs torch:flash" in lines[0] and "vs torch:cudnn" in lines[0] and "vs torch:efficient" in lines[0]
    first = next(line for line in lines if " flashkit " in f" {line} ")
    assert "300.0" in first and "2.00x" in first and "1.50x" in first
    assert "unavailable: RuntimeError: No available kernel" in text
    assert "causal" in text
    assert report.render_table([]) == "(no results)"


def test_render_memory_table():
    text = report.render_memory_table(sample_rows())
    assert "peak MiB" in text.splitlines()[0]
    assert "3.0" in text and "n/a" in text


def test_json_round_trips_rows_with_ratios_and_meta():
    rows = sample_rows()
    text = report.render_json(rows, {"gpu": "test"})
    data = json.loads(text)
    assert data["meta"] == {"gpu": "test"}
    assert data["rows"][0]["ratios"] == {"torch:flash": 2.0, "torch:cudnn": 1.5}
    assert data["rows"][3]["available"] is False
    assert report.rows_from_json(text) == rows


def test_bench_package_exports_the_renderers():
    assert bench.render_table is report.render_table
    assert bench.render_json is report.render_json
    assert bench.write_plot is plot.write_plot


def test_plot_writes_a_png_or_says_matplotlib_is_missing(tmp_path, monkeypatch):
    path = tmp_path / "bench.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(FlashkitError, match="matplotlib"):
            plot.write_plot(sample_rows(), str(path))
        return
    plot.write_plot(sample_rows(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_raises_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(FlashkitError, match="pip install matplotlib"):
        plot.write_plot(sample_rows(), str(tmp_path / "x.png"))


def test_environment_is_best_effort():
    meta = run.environment(BenchConfig(seqlens=(512,)))
    assert "date" in meta and meta["config"]["seqlens"] == [512]


def test_flashkit_label_names_a_forced_variant_and_falls_back_without_a_gpu():
    shape = BenchShape(1, 512, 16, 128)
    assert run.flashkit_label(shape, "standard", False) == "flashkit:standard"
    assert run.flashkit_label(shape, None, False).startswith("flashkit:")


def test_fp8_variants_are_recognised_by_their_manifest():
    assert fp8.is_fp8_variant("fp8_hopper") and fp8.is_fp8_variant("fp8")
    assert not fp8.is_fp8_variant("fa2") and not fp8.is_fp8_variant(None)
    assert not fp8.is_fp8_variant("no_such_variant")
