"""flashkit.bench without a GPU: tables, ratios and JSON of results (bench/report.py)."""

from __future__ import annotations

import json

from flashkit import bench
from flashkit.bench import plot, report
from .rows import sample_rows


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
