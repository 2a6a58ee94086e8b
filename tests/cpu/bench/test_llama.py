"""bench/llama.py: the seeded Markov token stream and the same-weight model copies (torch and transformers, else
a visible skip)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install flashkit[transformers])")

from flashkit.bench.llama import PAD_TOKEN, TINY_LLAMA, MarkovStream, llama_config, same_weight_models  # noqa: E402


def test_a_batch_depends_only_on_the_seed_and_its_index():
    s = MarkovStream(vocab=1000, batch=3, seqlen=50, seed=7)
    assert s[4].shape == (3, 50) and s[4].dtype == torch.int64
    assert torch.equal(s[4], MarkovStream(vocab=1000, batch=3, seqlen=50, seed=7)[4])
    assert not torch.equal(s[4], s[5])
    assert not torch.equal(s[4], MarkovStream(vocab=1000, batch=3, seqlen=50, seed=8)[4])


def test_tokens_follow_the_chain_and_never_hit_the_pad_token():
    s = MarkovStream(vocab=100, batch=4, seqlen=400, seed=1)
    ids = s[0]
    assert int(ids.min()) >= 1 and int(ids.max()) <= 99 and PAD_TOKEN == 0
    offsets, probs = s.transitions()
    assert len(set(offsets.tolist())) == 4 and float(probs.sum()) == pytest.approx(1.0)
    steps = (ids[:, 1:] - ids[:, :-1]) % 99
    assert set(steps.flatten().tolist()) <= set(offsets.tolist())
    freq = torch.stack([(steps == o).float().mean() for o in offsets])
    assert torch.allclose(freq.double(), probs, atol=0.05)
    assert s.entropy() == pytest.approx(-sum(p * math.log(p) for p in probs.tolist()))


def test_a_period_repeats_each_rows_first_tokens():
    ids = MarkovStream(vocab=1000, batch=2, seqlen=70, period=16)[3]
    assert torch.equal(ids[:, 16:32], ids[:, :16]) and torch.equal(ids[:, 64:], ids[:, :6])
    assert not torch.equal(ids[0, :16], ids[1, :16])


def test_same_weight_models_share_the_weights_and_keep_their_implementation():
    a, b = same_weight_models(("sdpa", "eager"), "cpu", num_hidden_layers=1)
    assert a.config._attn_implementation == "sdpa" and b.config._attn_implementation == "eager"
    assert a.config.num_hidden_layers == 1 and a.config.hidden_size == TINY_LLAMA["hidden_size"]
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    again = same_weight_models(("sdpa",), "cpu", num_hidden_layers=1)[0]
    assert torch.equal(again.lm_head.weight, a.lm_head.weight)
    bf16 = same_weight_models(("sdpa",), "cpu", torch.bfloat16, seed=1, num_hidden_layers=1)[0]
    assert bf16.lm_head.weight.dtype == torch.bfloat16 and not torch.equal(bf16.lm_head.weight.float(),
                                                                           a.lm_head.weight.bfloat16().float())
    assert llama_config().pad_token_id == PAD_TOKEN
