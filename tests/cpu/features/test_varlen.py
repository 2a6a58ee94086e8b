"""features/varlen.py: every argument of attention_varlen checked on metadata, one InputError naming it."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.call.arrays import ArrayMeta
from flashkit.errors import InputError
from flashkit.features.varlen import check_values, kernel_fields, validate_varlen


def meta(name, shape, dtype=np.float16, strides=None, on_gpu=True, device=0):
    if strides is None:
        strides = tuple(int(s) for s in np.cumprod((1,) + tuple(shape)[::-1][:-1])[::-1])
    return ArrayMeta(name, tuple(shape), np.dtype(dtype), tuple(strides), on_gpu, "cupy.ndarray", device)


def args(**over):
    base = dict(q=meta("q", (300, 8, 64)), k=meta("k", (500, 2, 64)), v=meta("v", (500, 2, 64)),
                cu_q=meta("cu_seqlens_q", (4,), np.int32), cu_k=meta("cu_seqlens_k", (4,), np.int32),
                max_seqlen_q=200, max_seqlen_k=300, softmax_scale=None)
    base.update(over)
    return base


def test_a_varlen_call_is_a_batch_of_its_longest_sequences():
    call = validate_varlen(**args())
    p = call.problem
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads, p.kv_heads, p.head_dim) == (3, 200, 300, 8, 2, 64)
    assert (call.total_q, call.total_k) == (300, 500) and p.dtype == "float16"
    assert p.softmax_scale == pytest.approx(64 ** -0.5)


def test_zero_tokens_are_allowed():
    call = validate_varlen(**args(q=meta("q", (0, 8, 64)), max_seqlen_q=0))
    assert call.total_q == 0 and call.problem.seqlen_q == 0


@pytest.mark.parametrize("over, match", [
    (dict(q=meta("q", (1, 300, 8, 64))), r"q: expected 3 dims \(total_tokens, heads, head_dim\)"),
    (dict(k=meta("k", (500, 3, 64)), v=meta("v", (500, 3, 64))), "k: kv heads"),
    (dict(v=meta("v", (499, 2, 64))), "v: expected the shape of k"),
    (dict(k=meta("k", (500, 2, 32)), v=meta("v", (500, 2, 32))), "k: head_dim must match"),
    (dict(q=meta("q", (300, 8, 64), np.float32), k=meta("k", (500, 2, 64), np.float32),
          v=meta("v", (500, 2, 64), np.float32)), "q: varlen runs on the flash kernels"),
    (dict(cu_q=meta("cu_seqlens_q", (4,), np.int64)), "cu_seqlens_q: expected dtype int32"),
    (dict(cu_q=meta("cu_seqlens_q", (1,), np.int32)), r"cu_seqlens_q: expected shape \(batch \+ 1,\)"),
    (dict(cu_q=meta("cu_seqlens_q", (4, 1), np.int32)), r"cu_seqlens_q: expected shape \(batch \+ 1,\)"),
    (dict(cu_k=meta("cu_seqlens_k", (5,), np.int32)), r"cu_seqlens_k: expected shape \(4,\)"),
    (dict(cu_k=meta("cu_seqlens_k", (4,), np.int32, strides=(2,))), "cu_seqlens_k: expected a contiguous"),
    (dict(cu_q=meta("cu_seqlens_q", (4,), np.int32, on_gpu=False)), "cu_seqlens_q: expected a CUDA array"),
    (dict(cu_k=meta("cu_seqlens_k", (4,), np.int32, device=1)), r"cu_seqlens_k: must be on q's device"),
    (dict(max_seqlen_q=-1), "max_seqlen_q: expected an int >= 0"),
    (dict(max_seqlen_k=2.5), "max_seqlen_k: expected an int >= 0"),
    (dict(max_seqlen_k=True), "max_seqlen_k: expected an int >= 0"),
])
def test_bad_arguments_name_themselves(over, match):
    with pytest.raises(InputError, match=match):
        validate_varlen(**args(**over))


class Host:
    """A device array stand-in: .get() returns the host copy, as CuPy's does."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.int32)

    def get(self):
        return self.values


@pytest.mark.parametrize("cu_q, cu_k, match", [
    ([1, 100, 200, 300], [0, 100, 300, 500], "cu_seqlens_q: expected to start at 0"),
    ([0, 100, 90, 300], [0, 100, 300, 500], "cu_seqlens_q: expected non-decreasing offsets, got 100 then 90"),
    ([0, 100, 200, 299], [0, 100, 300, 500], "cu_seqlens_q: expected to end at the 300 packed tokens"),
    ([0, 100, 200, 300], [0, 100, 300, 501], "cu_seqlens_k: expected to end at the 500 packed tokens"),
    ([0, 0, 250, 300], [0, 100, 300, 500], r"max_seqlen_q: expected >= the longest sequence \(250\), got 200"),
    ([0, 100, 200, 300], [0, 0, 500, 500], r"max_seqlen_k: expected >= the longest sequence \(500\), got 300"),
])
def test_offsets_are_checked(cu_q, cu_k, match):
    call = validate_varlen(**args())
    with pytest.raises(InputError, match=match):
        check_values(call, Host(cu_q), Host(cu_k))


def test_good_offsets_pass_with_empty_sequences():
    call = validate_varlen(**args())
    check_values(call, Host([0, 0, 200, 300]), Host([0, 300, 300, 500]))


def test_kernel_fields_give_the_packed_lse_layout():
    class Ptr:
        def __init__(self, ptr):
            self.data = type("D", (), {"ptr": ptr})()
    fields = kernel_fields(Ptr(4096), Ptr(8192), 300)
    assert fields == {"varlen": {"cu_seqlens_q": 4096, "cu_seqlens_k": 8192},
                      "lse_batch_stride": 0, "lse_head_stride": 300}


def test_an_empty_packed_array_with_zero_strides_is_accepted():
    call = validate_varlen(**args(q=meta("q", (0, 8, 64), strides=(0, 0, 0)), max_seqlen_q=0))
    assert call.total_q == 0
