"""Test tiers: everything runs on the CPU except tests marked `gpu`, which skip (visibly) with no CUDA device.

Set FLASHKIT_REQUIRE_GPU=1 (scripts/gpu-check does) to make a missing device an error instead of a skip,
so that the GPU tier can never pass by skipping on the machine that is meant to run it.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"


@lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA device answers, else why not (for the skip's reason)."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return f"no CUDA device: CuPy is not importable ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device: getDeviceCount() failed ({type(e).__name__}: {str(e).splitlines()[0]})"
    if count == 0:
        return "no CUDA device: getDeviceCount() == 0"
    try:  # a device that is listed must also answer
        cupy.cuda.Device(0).compute_capability
        cupy.zeros(1).sum().item()
    except Exception as e:
        return f"no CUDA device answers: {type(e).__name__}: {str(e).splitlines()[0]}"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--split", default=None, metavar="K/N",
                     help="run only every N-th collected test, from the K-th (K = 1..N): N processes with "
                          "K = 1..N run the whole selection once (scripts/gpu-check --jobs)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped where none answers)")


def split_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--split K/N: keep items K-1, K-1+N, ... (interleaved, so that large modules spread over the N parts)."""
    spec = config.getoption("--split")
    if not spec:
        return
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--split: expected K/N with integers, got {spec!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--split: expected 1 <= K <= N, got {spec!r}")
    keep = [item for i, item in enumerate(items) if i % n == k - 1]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k - 1])
    items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    split_items(config, items)
    for item in items:
        # Everything under tests/gpu is GPU work, whether or not its module remembered the marker.
        if GPU_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("FLASHKIT_REQUIRE_GPU", "") not in ("", "0"):
        raise pytest.UsageError(f"FLASHKIT_REQUIRE_GPU is set but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


# A score_mod-only functor file: its manifest and one line of CUDA (`expr` of the scaled score s).
SCORE_ONLY_FUNCTOR = ("/*---\nname: {name}\nkind: modification\nsummary: a test functor\nfunctions: [score_mod]\n"
                      "---*/\n__device__ float score_mod(float s, int b, int h, int i, int j, "
                      "const flashkit::ModArgs& a) {{ return {expr}; }}\n")


@pytest.fixture
def drop_in_functor(tmp_path, monkeypatch):
    """Write drop-in functors into a fresh FLASHKIT_KERNEL_PATH directory and rediscover the kernels:
    drop_in_functor(name, source=None, reference=None, score_expr=None) -> the .cu path (source None: a score_mod
    returning score_expr; reference: the text of the Python reference beside it). Afterwards the kernels are
    rediscovered without them."""
    from flashkit.registry import discover_kernels
    mods = tmp_path / "functor_path" / "mods"

    def write(name: str, source: str | None = None, reference: str | None = None, score_expr: str | None = None):
        mods.mkdir(parents=True, exist_ok=True)
        path = mods / f"{name}.cu"
        path.write_text(source if source is not None else SCORE_ONLY_FUNCTOR.format(name=name, expr=score_expr))
        if reference is not None:
            path.with_suffix(".py").write_text(reference)
        monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(mods.parent))
        discover_kernels(refresh=True)
        return path

    yield write
    monkeypatch.delenv("FLASHKIT_KERNEL_PATH", raising=False)
    discover_kernels(refresh=True)
