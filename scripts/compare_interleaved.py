"""flashkit against PyTorch's cuDNN backend, the two timed interleaved call by call (bench/timing.time_interleaved).

Usage: python3 scripts/compare_interleaved.py [SHAPE ...]
SHAPE: batch,seqlen,heads,kv_heads,head_dim[,causal], e.g. 32,512,32,8,128,causal (default: the table in
BENCHMARKS.md, "The serving prefill, timed interleaved"). bf16; three rotated input sets; 60 timed pairs.
Prints TFLOP/s of each (visible pairs only, 4 D flops a pair) and their ratio.
"""

from __future__ import annotations

import sys

DEFAULT = ("32,512,32,8,128,causal", "32,512,16,16,128", "16,1024,32,8,128,causal", "8,1024,16,16,64,causal",
           "4,2048,16,16,128,causal", "2,8192,16,16,128,causal", "2,8192,16,16,128", "2,8192,32,32,64",
           "2,8192,8,8,256,causal")
ROTATIONS, WARMUP, ITERS = 3, 5, 60


def main(argv: list[str]) -> int:
    import cupy
    import ml_dtypes

    from flashkit.bench.torch_baselines import cudnn_and_flashkit_ms
    rng = cupy.random.default_rng(0)
    for shape in argv or DEFAULT:
        fields = shape.split(",")
        b, s, h, hk, d = (int(x) for x in fields[:5])
        causal = fields[5:] == ["causal"]
        sets = [tuple(rng.standard_normal(shp, dtype=cupy.float32).astype(ml_dtypes.bfloat16)
                      for shp in ((b, s, h, d), (b, s, hk, d), (b, s, hk, d))) for _ in range(ROTATIONS)]
        flops = 4 * b * h * d * (s * (s + 1) / 2 if causal else s * s)
        cudnn, fk = cudnn_and_flashkit_ms(sets, causal, WARMUP, ITERS)
        print(f"b{b} s{s} h{h}/{hk} d{d} causal={causal}: cudnn {flops / cudnn / 1e9:.0f} TFLOP/s, flashkit "
              f"{flops / fk / 1e9:.0f} TFLOP/s, flashkit / cudnn {cudnn / fk:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
