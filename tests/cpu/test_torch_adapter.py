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
