"""pyproject.toml's package data ships every kernel source, header and drop-in functor a wheel needs."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("*.cu", "*.cuh", "*.py")


def test_package_data_covers_every_file_under_cuda_src():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["flashkit"]
    package = ROOT / "flashkit"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    needed = {p for suffix in SOURCES for p in (package / "cuda_src").rglob(suffix) if "__pycache__" not in p.parts}
    assert needed, "no kernel sources found"
    missing = sorted(str(p.relative_to(package)) for p in needed - shipped)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
