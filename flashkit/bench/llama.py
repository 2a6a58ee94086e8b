"""A random Llama and a synthetic token stream for the transformers checks (tests and the training run): copies
of one model with the same weights on several attention implementations, and seeded, learnable batches.

Nothing is downloaded: the model is built from a config with a fixed seed, the tokens drawn from a seeded
generator. Needs torch and transformers (`pip install flashkit[transformers]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# The tests' tiny Llama: GQA 4/2, head_dim 64.
TINY_LLAMA = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=512, vocab_size=1000)
# Issue 12's small Llama: hidden 1024, 4 layers, GQA 16/4, head_dim 64.
SMALL_LLAMA = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                   intermediate_size=2816, vocab_size=32000)
PAD_TOKEN = 0   # the embedding's padding_idx: never drawn by the stream (its row gets no gradient)


def llama_config(**over: Any):
    """A LlamaConfig of TINY_LLAMA with `over` applied (a fresh one each call: from_config records the
    attention implementation in the config it is given)."""
    import transformers
    kw = dict(TINY_LLAMA, pad_token_id=PAD_TOKEN)
    kw.update(over)
    return transformers.LlamaConfig(**kw)


def same_weight_models(implementations: Sequence[str], device: Any = "cpu", dtype: Any = None, seed: int = 0,
                       **over: Any) -> list:
    """One random Llama (llama_config(**over), initialised under torch.manual_seed(seed)) per attention
    implementation, each a copy of the first one's weights, on `device` in `dtype` (default: float32)."""
    import torch
    import transformers
    if "flashkit" in implementations:
        from ..integrations.transformers import register
        register()
    dtype = dtype or torch.float32
    out = []
    for name in implementations:
        if not out:
            torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(llama_config(**over), attn_implementation=name)
        if out:
            model.load_state_dict(out[0].state_dict())
        out.append(model.to(device=device, dtype=dtype))
    return out


@dataclass(frozen=True)
class MarkovStream:
    """Batches of a first-order Markov chain over tokens 1..vocab-1: each token's successor is the token
    `offsets[i]` further on (modulo, skipping PAD_TOKEN) with probability `probs[i]`, so the best loss is the
    entropy of `probs`. With period > 0, every row repeats its first `period` tokens, so that beyond the
    first period the next token can be copied from context (attention's part of the loss).
    Batch i depends only on (seed, i): every run that asks for it sees the same tokens."""
    vocab: int
    batch: int
    seqlen: int
    seed: int = 0
    period: int = 0
    branching: int = 4

    def transitions(self):
        """(offsets, probs): the chain's successor offsets (distinct, in 1..vocab-2) and their probabilities."""
        import torch
        g = torch.Generator().manual_seed(self.seed)
        states = self.vocab - 1
        offsets = torch.randperm(states - 1, generator=g)[:self.branching] + 1
        probs = 0.5 ** torch.arange(1, self.branching + 1, dtype=torch.float64)
        return offsets, probs / probs.sum()

    def entropy(self) -> float:
        """The chain's per-token entropy in nats: the lowest loss where no token can be copied."""
        _, probs = self.transitions()
        return float(-(probs * probs.log()).sum())

    def __getitem__(self, index: int):
        """Batch `index`: int64 (batch, seqlen) token ids on the CPU."""
        import torch
        offsets, probs = self.transitions()
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        states = self.vocab - 1
        length = min(self.period, self.seqlen) if self.period > 0 else self.seqlen
        start = torch.randint(0, states, (self.batch, 1), generator=g)
        steps = offsets[torch.multinomial(probs, self.batch * (length - 1), replacement=True, generator=g)]
        walk = torch.cat([start, steps.view(self.batch, length - 1)], dim=1).cumsum(1) % states
        reps = -(-self.seqlen // length)
        return walk.repeat(1, reps)[:, :self.seqlen] + 1   # tokens 1..vocab-1


__all__ = ["TINY_LLAMA", "SMALL_LLAMA", "PAD_TOKEN", "MarkovStream", "llama_config", "same_weight_models"]
