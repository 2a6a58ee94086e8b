"""Verification: the harness, and each feature family's checks, registered with it on import."""

# Each family registers its checks on import; the first registered that a manifest requires wins
# (fp8 before block_sparse, as before the split).
from . import dense, fp8, block_sparse  # noqa: F401,I001
from . import decode  # noqa: F401,I001  (the split-KV decode family: every variant declaring kv_cache)
from . import backward  # noqa: F401,I001  (every variant declaring backward: gradients, not outputs)
from . import mods  # noqa: F401,I001  (an extension: window, chunk, softcap, ALiBi on every variant declaring them)
from . import varlen  # noqa: F401,I001  (an extension: packed variable-length batches on every variant declaring varlen)
from . import head_dim_v  # noqa: F401,I001  (an extension: v's head dim below q's on every variant declaring head_dim_v)
from . import arch_tiles  # noqa: F401,I001  (an extension: the tiles other architectures take, run on this GPU)
from .harness import Check, CheckResult, Shape, checks_for, judge, random_qkv, run_checks, runnable_variants

__all__ = ["Check", "CheckResult", "Shape", "checks_for", "judge", "random_qkv", "run_checks", "runnable_variants"]
