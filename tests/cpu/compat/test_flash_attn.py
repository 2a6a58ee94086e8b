"""flashkit.compat.flash_attn: flash-attn 2's signatures, its return conventions, and every argument flashkit
cannot honour refused by name before any launch."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import flashkit.compat.backend as backend
import flashkit.compat.flash_attn as fa
from flashkit.errors import InputError, UnsupportedError
from ..synth import cuda

# flash-attn 2.8's flash_attn_interface, parameter names and defaults in order
FLASH_ATTN_SIGNATURES = {
    "flash_attn_func": [("q", None), ("k", None), ("v", None), ("dropout_p", 0.0), ("softmax_scale", None),
                        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                        ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_qkvpacked_func": [("qkv", None), ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
                                  ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                                  ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_kvpacked_func": [("q", None), ("kv", None), ("dropout_p", 0.0), ("softmax_scale", None),
                                 ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
                                 ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_varlen_func": [("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
                               ("max_seqlen_q", None), ("max_seqlen_k", None), ("dropout_p", 0.0),
                               ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                               ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                               ("return_attn_probs", False), ("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", None), ("cu_seqlens", None), ("max_seqlen", None),
                                         ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
                                         ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                                         ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_varlen_kvpacked_func": [("q", None), ("kv", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
                                        ("max_seqlen_q", None), ("max_seqlen_k", None), ("dropout_p", 0.0),
                                        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                                        ("return_attn_probs", False)],
    "flash_attn_with_kvcache": [("q", None), ("k_cache", None), ("v_cache", None), ("k", None), ("v", None),
                                ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                                ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_signatures_are_flash_attns(name):
    params = inspect.signature(getattr(fa, name)).parameters.values()
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == FLASH_ATTN_SIGNATURES[name]
    assert name in fa.__all__


class Recorder:
    """Stands in for the backend: records each call, returns (out, lse) markers."""

    def __init__(self):
        self.calls = []

    def __call__(self, kind):
        def fn(*args, **kw):
            self.calls.append((kind, args, kw))
            return ("out", "lse") if kw.get("return_lse") else "out"
        return fn


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    for kind in ("dense", "varlen", "kvcache"):
        monkeypatch.setattr(backend, kind, rec(kind))
    return rec


Q, K = cuda((2, 17, 4, 64)), cuda((2, 33, 2, 64))
PQ, PK = cuda((40, 4, 64)), cuda((70, 2, 64))
CU = cuda((3,), "<i4")


@pytest.mark.parametrize("call,arg,error", [
    (lambda: fa.flash_attn_func(Q, K, K, dropout_p=0.1), "dropout_p", UnsupportedError),
    (lambda: fa.flash_attn_func(Q, K, K, dropout_p="0"), "dropout_p", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, causal=1), "causal", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, window_size=(3,)), "window_size", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, window_size=(-2, 0)), "window_size", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, softcap="x"), "softcap", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, deterministic=None), "deterministic", InputError),
    (lambda: fa.flash_attn_func(Q, K, K, return_attn_probs=1), "return_attn_probs", InputError),
    (lambda: fa.flash_attn_qkvpacked_func(Q), "qkv", InputError),
    (lambda: fa.flash_attn_kvpacked_func(Q, cuda((2, 33, 3, 2, 64))), "kv", InputError),
    (lambda: fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20, 35, dropout_p=0.5), "dropout_p", UnsupportedError),
    (lambda: fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20, 35, block_table=CU), "block_table", UnsupportedError),
    (lambda: fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20.0, 35), "max_seqlen_q", InputError),
    (lambda: fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20, True), "max_seqlen_k", InputError),
    (lambda: fa.flash_attn_varlen_qkvpacked_func(PQ, CU, 20), "qkv", InputError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, rotary_cos=K), "rotary_cos", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, rotary_sin=K), "rotary_sin", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, cache_batch_idx=CU), "cache_batch_idx", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, cache_leftpad=CU), "cache_leftpad", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, window_size=(8,)), "window_size", InputError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, softcap="30"), "softcap", InputError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, alibi_slopes=CU), "alibi_slopes", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, num_splits=4), "num_splits", UnsupportedError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, num_splits=-1), "num_splits", InputError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, k=K, v=K), "cache_seqlens", InputError),
    (lambda: fa.flash_attn_with_kvcache(Q, K, K, return_softmax_lse=None), "return_softmax_lse", InputError),
])
def test_arguments_flashkit_cannot_honour_are_refused_by_name(recorder, call, arg, error):
    with pytest.raises(error, match=rf"^{arg}: "):
        call()
    assert recorder.calls == []   # refused before anything ran


def test_flash_attn_func_maps_onto_flashkit(recorder):
    assert fa.flash_attn_func(Q, K, K, causal=True, softmax_scale=0.5, deterministic=True) == "out"
    kind, args, kw = recorder.calls[-1]
    assert kind == "dense" and args == (Q, K, K)
    assert kw == dict(causal=True, softmax_scale=0.5, window_size=None, softcap=0.0, alibi_slopes=None,
                      deterministic=True, return_lse=False)
    fa.flash_attn_func(Q, K, K, window_size=(4, -1), softcap=-1.0)   # flash-attn: softcap <= 0 is off
    assert recorder.calls[-1][2]["window_size"] == (4, -1) and recorder.calls[-1][2]["softcap"] == 0.0


def test_return_attn_probs_gives_out_lse_and_no_s_dmask(recorder):
    """flash-attn returns S_dmask only when dropout_p > 0; flashkit has no dropout, so None, as flash-attn."""
    assert fa.flash_attn_func(Q, K, K, return_attn_probs=True) == ("out", "lse", None)
    assert fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20, 35, return_attn_probs=True) == ("out", "lse", None)


def test_packed_forms_read_their_parts_in_place(recorder):
    qkv = np.zeros((2, 9, 3, 4, 8), np.float16)
    fa.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = recorder.calls[-1][1]
    assert all(np.shares_memory(x, qkv) for x in (q, k, v)) and q.shape == (2, 9, 4, 8)
    kv = np.zeros((2, 5, 2, 2, 8), np.float16)
    fa.flash_attn_kvpacked_func(q, kv)
    _, k, v = recorder.calls[-1][1]
    assert np.shares_memory(k, kv) and np.shares_memory(v, kv) and k.shape == (2, 5, 2, 8)
    packed = np.zeros((30, 3, 4, 8), np.float16)
    fa.flash_attn_varlen_qkvpacked_func(packed, CU, 12)
    kind, args, _ = recorder.calls[-1]
    assert kind == "varlen" and args[3] is CU and args[4] is CU and args[5:] == (12, 12)
    assert all(np.shares_memory(x, packed) for x in args[:3])


def test_kvcache_maps_k_v_and_a_missing_cache_seqlens(recorder):
    fa.flash_attn_with_kvcache(Q, K, K, k=K, v=K, cache_seqlens=CU, causal=True, return_softmax_lse=True)
    kind, args, kw = recorder.calls[-1]
    assert kind == "kvcache" and kw["k_new"] is K and kw["v_new"] is K and kw["cache_seqlens"] is CU
    fa.flash_attn_with_kvcache(Q, K, K)   # no cache_seqlens: the caches are full
    assert recorder.calls[-1][2]["cache_seqlens"] == 33
    pages, table = cuda((8, 16, 2, 64)), cuda((2, 3), "<i4")
    fa.flash_attn_with_kvcache(Q, pages, pages, block_table=table)
    assert recorder.calls[-1][2]["cache_seqlens"] == 48
    assert recorder.calls[-1][2]["window_size"] is None and recorder.calls[-1][2]["softcap"] == 0.0


def test_kvcache_passes_a_window_and_softcap(recorder):
    """Gemma 2 / Mistral serving: flash-attn's window_size and softcap reach attention_with_kvcache (softcap <= 0 off,
    an open window None)."""
    fa.flash_attn_with_kvcache(Q, K, K, window_size=(4096, 0), softcap=50.0, causal=True)
    kw = recorder.calls[-1][2]
    assert (kw["window_size"], kw["softcap"], kw["causal"]) == ((4096, 0), 50.0, True)
    fa.flash_attn_with_kvcache(Q, K, K, window_size=(-1, -1), softcap=-1.0)
    assert (recorder.calls[-1][2]["window_size"], recorder.calls[-1][2]["softcap"]) == (None, 0.0)


def test_torch_calls_that_need_a_gradient_carry_the_modifications_to_the_custom_ops(monkeypatch):
    """window, softcap and ALiBi have a backward: a call that needs a gradient runs flashkit.torch's differentiable
    ops with them as trailing arguments (window as left, right; the slopes as given), dense and varlen."""
    torch = pytest.importorskip("torch")
    seen = []

    class Ops:
        def attention_fwd(self, *args):
            seen.append(("dense", args[6:]))
            return args[0], None

        def attention_varlen_fwd(self, *args):
            seen.append(("varlen", args[10:]))
            return args[0], None

    monkeypatch.setattr(torch.ops, "flashkit", Ops(), raising=False)
    q = torch.zeros(1, 8, 2, 64, requires_grad=True)
    fa.flash_attn_func(q, q, q, window_size=(2, 0))
    fa.flash_attn_func(q, q, q, softcap=5.0)
    packed = torch.zeros(8, 2, 64, requires_grad=True)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    slopes = torch.ones(2)
    fa.flash_attn_varlen_func(packed, packed, packed, cu, cu, 8, 8, window_size=(2, 0))
    fa.flash_attn_varlen_func(packed, packed, packed, cu, cu, 8, 8, alibi_slopes=slopes)
    assert seen[:3] == [("dense", (2, 0, 0.0, None, 0)), ("dense", (-1, -1, 5.0, None, 0)),
                        ("varlen", (2, 0, 0.0, None, 0))]
    assert seen[3][0] == "varlen" and seen[3][1][3] is slopes
    assert fa.flash_attn_varlen_func.__module__ == "flashkit.compat.flash_attn"


def test_max_seqlen_may_be_a_zero_dim_tensor(recorder):
    torch = pytest.importorskip("torch")
    fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, torch.tensor(20), np.int64(35))
    assert recorder.calls[-1][1][5:] == (20, 35)


def test_flash_attn_varlen_func_passes_deterministic_on(recorder):
    fa.flash_attn_varlen_func(PQ, PK, PK, CU, CU, 20, 35, causal=True, deterministic=True)
    kind, args, kw = recorder.calls[-1]
    assert kind == "varlen" and kw["deterministic"] is True and kw["causal"] is True
