"""The decode benchmark (DESIGN's serving shapes): microseconds, and bytes of K and V read over the
device-copy bandwidth measured in the same run, for flashkit (auto-selected: the split-KV decode kernel),
its paged path, and PyTorch SDPA's cuDNN and flash backends on the same inputs; then one shape at each head dim of
SWEEP_HEAD_DIMS.

python3 -m flashkit.bench.decode [--json PATH]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .report import script_main
from .timing import time_cupy
from .torch_baselines import time_sdpa

# (batch, seqlen_k, heads, kv_heads): the targets (bf16, head dim 128, one query row).
SHAPES = ((64, 8192, 32, 4), (128, 2048, 32, 8), (8, 32768, 32, 8), (1, 131072, 32, 8), (64, 8192, 32, 8),
          (16, 4096, 32, 4))
PAGED = ((64, 8192, 32, 4, 16), (64, 8192, 32, 4, 64), (8, 32768, 32, 8, 16))
HEAD_DIM = 128
# The head-dim sweep: GQA 32 / 8 over 8k keys, at each class of the decode kernel and head dims padded below them.
SWEEP_SHAPE = (32, 8192, 32, 8)
SWEEP_HEAD_DIMS = (32, 64, 80, 96, 128, 160, 192, 256)
SWEEP_PAGES = (64,)
COPY_BYTES = 1 << 30
WARMUP, ITERS = 5, 30


@dataclass
class DecodeRow:
    shape: str
    impl: str
    us: float | None
    kv_gbps: float | None
    of_copy: float | None       # K/V read rate over the device-copy rate
    vs_cudnn: float | None      # cuDNN's time over this one's (> 1: faster than cuDNN)
    note: str = ""


def copy_bandwidth(cupy) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = cupy.ones(COPY_BYTES // 2, dtype=cupy.uint16)
    dst = cupy.empty_like(src)
    ms = time_cupy(lambda i: dst.__setitem__(Ellipsis, src), WARMUP, ITERS)
    return 2 * COPY_BYTES / (ms * 1e-3)


def run(torch_baselines: bool = True) -> list[DecodeRow]:
    import cupy
    import ml_dtypes
    import flashkit
    from flashkit.kvcache import attention_with_kvcache
    bf16 = ml_dtypes.bfloat16
    copy_bps = copy_bandwidth(cupy)
    rows = [DecodeRow("device copy", "cupy copy", None, copy_bps / 1e9, 1.0, None)]
    rng = cupy.random.default_rng(0)

    def add(label, impl, ms, kv_bytes, cudnn_ms, note=""):
        if ms is None:
            rows.append(DecodeRow(label, impl, None, None, None, None, note))
            return
        bps = kv_bytes / (ms * 1e-3)
        rows.append(DecodeRow(label, impl, ms * 1e3, bps / 1e9, bps / copy_bps,
                              cudnn_ms / ms if cudnn_ms else None, note))
        print(f"{label:32s} {impl:18s} {ms * 1e3:9.1f} us {bps / 1e9:7.0f} GB/s {bps / copy_bps:6.1%}"
              + (f"  {cudnn_ms / ms:5.2f}x cuDNN" if cudnn_ms else "") + (f"  {note}" if note else ""), flush=True)

    def bench_shape(b, sk, h, hk, d, page_sizes):
        label = f"b{b} sk{sk} h{h}/{hk} d{d}"
        q = rng.standard_normal((b, 1, h, d), dtype=cupy.float32).astype(bf16)
        k = rng.standard_normal((b, sk, hk, d), dtype=cupy.float32).astype(bf16)
        v = rng.standard_normal((b, sk, hk, d), dtype=cupy.float32).astype(bf16)
        kv_bytes = 2 * k.nbytes
        cudnn_ms = None
        if torch_baselines:
            for backend in ("cudnn", "flash"):
                try:
                    ms = time_sdpa(backend, q, k, v, False, WARMUP, ITERS)
                except Exception as e:   # backend unavailable for the shape
                    add(label, f"sdpa {backend}", None, kv_bytes, None, f"{type(e).__name__}: {str(e)[:80]}")
                    continue
                cudnn_ms = ms if backend == "cudnn" else cudnn_ms
                add(label, f"sdpa {backend}", ms, kv_bytes, cudnn_ms)
        sel = flashkit.explain(dtype="bfloat16", head_dim=d, seqlen_q=1, seqlen_k=sk, heads=h, kv_heads=hk,
                               batch=b)
        note = f"{sel.chosen.name}: " + "; ".join(n.split(",")[0].replace("path: ", "") for n in sel.notes)
        ms = time_cupy(lambda i: flashkit.attention(q, k, v), WARMUP, ITERS)
        add(label, "flashkit", ms, kv_bytes, cudnn_ms, note)
        for other in ("fa3", "fa2"):
            try:
                ms = time_cupy(lambda i: flashkit.attention(q, k, v, variant=other), 2, 10)
                add(label, f"flashkit {other}", ms, kv_bytes, cudnn_ms, "previous path")
                break
            except flashkit.FlashkitError:
                continue
        for ps in page_sizes:
            pages = sk // ps
            table = cupy.argsort(rng.random(b * pages)).astype(cupy.int32).reshape(b, pages)
            kp = cupy.empty((b * pages, ps, hk, d), dtype=bf16)
            vp = cupy.empty_like(kp)
            kp[table.ravel()] = k.reshape(b * pages, ps, hk, d)
            vp[table.ravel()] = v.reshape(b * pages, ps, hk, d)
            lens = cupy.full((b,), sk, dtype=cupy.int32)
            ms = time_cupy(lambda i: attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                            check_indices=False), WARMUP, ITERS)
            add(label, f"flashkit paged{ps}", ms, kv_bytes, cudnn_ms)
            del kp, vp
        del q, k, v
        cupy.get_default_memory_pool().free_all_blocks()

    print(f"device copy: {copy_bps / 1e9:.0f} GB/s (read + write)", flush=True)
    for b, sk, h, hk in SHAPES:
        bench_shape(b, sk, h, hk, HEAD_DIM, [ps for *shape, ps in PAGED if tuple(shape) == (b, sk, h, hk)])
    for d in SWEEP_HEAD_DIMS:   # the head-dim classes and padded head dims on one shape
        bench_shape(*SWEEP_SHAPE, d, SWEEP_PAGES)
    return rows


def main(argv=None) -> int:
    return script_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
