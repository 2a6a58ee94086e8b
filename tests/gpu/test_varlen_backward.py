"""attention_varlen_backward (fa2_bwd's varlen builds): the varlen matrix against every sequence's float64
gradients (DESIGN's rule, NaN-poisoned outputs), bit-identity with each sequence run alone through
attention_backward, deterministic bit-for-bit, and the torch / flash_attn_varlen_func autograd paths."""

from __future__ import annotations

import itertools
import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.backward import VARLEN_CASES, VarlenBackwardCase, varlen_backward_check

pytestmark = pytest.mark.gpu


def _matrix():
    spec = discover_kernels().get("fa2_bwd")
    out = []
    for case in VARLEN_CASES:
        for hd, causal in itertools.product((64, 128), (False, True)):
            dtype = ("float16", "bfloat16")[(hd // 64 + causal + len(case.name)) % 2]   # both dtypes, half the runs
            out.append(pytest.param(spec, case, hd, dtype, causal,
                                    id=f"{case.name}-hd{hd}-{dtype}-{'causal' if causal else 'full'}"))
    return out


@pytest.mark.parametrize("spec,case,hd,dtype,causal", _matrix())
def test_varlen_backward_matches_reference(spec, case, hd, dtype, causal):
    check = varlen_backward_check(spec, case, hd, dtype, causal)
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.passed, f"{check.label}: {result.note}"


def _packed(case: VarlenBackwardCase, hd: int, dtype: str, seed: int):
    import cupy as cp
    from flashkit.call.dtypes import BY_NAME
    rs = cp.random.RandomState(seed)
    storage = BY_NAME[dtype].storage
    mk = lambda s: rs.standard_normal(s, dtype=cp.float32).astype(storage)  # noqa: E731
    tq, tk = sum(case.lens_q), sum(case.keys)
    q, k, v = mk((tq, case.heads, hd)), mk((tk, case.kv_heads, hd)), mk((tk, case.kv_heads, hd))
    dout = mk((tq, case.heads, hd))
    cu_q, cu_k = (cp.asarray([0] + list(itertools.accumulate(n)), dtype=cp.int32) for n in (case.lens_q, case.keys))
    return q, k, v, dout, cu_q, cu_k


def _varlen_grads(case, q, k, v, dout, cu_q, cu_k, causal, deterministic=False):
    import flashkit
    # the default forward kernel, as flashkit.torch's op runs it (the torch test compares bits with this path)
    out, lse = flashkit.attention_varlen(q, k, v, cu_q, cu_k, max(case.lens_q), max(case.keys), causal=causal,
                                         return_lse=True)
    return out, lse, flashkit.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(case.lens_q),
                                                        max(case.keys), causal=causal, deterministic=deterministic)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", [64, 128])
def test_packed_gradients_equal_each_sequence_alone(causal, hd):
    """Bit-identical to fa2_bwd's dense build on each sequence as a batch of one, given the same out and LSE rows
    (deterministic mode on both sides: the dQ sums run in the same key-block order; fa2_bwd serves every varlen
    backward, so the dense call names it rather than take the sm_90 default, fa3_bwd)."""
    import cupy as cp
    import flashkit
    case = VarlenBackwardCase("alone", (1, 17, 65, 0, 129, 200), (64, 1, 130, 33, 129, 17), heads=8, kv_heads=2)
    q, k, v, dout, cu_q, cu_k = _packed(case, hd, "bfloat16", 11)
    out, lse, (dq, dk, dv) = _varlen_grads(case, q, k, v, dout, cu_q, cu_k, causal, deterministic=True)
    for b, (nq, nk) in enumerate(zip(case.lens_q, case.keys)):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        qs, ks = slice(q0, q0 + nq), slice(k0, k0 + nk)
        if nq == 0 or nk == 0:
            assert not bool(dq[qs].any()) and not bool(dk[ks].any()) and not bool(dv[ks].any()), f"sequence {b}"
            continue
        lse_b = cp.ascontiguousarray(lse[None, :, qs])
        alone = flashkit.attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], out[None, qs],
                                            lse_b, causal=causal, deterministic=True, variant="fa2_bwd")
        for name, packed, one in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), alone):
            assert bool((packed.view(cp.uint16) == one[0].view(cp.uint16)).all()), f"{name} of sequence {b}"


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bit_identical(causal):
    import cupy as cp
    case = VarlenBackwardCase("det", (1000, 1, 0, 513, 129), (700, 1000, 3, 513, 0), heads=8, kv_heads=2)
    q, k, v, dout, cu_q, cu_k = _packed(case, 128, "bfloat16", 5)
    _, _, first = _varlen_grads(case, q, k, v, dout, cu_q, cu_k, causal, deterministic=True)
    for _ in range(3):
        _, _, again = _varlen_grads(case, q, k, v, dout, cu_q, cu_k, causal, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a.view(cp.uint16) == b.view(cp.uint16)).all()), f"{name} differs between runs"


def test_no_tokens_or_no_keys_give_zero_gradients():
    import cupy as cp
    import flashkit
    q = cp.ones((5, 2, 64), dtype=cp.float16)
    k = cp.ones((0, 2, 64), dtype=cp.float16)
    cu_q, cu_k = cp.asarray([0, 5], dtype=cp.int32), cp.asarray([0, 0], dtype=cp.int32)
    out, lse = flashkit.attention_varlen(q, k, k, cu_q, cu_k, 5, 0, return_lse=True)
    dq, dk, dv = flashkit.attention_varlen_backward(q, q, k, k, out, lse, cu_q, cu_k, 5, 0)
    assert dq.shape == q.shape and not bool(dq.any()) and dk.shape == dv.shape == k.shape


def test_bad_offsets_raise_before_any_launch():
    import cupy as cp
    import flashkit
    case = VarlenBackwardCase("bad", (3, 4), (5, 6), heads=2, kv_heads=2)
    q, k, v, dout, cu_q, cu_k = _packed(case, 64, "float16", 1)
    out, lse = flashkit.attention_varlen(q, k, v, cu_q, cu_k, 4, 6, return_lse=True)
    bad = cp.asarray([0, 4, 6], dtype=cp.int32)   # ends at 6 of 7 query tokens
    with pytest.raises(flashkit.InputError, match="^cu_seqlens_q: expected to end at the 7 packed tokens"):
        flashkit.attention_varlen_backward(dout, q, k, v, out, lse, bad, cu_k, 4, 6)
    with pytest.raises(flashkit.InputError, match="^max_seqlen_k: "):
        flashkit.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, 4, 5)


def test_torch_varlen_autograd_and_flash_attn_varlen_func_match_the_cupy_gradients():
    torch = pytest.importorskip("torch")
    import cupy as cp
    import flashkit
    import flashkit.torch as fk_torch
    from flashkit.compat.flash_attn import flash_attn_varlen_func
    case = VarlenBackwardCase("torch", (17, 0, 130, 64), (33, 5, 130, 1), heads=4, kv_heads=1)
    q, k, v, dout, cu_q, cu_k = _packed(case, 64, "bfloat16", 9)
    _, _, want = _varlen_grads(case, q, k, v, dout, cu_q, cu_k, True, deterministic=True)
    tq, tk, tv, tdout, tcu_q, tcu_k = (torch.from_dlpack(x) for x in (q, k, v, dout, cu_q, cu_k))
    for fn in (lambda a, b, c: fk_torch.attention_varlen(a, b, c, tcu_q, tcu_k, 130, 130, causal=True,
                                                         deterministic=True),
               lambda a, b, c: flash_attn_varlen_func(a, b, c, tcu_q, tcu_k, 130, 130, causal=True,
                                                      deterministic=True)):
        xs = [x.detach().clone().requires_grad_() for x in (tq, tk, tv)]
        fn(*xs).backward(tdout)
        for name, x, w in zip(("dq", "dk", "dv"), xs, want):
            got = cp.from_dlpack(x.grad.contiguous())
            assert bool((got.view(cp.uint16) == w.view(cp.uint16)).all()), name
