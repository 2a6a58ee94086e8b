"""flashkit.integrations.transformers on the CPU: registration, and a tiny Llama run through the integration's
whole glue (views, mask plans, packing, scatter back) with the flashkit kernels stood in for by a float32
torch reference, against transformers' own sdpa. The GPU tier runs the real kernels (tests/gpu)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashkit.compat.backend as backend  # noqa: E402
import flashkit.integrations.transformers as fk_hf  # noqa: E402
from flashkit.bench.llama import same_weight_models  # noqa: E402
from flashkit.errors import UnsupportedError  # noqa: E402


def reference_dense(q, k, v, *, causal, softmax_scale, window_size=None, softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_lse=False):
    """softmax(scale q k^T [bottom-right causal, window]) v on (b, s, h, d) tensors, differentiable."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    k, v = (x.repeat_interleave(h // x.shape[2], dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (softmax_scale or 1 / math.sqrt(d))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window_size is not None:
        if window_size[0] >= 0:
            keep &= j >= i - window_size[0]
        if window_size[1] >= 0 and not causal:
            keep &= j <= i + window_size[1]
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]))
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return (out, lse) if return_lse else out


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale, window_size=None, softcap=0.0,
                     alibi_slopes=None, deterministic=False, return_lse=False):
    assert q.dtype == k.dtype and cu_q.dtype == torch.int32 and isinstance(max_q, int)
    outs = []
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        assert qs.stop - qs.start <= max_q and ks.stop - ks.start <= max_k
        if qs.stop == qs.start:
            continue
        if ks.stop == ks.start:
            outs.append(torch.zeros_like(q[qs]))
            continue
        outs.append(reference_dense(q[None, qs], k[None, ks], v[None, ks], causal=causal, softmax_scale=softmax_scale,
                                    window_size=window_size, softcap=softcap)[0])
    return torch.cat(outs) if outs else torch.zeros_like(q)


@pytest.fixture
def calls(monkeypatch):
    """The flashkit backend replaced by the reference; records which path each call took and its q."""
    seen = []

    def dense(q, k, v, **kw):
        seen.append(("dense", (q, k, v), kw))
        return reference_dense(q, k, v, **kw)

    def varlen(q, k, v, *args, **kw):
        seen.append(("varlen", q, kw))
        return reference_varlen(q, k, v, *args, **kw)

    monkeypatch.setattr(backend, "dense", dense)
    monkeypatch.setattr(backend, "varlen", varlen)
    fk_hf.register()
    return seen


def tiny_llamas():
    """Two copies of one tiny random Llama (bench/llama.py's), on sdpa and on flashkit."""
    ref, fk = same_weight_models(("sdpa", "flashkit"), "cpu")
    assert ref.config._attn_implementation == "sdpa" and fk.config._attn_implementation == "flashkit"
    return ref.eval(), fk.eval()


def batch(lengths, seqlen, left=False):
    torch.manual_seed(1)
    ids = torch.randint(1, 1000, (len(lengths), seqlen))
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, seqlen - n:] = 1 if left else 0
        mask[b, :n] = 0 if left else 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def test_register_adds_flashkit_to_both_interfaces(calls):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    assert AttentionInterface._global_mapping["flashkit"] is fk_hf.attention_forward
    assert AttentionMaskInterface._global_mapping["flashkit"] is fk_hf.mask_function


def test_transformers_flash_import_of_the_name_gets_flashkits_functions(calls):
    """"flashkit" holds "flash": transformers imports its flash-attn functions when a model is built."""
    import transformers.modeling_flash_attention_utils as fa_utils
    from flashkit.compat import flash_attn as fa
    (fn, varlen, kvcache, _, _), process = fa_utils.lazy_import_flash_attention("flashkit")
    assert (fn, varlen, kvcache) == (fa.flash_attn_func, fa.flash_attn_varlen_func, fa.flash_attn_with_kvcache)
    assert process(query_length=4, key_length=4, is_causal=True)["causal"] is True
    fk_hf.register()   # again: the route is not stacked twice
    assert fa_utils._lazy_imports.flashkit_names == {"flashkit"}


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_logits_match_sdpa(calls, padding):
    ref, fk = tiny_llamas()
    lengths = [24, 24, 24] if padding == "none" else [24, 17, 5]
    ids, mask = batch(lengths, 24, left=padding == "left")
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = fk(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    assert torch.allclose(got[valid], want[valid], atol=2e-4, rtol=1e-4)
    paths = {c[0] for c in calls}
    assert paths == ({"varlen"} if padding == "left" else {"dense"})
    if padding != "left":
        dense_qkv = [x for c in calls if c[0] == "dense" for x in c[1]]
        assert dense_qkv and all(x._is_view() for x in dense_qkv)   # transpose(1, 2) views of transformers' tensors


def test_packed_sequences_match_separate_runs(calls):
    ref, fk = tiny_llamas()
    ids, _ = batch([30], 30)
    lengths = [12, 7, 11]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        got = fk(input_ids=ids, position_ids=position_ids).logits[0]
        start = 0
        for n in lengths:
            want = ref(input_ids=ids[:, start:start + n]).logits[0]
            assert torch.allclose(got[start:start + n], want, atol=2e-4, rtol=1e-4)
            start += n
    assert {c[0] for c in calls} == {"varlen"}


def test_packed_rows_of_a_batch_match_separate_runs(calls):
    ref, fk = tiny_llamas()
    ids, _ = batch([20, 20], 20)
    segments = [[8, 12], [5, 5, 10]]
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in segments])
    with torch.no_grad():
        got = fk(input_ids=ids, position_ids=position_ids).logits
        for b, row in enumerate(segments):
            start = 0
            for n in row:
                want = ref(input_ids=ids[b:b + 1, start:start + n]).logits[0]
                assert torch.allclose(got[b, start:start + n], want, atol=2e-4, rtol=1e-4)
                start += n


def test_greedy_generation_with_left_padding_matches_sdpa(calls):
    ref, fk = tiny_llamas()
    ids, mask = batch([9, 4], 9, left=True)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fk.generate(ids, **kw), ref.generate(ids, **kw))


def test_training_on_right_padding_matches_sdpa_gradients(calls):
    ref, fk = tiny_llamas()
    ref.train(), fk.train()
    ids, mask = batch([20, 13], 20)
    labels = ids.masked_fill(mask == 0, -100)
    for model in (ref, fk):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, p_ref), p_fk in zip(ref.named_parameters(), fk.parameters()):
        assert torch.allclose(p_fk.grad, p_ref.grad, atol=1e-5, rtol=1e-3), name
    assert {c[0] for c in calls} == {"dense"}


def test_training_on_left_padding_runs_varlen_and_matches_sdpa_gradients(calls):
    """Left padding needs the varlen path; with its backward the gradients flow through the gather, the packed
    call and the scatter back (padded positions carry no loss)."""
    ref, fk = tiny_llamas()
    ref.train(), fk.train()
    ids, mask = batch([20, 13], 20, left=True)
    labels = ids.masked_fill(mask == 0, -100)
    for model in (ref, fk):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    for (name, p_ref), p_fk in zip(ref.named_parameters(), fk.parameters()):
        assert torch.allclose(p_fk.grad, p_ref.grad, atol=1e-5, rtol=1e-3), name
    assert {c[0] for c in calls} == {"varlen"}
    assert all(c[1].requires_grad and c[2]["deterministic"] is False for c in calls)


def test_training_on_packed_sequences_runs_varlen_with_a_gradient(calls):
    _, fk = tiny_llamas()
    fk.train()
    ids = torch.randint(1, 1000, (1, 16))
    pos = torch.cat([torch.arange(9), torch.arange(7)])[None]
    fk(input_ids=ids, position_ids=pos, labels=ids).loss.backward()
    assert {c[0] for c in calls} == {"varlen"} and all(c[1].requires_grad for c in calls)
    assert all(p.grad is not None for p in fk.parameters() if p.requires_grad)


def test_deterministic_reaches_the_varlen_path(calls, monkeypatch):
    monkeypatch.setenv(fk_hf.DETERMINISTIC_ENV, "1")
    _, fk = tiny_llamas()
    ids, mask = batch([10, 6], 10, left=True)
    fk(input_ids=ids, attention_mask=mask)
    assert calls and all(c[2]["deterministic"] is True for c in calls)


def test_mask_functions_flash_attention_2_would_drop_are_refused(calls):
    from transformers.masking_utils import blockwise_overlay, causal_mask_function, or_masks
    fn = or_masks(causal_mask_function, blockwise_overlay(torch.zeros(1, 4, dtype=torch.long)))
    with pytest.raises(UnsupportedError, match="attention_mask: this model combines the causal mask"):
        fk_hf.mask_function(1, 4, 4, mask_function=fn, attention_mask=None)
    assert fk_hf.mask_function(1, 4, 4, mask_function=causal_mask_function, attention_mask=torch.ones(1, 4).bool()) \
        is None


def test_a_custom_4d_padding_mask_runs_and_other_4d_masks_are_refused(calls):
    _, fk = tiny_llamas()
    ids, mask = batch([10, 6], 10, left=True)
    keep = mask.bool()[:, None, None, :] & torch.ones(10, 10).tril().bool()
    four = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    with torch.no_grad():
        got = fk(input_ids=ids, attention_mask=four).logits
        want = fk(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-5)
    four[0, 0, 5, 2] = -3.0
    with pytest.raises(UnsupportedError, match="a bias"):
        with torch.no_grad():
            fk(input_ids=ids, attention_mask=four)


def test_dropout_and_sinks_are_refused():
    q = torch.zeros(1, 2, 4, 64)

    class Module:
        is_causal = True

    with pytest.raises(UnsupportedError, match="^dropout: "):
        fk_hf.attention_forward(Module(), q, q, q, None, dropout=0.1)
    with pytest.raises(UnsupportedError, match="^s_aux: "):
        fk_hf.attention_forward(Module(), q, q, q, None, s_aux=torch.zeros(2))


def test_a_sliding_window_with_a_gradient_on_a_ragged_batch_runs_the_differentiable_varlen_op(monkeypatch):
    """The real backend (no stand-in): a ragged batch goes through the varlen custom op, the window with it
    (sliding_window w: (w - 1, w - 1), as flash_attention_2)."""
    torch = pytest.importorskip("torch")
    seen = []

    class Ops:
        def attention_varlen_fwd(self, *args):
            seen.append(args[10:])
            return args[0], None

    monkeypatch.setattr(torch.ops, "flashkit", Ops(), raising=False)
    q = torch.zeros(2, 4, 8, 64, requires_grad=True)   # (batch, heads, seqlen, head_dim), as transformers hands it
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])

    class Module:
        is_causal = True

    fk_hf.attention_forward(Module(), q, q, q, mask, sliding_window=4)
    assert seen == [(3, 3, 0.0, None, 0)]   # (causal closes the right side in the op, flash-attn's rule)