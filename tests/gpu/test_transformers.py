"""transformers with attn_implementation="flashkit" on a GPU: a tiny Llama (GQA 4/2, head_dim 64, bf16) against
sdpa, both judged against a float32 sdpa copy of the same weights: logits on unpadded, right-padded and
left-padded batches (and a decode step on a KV cache), and one training step's gradients; and one training step of a
tiny DeepSeek-V3 (multi-head latent attention: v of 128 under q / k's 192)."""

from __future__ import annotations

import copy
import time

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install flashkit[transformers])")

import flashkit  # noqa: E402
from flashkit.bench.llama import SMALL_LLAMA, same_weight_models  # noqa: E402

SEQLEN = 64
LENGTHS = {"none": [SEQLEN] * 4, "right": [64, 50, 33, 7], "left": [64, 50, 33, 7]}


def models(**over):
    """(flashkit bf16, sdpa bf16, sdpa float32) copies of one random tiny Llama on the GPU."""
    fk, sdpa = same_weight_models(("flashkit", "sdpa"), "cuda", torch.bfloat16, **over)
    oracle = copy.deepcopy(sdpa).float()
    assert fk.config._attn_implementation == "flashkit" and sdpa.config._attn_implementation == "sdpa"
    return fk, sdpa, oracle


def batch(padding: str, seed: int = 1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    lengths = LENGTHS[padding]
    ids = torch.randint(1, 1000, (len(lengths), SEQLEN), device="cuda", generator=g)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        if padding == "left":
            mask[b, SEQLEN - n:] = 1
        else:
            mask[b, :n] = 1
    return ids.masked_fill(mask == 0, 0), mask


def close(got, want, oracle, what: str, slack: float = 0.01):
    """flashkit's error against the float32 oracle within twice sdpa-bf16's, plus slack of the oracle's scale.

    sdpa-bf16's error counts over the entries where sdpa is finite: its backward on a left-padded batch gives NaN
    in the gradients of what the fully masked (padding) query rows touch, where the float32 oracle and flashkit
    stay finite. flashkit must be finite and within the bound everywhere."""
    err_fk = float((got.float() - oracle).abs().max())
    finite = want.isfinite()
    err_sdpa = float((want.float() - oracle)[finite].abs().max()) if bool(finite.any()) else 0.0
    bound = 2 * err_sdpa + slack * float(oracle.abs().max())
    nonfinite = int((~finite).sum())
    print(f"{what}: flashkit err {err_fk:.4g}, sdpa err {err_sdpa:.4g} ({nonfinite} non-finite in sdpa), "
          f"bound {bound:.4g}")
    assert bool(got.isfinite().all()) and err_fk <= bound, f"{what}: err {err_fk:.4g} > bound {bound:.4g}"


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_logits_match_sdpa(padding):
    fk, sdpa, oracle = models()
    ids, mask = batch(padding)
    valid = mask.bool()
    with torch.no_grad():
        got, want, ref = (m(input_ids=ids, attention_mask=mask).logits[valid] for m in (fk, sdpa, oracle))
    close(got, want, ref, f"logits ({padding} padding)")


def test_a_decode_step_on_a_left_padded_cache_matches_sdpa():
    fk, sdpa, oracle = models()
    ids, mask = batch("left", seed=2)
    nxt = torch.randint(1, 1000, (ids.shape[0], 1), device="cuda")
    step_mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    outs = []
    with torch.no_grad():
        for m in (fk, sdpa, oracle):
            cache = m(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
            outs.append(m(input_ids=nxt, attention_mask=step_mask, past_key_values=cache).logits[:, -1])
    close(*outs, "decode-step logits (left-padded cache)")


@pytest.mark.parametrize("padding", ["none", "right", "left"])   # left: through the varlen backward
def test_a_training_step_matches_sdpa_gradients(padding):
    fk, sdpa, oracle = models()
    ids, mask = batch(padding, seed=3)
    labels = ids.masked_fill(mask == 0, -100)
    losses = []
    for m in (fk, sdpa, oracle):
        m.train()
        loss = m(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach().float())
    close(losses[0], losses[1], losses[2], f"loss ({padding})")
    for (name, p_fk), p_sdpa, p_ref in zip(fk.named_parameters(), sdpa.parameters(), oracle.parameters()):
        close(p_fk.grad, p_sdpa.grad, p_ref.grad, f"grad {name} ({padding})", slack=0.02)


def test_training_on_left_padding_runs_the_varlen_backward(monkeypatch):
    """A left-padded training batch goes through attention_varlen_backward (not a dense fallback)."""
    import flashkit.torch as fk_torch
    seen = []
    real = fk_torch._attention_varlen_backward

    def spy(*args, **kw):
        seen.append(kw)
        return real(*args, **kw)
    monkeypatch.setattr(fk_torch, "_attention_varlen_backward", spy)
    fk, _, _ = models()
    fk.train()
    ids, mask = batch("left")
    fk(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    assert seen and all(kw["check_indices"] is False for kw in seen)
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in fk.parameters() if p.requires_grad)


# A tiny DeepSeek-V3: multi-head latent attention with q / k heads of 192 (128 + 64 rotary) and v heads of 128, dense
# MLPs only (first_k_dense_replace = the layers: no expert routing, which precision could flip between the copies).
MLA_CONFIG = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                  num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4, num_key_value_heads=4,
                  q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=256)


def mla_models():
    """(flashkit bf16, sdpa bf16, sdpa float32) copies of one random tiny DeepSeek-V3 on the GPU: transformers hands
    flashkit v of 128 under q / k's 192, which it runs as they are (head_dim_v, forward and backward)."""
    config_type = getattr(transformers, "DeepseekV3Config", None)
    if config_type is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV3 (multi-head latent attention)")
    from flashkit.integrations.transformers import register
    register()
    out = []
    for name in ("flashkit", "sdpa"):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config_type(**MLA_CONFIG), attn_implementation=name)
        if out:
            model.load_state_dict(out[0].state_dict())
        out.append(model.to(device="cuda", dtype=torch.bfloat16))
    return out[0], out[1], copy.deepcopy(out[1]).float()


def test_an_mla_model_trains_as_with_sdpa(monkeypatch):
    """DeepSeek-V3's attention (v narrower than q and k): the loss and every gradient of one training step within the
    rule against a float32 sdpa copy, with flashkit's backward called on v of 128."""
    import flashkit.torch as fk_torch
    seen = []
    real = fk_torch._attention_backward

    def spy(dout, q, k, v, *args, **kw):
        seen.append((q.shape[-1], v.shape[-1], dout.shape[-1]))
        return real(dout, q, k, v, *args, **kw)
    monkeypatch.setattr(fk_torch, "_attention_backward", spy)
    fk, sdpa, oracle = mla_models()
    ids, _ = batch("none", seed=4)
    losses = []
    for m in (fk, sdpa, oracle):
        m.train()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach().float())
    assert seen and set(seen) == {(192, 128, 128)}, seen
    close(losses[0], losses[1], losses[2], "MLA loss")
    for (name, p_fk), p_sdpa, p_ref in zip(fk.named_parameters(), sdpa.parameters(), oracle.parameters()):
        close(p_fk.grad, p_sdpa.grad, p_ref.grad, f"MLA grad {name}", slack=0.02)


def bench(steps: int = 20, batch_size: int = 8, seqlen: int = 2048) -> None:
    """ms per training step (forward + backward) of a small Llama (hidden 1024, 4 layers, GQA 16/4, head_dim 64,
    bf16, no padding) with flashkit and with sdpa; printed, for the record. The whole training run (AdamW, 300 steps,
    loss curves) is python3 -m flashkit.bench.train."""
    fk, sdpa, _ = models(**SMALL_LLAMA)
    ids = torch.randint(1, 32000, (batch_size, seqlen), device="cuda")
    for name, m in (("flashkit", fk), ("sdpa", sdpa)):
        m.train()
        for i in range(steps + 3):
            if i == 3:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            m(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / steps
        print(f"bench {name}: {ms:.2f} ms/step, {batch_size * seqlen / ms * 1e3:.0f} tokens/s "
              f"(batch {batch_size} x {seqlen}, {torch.cuda.get_device_name()})")


if __name__ == "__main__":
    bench()
