"""flashkit.distributed.bench without GPUs: its options and the rows it prints (the timing runs under torchrun on
two GPUs, scripts/gpu-check's multi-GPU step)."""

from flashkit.distributed import bench


def test_defaults_are_the_issue_shapes():
    args = bench.parse_args([])
    assert args.seqlen == "32768,65536,131072" and (args.heads, args.kv_heads, args.head_dim) == (16, 4, 128)
    assert args.dtype == "bfloat16" and not args.backward


def test_backward_row_reads_speedup_and_per_gpu_rate():
    row = dict(seqlen=131072, causal=True, single_s=0.8, single_tflops=500.0, speedup=1.9, ring_s=0.42,
               tokens_per_s=3.1e5, ring_tflops_per_gpu=480.0)
    line = bench.format_backward_row(row)
    assert line.split() == ["131072", "causal", "800.00", "500.0", "1.90x", "420.00", "0.310M", "480.0"]
    assert len(bench.BACKWARD_HEADER.split()) == len(line.split())


def test_backward_row_without_the_single_gpu_baseline():
    row = dict(seqlen=32768, causal=False, ring_s=0.05, tokens_per_s=6.5e5, ring_tflops_per_gpu=400.0)
    assert bench.format_backward_row(row).split() == ["32768", "full", "-", "-", "-", "50.00", "0.650M", "400.0"]
