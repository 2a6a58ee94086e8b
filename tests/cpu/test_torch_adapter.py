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


def test_varlen_ops_are_registered_with_fake_shapes():
    import flashkit.torch  # noqa: F401
    q = torch.empty(300, 8, 64, device="meta", dtype=torch.float16)
    k = torch.empty(257, 2, 64, device="meta", dtype=torch.float16)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    out, lse = torch.ops.flashkit.attention_varlen_fwd(q, k, k, cu, cu, 200, 100, True, None, False)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (8, 300) and lse.dtype == torch.float32
    dq, dk, dv = torch.ops.flashkit.attention_varlen_bwd(q, q, k, k, out, lse, cu, cu, 200, 100, True, None, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)


def _meta_varlen(grad=True):
    q = torch.empty(30, 4, 64, device="meta", dtype=torch.bfloat16, requires_grad=grad)
    k = torch.empty(50, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=grad)
    v = torch.empty(50, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=grad)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    return q, k, v, cu


def test_varlen_autograd_calls_the_varlen_backward_with_the_forward_arguments(monkeypatch):
    """flashkit.torch.attention_varlen is differentiable: the registered formula hands the saved tensors, the
    offsets, max_seqlen and the flags to flashkit::attention_varlen_bwd (meta tensors: the fake kernels run)."""
    import flashkit.torch as ft
    seen = []
    real = ft.attention_varlen_bwd

    def spy(*args):
        seen.append(args)
        return real(*args)
    monkeypatch.setattr(ft, "attention_varlen_bwd", spy)
    q, k, v, cu = _meta_varlen()
    out = ft.attention_varlen(q, k, v, cu, cu, 20, 30, causal=True, softmax_scale=0.5, deterministic=True)
    assert out.shape == q.shape and out.requires_grad
    out.sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    (args,) = seen
    assert args[6] is cu and args[7] is cu and args[8:13] == (20, 30, True, 0.5, True)   # then the mods (none)
    assert args[5].shape == (4, 30) and args[5].dtype == torch.float32   # the forward's (heads, total_q) LSE


def test_compat_varlen_with_a_gradient_takes_the_custom_op():
    import flashkit.compat.flash_attn as fa
    q, k, v, cu = _meta_varlen()
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, 20, 30, causal=True, deterministic=True)
    assert out.shape == q.shape and out.grad_fn is not None
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_varlen_gradient_through_head_dim_v_has_v_s_shape():
    """v narrower than q (head_dim_v, MLA): the output and v's gradient take v's head dim (meta: the fake kernels)."""
    import flashkit.torch as ft
    q, k, _, cu = _meta_varlen()
    v = torch.empty(50, 2, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    out = ft.attention_varlen(q, k, v, cu, cu, 20, 30)
    assert out.shape == (30, 4, 32) and out.requires_grad
    out.sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
