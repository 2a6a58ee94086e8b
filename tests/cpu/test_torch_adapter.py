"""flashkit.torch: the custom ops are registered, with fake (meta) implementations of the right shapes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_ops_are_registered_with_fake_shapes():
    import flashkit.torch  # noqa: F401
    q = torch.empty(2, 300, 8, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 257, 2, 64, device="meta", dtype=torch.bfloat16)
    out, lse = torch.ops.flashkit.attention_fwd(q, k, k, True, None, False)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32
    dq, dk, dv = torch.ops.flashkit.attention_bwd(q, q, k, k, out, lse, True, None, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


def test_cupy_views_leave_what_the_full_path_must_check_as_it_is():
    """Only CUDA tensors of float16/bfloat16/float32/int32 become CuPy views (the call cache keys those); CPU and
    meta tensors, fp8, scalars and None reach the entry points as given, so their checks and messages stay."""
    pytest.importorskip("cupy")
    from flashkit.torch import _VIEWED_DTYPES, cupy_views
    cpu = torch.ones(2, 3, dtype=torch.bfloat16)
    meta = torch.empty(4, device="meta", dtype=torch.float16)
    given = (cpu, meta, None, 7, "x")
    assert all(a is b for a, b in zip(cupy_views(given), given))
    assert torch.int32 in _VIEWED_DTYPES and torch.float8_e4m3fn not in _VIEWED_DTYPES
