"""CPU-tier fixtures: an isolated environment and a directory of synthetic variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from .synth import manifest, write_cu


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path_factory):
    """No user kernel path, and a throwaway compile cache, for every CPU test."""
    monkeypatch.delenv("FLASHKIT_KERNEL_PATH", raising=False)
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path_factory.mktemp("flashkit-cache")))


@pytest.fixture
def variant_dir(tmp_path):
    """A directory for synthetic variants, and a writer: variant_dir.write(name, **fields) -> Path."""
    class Dir:
        path = tmp_path / "kernels"

        def write(self, name: str, filename: str | None = None, **fields) -> Path:
            fields.setdefault("entry", f"flashkit_{name}_fwd")
            return write_cu(self.path, filename or f"{name}.cu", manifest(name=name, **fields))

    Dir.path.mkdir()
    return Dir()
