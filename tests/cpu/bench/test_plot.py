"""flashkit.bench without a GPU: the PNG of results (bench/plot.py)."""

from __future__ import annotations

import sys

import pytest

from flashkit import bench
from flashkit.bench import plot
from flashkit.errors import FlashkitError
from .rows import sample_rows


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
