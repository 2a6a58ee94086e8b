#!/usr/bin/env python3
"""Where a Hopper kernel's visit cycles go (flashkit/bench/timeline.py): the variant rebuilt with clock64 stamps,
one call, the median cycles of each phase of a main-loop visit per consumer warpgroup. Forward: fa3, fa3_fp8,
block_sparse_hopper; backward: fa3_bwd (hd64 to hd128), on the default forward's output.

Usage: python3 scripts/timeline.py [--variant fa3] [--head-dim 128] [--seqlen 8192] [--batch 1] [--heads 16]
                                   [--dtype bfloat16]
(full attention: the stamps come from one tile; fp8 variants run on inputs quantized from the dtype's.)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flashkit.bench.timeline import run_timeline  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--variant", default="fa3")
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--seqlen", type=int, default=8192)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
a = ap.parse_args()
print(f"{a.variant} hd{a.head_dim} b{a.batch} s{a.seqlen} h{a.heads} {a.dtype}")
print(run_timeline(a.variant, a.head_dim, a.seqlen, a.batch, a.heads, a.dtype).render())
