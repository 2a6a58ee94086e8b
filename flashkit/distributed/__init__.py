"""Scale-out: ring (context-parallel) attention over torch.distributed, and zigzag sequence sharding.

Importing this package never imports torch; ring_attention imports it when called (and raises
TorchMissingError, naming the `torch` extra, where it is missing). The sharding helpers work on NumPy,
CuPy and torch arrays.
"""

from .errors import CollectiveTimeoutError, DistributedError, RankMismatchError, TorchMissingError
from .plan import Block, ring_plan, source_rank, step_blocks
from .sharding import gather_zigzag, shard_zigzag, unshard_zigzag, zigzag_permutation, zigzag_positions


def ring_attention(q, k, v, *, group=None, causal=False, softmax_scale=None, return_lse=False,
                   layout="zigzag", timeout=120.0, variant=None):
    """See flashkit.distributed.ring.ring_attention (imported lazily: torch loads on the first call)."""
    from .ring import ring_attention as _ring_attention
    return _ring_attention(q, k, v, group=group, causal=causal, softmax_scale=softmax_scale,
                           return_lse=return_lse, layout=layout, timeout=timeout, variant=variant)


__all__ = ["ring_attention", "shard_zigzag", "unshard_zigzag", "gather_zigzag", "zigzag_positions",
           "zigzag_permutation", "step_blocks", "ring_plan", "source_rank", "Block", "DistributedError",
           "RankMismatchError", "CollectiveTimeoutError", "TorchMissingError"]
