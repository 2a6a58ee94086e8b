"""The variable-length benchmark (issue 13's serving prefill shapes): TFLOP/s of a packed varlen batch against
the same kernel on an equal-length batch of the same total tokens, and PyTorch's baselines in the same run.

TFLOP/s count the visible (query, key) pairs: 4 D per pair (two products), summed over sequences and heads.

python3 -m flashkit.bench.varlen [--json PATH] [--no-torch]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .report import script_main
from .config import device_l2_bytes, rotation_copies
from .timing import time_cupy
from .torch_baselines import time_sdpa

HEAD_DIM = 128
HEADS, KV_HEADS = 32, 8
SEQUENCES = 64
LENGTHS = (100, 4000)        # drawn uniformly, fixed seed
SERVING_PREFILL = (32, 512)  # batch x seqlen, causal GQA 32/8: the 1.0x cuDNN target
WARMUP, ITERS = 3, 10
PREFILL_ITERS = 100             # the serving prefill's calls are short: more of them
PREFILL_SETS = 3


@dataclass
class VarlenRow:
    case: str
    impl: str
    ms: float | None
    tflops: float | None
    vs_equal: float | None    # TFLOP/s over the same kernel's on the equal-length batch
    vs_cudnn: float | None    # cuDNN's time over this one's (same FLOPs; > 1: faster)
    note: str = ""


def pairs(lens_q, lens_k, causal: bool) -> int:
    """Visible (query, key) pairs, causal bottom-right aligned per sequence."""
    total = 0
    for nq, nk in zip(lens_q, lens_k):
        if causal:
            rows = np.arange(nq)
            total += int(np.clip(rows + nk - nq + 1, 0, nk).sum())
        else:
            total += nq * nk
    return total


def run(torch_baselines: bool = True) -> list[VarlenRow]:
    import cupy
    import ml_dtypes
    import flashkit
    bf16 = ml_dtypes.bfloat16
    rows: list[VarlenRow] = []
    rng = np.random.default_rng(0)
    lens = rng.integers(LENGTHS[0], LENGTHS[1] + 1, size=SEQUENCES)
    total = int(lens.sum())
    equal = total // SEQUENCES
    cu = cupy.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    crng = cupy.random.default_rng(0)

    def draw(*shape):
        return crng.standard_normal(shape, dtype=cupy.float32).astype(bf16)

    def add(case, impl, ms, flops, equal_tflops=None, cudnn_ms=None, note=""):
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        rows.append(VarlenRow(case, impl, ms, tflops, tflops / equal_tflops if tflops and equal_tflops else None,
                              cudnn_ms / ms if ms and cudnn_ms else None, note))
        print(f"{case:40s} {impl:24s} {ms or float('nan'):8.3f} ms {tflops or float('nan'):6.0f} TFLOP/s"
              + (f"  {rows[-1].vs_equal:5.3f}x equal-length" if rows[-1].vs_equal else "")
              + (f"  {rows[-1].vs_cudnn:5.2f}x cuDNN" if rows[-1].vs_cudnn else "") + (f"  {note}" if note else ""),
              flush=True)
        return tflops

    q, k, v = draw(total, HEADS, HEAD_DIM), draw(total, KV_HEADS, HEAD_DIM), draw(total, KV_HEADS, HEAD_DIM)
    qe, ke, ve = (x[:SEQUENCES * equal].reshape(SEQUENCES, equal, x.shape[1], HEAD_DIM) for x in (q, k, v))
    lens_list = [int(n) for n in lens]
    for causal in (False, True):
        tag = " causal" if causal else ""
        case = f"varlen {SEQUENCES} seqs {LENGTHS[0]}-{LENGTHS[1]} ({total} tok) h{HEADS}/{KV_HEADS}{tag}"
        flops = 4 * HEAD_DIM * HEADS * pairs(lens_list, lens_list, causal)
        eq_flops = 4 * HEAD_DIM * HEADS * pairs([equal] * SEQUENCES, [equal] * SEQUENCES, causal)
        sel = flashkit.explain(dtype="bfloat16", head_dim=HEAD_DIM, seqlen_q=int(lens.max()), heads=HEADS,
                               kv_heads=KV_HEADS, batch=SEQUENCES, causal=causal, varlen=True)
        for variant in dict.fromkeys([sel.chosen.name, "fa2"]):
            ms_eq = time_cupy(lambda i: flashkit.attention(qe, ke, ve, causal=causal, variant=variant), WARMUP, ITERS)
            eq_tflops = add(f"equal {SEQUENCES}x{equal}{tag}", variant, ms_eq, eq_flops)
            ms = time_cupy(lambda i: flashkit.attention_varlen(q, k, v, cu, cu, int(lens.max()), int(lens.max()),
                                                              causal=causal, variant=variant, check_indices=False),
                           WARMUP, ITERS)
            add(case, variant, ms, flops, eq_tflops)
        if torch_baselines:
            try:
                ms_eq = time_sdpa("cudnn", qe, ke, ve, causal, WARMUP, ITERS)
                add(f"equal {SEQUENCES}x{equal}{tag}", "sdpa cudnn", ms_eq, eq_flops)
            except Exception as e:
                add(f"equal {SEQUENCES}x{equal}{tag}", "sdpa cudnn", None, eq_flops, note=f"{type(e).__name__}")
    del q, k, v, qe, ke, ve
    b, s = SERVING_PREFILL
    q, k, v = draw(b, s, HEADS, HEAD_DIM), draw(b, s, KV_HEADS, HEAD_DIM), draw(b, s, KV_HEADS, HEAD_DIM)
    case = f"prefill b{b} s{s} h{HEADS}/{KV_HEADS} causal"
    flops = 4 * HEAD_DIM * HEADS * b * pairs([s], [s], True)
    # Short kernels (about 0.2 ms): cuDNN and flashkit interleaved call by call, so that both run under the same
    # clocks (timed apart, their ratio moved by up to 10% from run to run); fa2, much slower, on its own.
    rot = max(PREFILL_SETS, rotation_copies(q.nbytes + k.nbytes + v.nbytes, device_l2_bytes()))
    sets = [(q, k, v)] + [(draw(b, s, HEADS, HEAD_DIM), draw(b, s, KV_HEADS, HEAD_DIM), draw(b, s, KV_HEADS, HEAD_DIM))
                          for _ in range(rot - 1)]

    def fk(variant=None):
        return lambda i: flashkit.attention(*sets[i % rot], causal=True, variant=variant)
    cudnn_ms = None
    if torch_baselines:
        from .torch_baselines import cudnn_and_flashkit_ms
        try:
            cudnn_ms, ms = cudnn_and_flashkit_ms(sets, True, WARMUP, PREFILL_ITERS)
            add(case, "sdpa cudnn", cudnn_ms, flops)
        except Exception as e:   # the cuDNN backend refused the shape
            add(case, "sdpa cudnn", None, flops, note=f"{type(e).__name__}")
    if cudnn_ms is None:
        ms = time_cupy(fk(), WARMUP, PREFILL_ITERS)
    add(case, "flashkit (auto)", ms, flops, cudnn_ms=cudnn_ms)
    add(case, "fa2", time_cupy(fk("fa2"), WARMUP, ITERS), flops, cudnn_ms=cudnn_ms)
    return rows


def main(argv=None) -> int:
    return script_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
