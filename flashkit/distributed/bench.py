"""Ring attention throughput under torchrun: tokens/s, speedup over one GPU, and communication hidden.

    torchrun --nproc-per-node 2 -m flashkit.distributed.bench --seqlen 32768,65536,131072 --json-out ring.json

Per (seqlen, causal): one GPU on the full sequence; the ring (ring_attention, with its input check); the
ring loop alone (no check); the loop with communication skipped (the same blocks on the shard already
held); the transfers alone. hidden: the share of transfer time the compute stream did not wait for, timed hop by
hop with CUDA events (comm.StallTimedExchange: 1 - sum(stall) / sum(transfer)); the loop difference
1 - (loop - loop without comm) / comm_only is kept beside it (hidden_share_loop).
Times are medians of CUDA-event timings, the slowest rank's; FLOPs 4*B*H*N^2*D (halved when causal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import timedelta

from ._torch import require_torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # NVLink multicast stays off


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m flashkit.distributed.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", default="32768,65536,131072", help="full sequence lengths, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-single", action="store_true", help="skip the one-GPU baseline")
    ap.add_argument("--variant", default=None, help="force flashkit's kernel (default: the registry's choice)")
    ap.add_argument("--backward", action="store_true",
                    help="also time forward + backward (ring_attention's autograd against one GPU's flashkit.torch)")
    ap.add_argument("--json-out", default=None)
    return ap.parse_args(argv)


def timed(torch, fn, iters: int, warmup: int) -> float:
    """Median seconds of fn() by CUDA events on the current stream, after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def slowest(torch, seconds: float, device) -> float:
    """The largest value over the ranks (a ring step is as slow as its slowest rank)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


def every_rank(torch, seconds: float, device, world: int) -> list[float]:
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    out = torch.empty(world, dtype=torch.float64, device=device)
    torch.distributed.all_gather_into_tensor(out, t)
    return [float(x) for x in out.tolist()]


def bench_case(torch, args, seqlen: int, causal: bool, rank: int, world: int, device) -> dict:
    from .comm import LocalExchange, StallTimedExchange, comm_stream, hidden_share
    from .ring import local_attention, ring_attention, ring_forward
    from .sharding import shard_zigzag
    dtype = getattr(torch, args.dtype)
    b, h, hk, d = args.batch, args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator(device=device).manual_seed(1234 + seqlen)
    full = [torch.randn((b, seqlen, n, d), generator=gen, device=device, dtype=torch.float32).to(dtype)
            for n in (h, hk, hk)]
    scale = d ** -0.5
    row = {"variant": args.variant or "default", "seqlen": seqlen, "batch": b, "heads": h, "kv_heads": hk,
           "head_dim": d, "dtype": args.dtype, "causal": causal, "world_size": world}
    flops = 4.0 * b * h * seqlen * seqlen * d * (0.5 if causal else 1.0)
    if not args.no_single:
        t1 = timed(torch, lambda: local_attention(*full, causal=causal, scale=scale, variant=args.variant),
                   args.iters, args.warmup)
        row["single_s"] = slowest(torch, t1, device)
    q, k, v = (shard_zigzag(x, rank, world) for x in full)
    del full
    torch.cuda.empty_cache()
    kw = dict(group=None, rank=rank, world_size=world, causal=causal, scale=scale, variant=args.variant)
    ring = timed(torch, lambda: ring_attention(q, k, v, causal=causal, softmax_scale=scale, variant=args.variant),
                 args.iters, args.warmup)
    ring_rank = every_rank(torch, ring, device, world)
    unchecked = every_rank(torch, timed(torch, lambda: ring_forward(q, k, v, **kw), args.iters, args.warmup),
                           device, world)
    no_comm = every_rank(torch, timed(torch, lambda: ring_forward(q, k, v, exchange=LocalExchange(), **kw),
                                      args.iters, args.warmup), device, world)
    comm_only = slowest(torch, timed(torch, lambda: ring_forward(q, k, v, compute=False, **kw),
                                     args.iters, args.warmup), device)
    stalls = []   # the ring loop with every hop's transfer and compute-stream stall timed

    def stall_timed_loop():
        ex = StallTimedExchange(None, rank, world, torch.cuda.current_stream(device), comm_stream(device))
        ring_forward(q, k, v, exchange=ex, **kw)
        stalls.append(ex)
    for _ in range(args.warmup + args.iters):
        stall_timed_loop()
    torch.cuda.synchronize(device)
    hops = [hop for ex in stalls[args.warmup:] for hop in ex.hop_times_ms()]
    step0 = timed(torch, lambda: local_attention(q, k, v, causal=causal, scale=scale, variant=args.variant),
                  args.iters, args.warmup)
    row.update(ring_s=max(ring_rank), ring_rank_s=ring_rank, no_comm_s=max(no_comm), no_comm_rank_s=no_comm,
               unchecked_s=max(unchecked), unchecked_rank_s=unchecked, check_s=max(ring_rank) - max(unchecked),
               comm_only_s=comm_only, step0_s=slowest(torch, step0, device))
    kv_bytes = 2 * k.numel() * k.element_size()
    exposed = max(0.0, row["unchecked_s"] - row["no_comm_s"])   # the transfers' share, the input check aside
    row.update(tokens_per_s=b * seqlen / row["ring_s"], ring_tflops_per_gpu=flops / world / row["ring_s"] / 1e12,
               kv_bytes_per_step=kv_bytes, transfer_s=comm_only / max(1, world - 1),
               transfer_gbps=kv_bytes / (comm_only / max(1, world - 1)) / 1e9 if world > 1 else None,
               exposed_comm_s=exposed, comm_overhead_share=exposed / row["ring_s"],
               hidden_share_loop=(1.0 - min(1.0, exposed / comm_only)) if comm_only > 0 else None,
               hidden_share=hidden_share(hops),
               hop_transfer_ms=statistics.median(t for t, _ in hops) if hops else None,
               hop_stall_ms=statistics.median(e for _, e in hops) if hops else None,
               balance=max(no_comm) / min(no_comm))
    if "single_s" in row:
        row.update(single_tokens_per_s=b * seqlen / row["single_s"],
                   single_tflops=flops / row["single_s"] / 1e12, speedup=row["single_s"] / row["ring_s"])
    return row


def bench_backward_case(torch, args, seqlen: int, causal: bool, rank: int, world: int, device) -> dict:
    """Forward + backward through autograd: ring_attention on zigzag shards against flashkit.torch.attention on
    the whole sequence on one GPU (FLOPs: forward 1 + backward 2.5 times 4 B H S^2 D, halved when causal)."""
    from ..torch import attention as fk_attention
    from .ring import ring_attention
    from .sharding import shard_zigzag
    dtype = getattr(torch, args.dtype)
    b, h, hk, d = args.batch, args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator(device=device).manual_seed(4321 + seqlen)
    full = [torch.randn((b, seqlen, n, d), generator=gen, device=device, dtype=torch.float32).to(dtype)
            for n in (h, hk, hk, h)]   # q, k, v, dout
    scale = d ** -0.5
    flops = 3.5 * 4.0 * b * h * seqlen * seqlen * d * (0.5 if causal else 1.0)

    def train_step(fn, q, k, v, dout):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        fn(*leaves).backward(dout)

    row = {"variant": "default", "seqlen": seqlen, "batch": b, "heads": h, "kv_heads": hk, "head_dim": d,
           "dtype": args.dtype, "causal": causal, "world_size": world, "pass": "forward+backward"}
    if not args.no_single:
        single = lambda *x: fk_attention(*x, causal=causal, softmax_scale=scale)  # noqa: E731
        row["single_s"] = slowest(torch, timed(torch, lambda: train_step(single, *full), args.iters, args.warmup),
                                  device)
    shards = [shard_zigzag(x, rank, world) for x in full]
    del full
    torch.cuda.empty_cache()
    ring = lambda *x: ring_attention(*x, causal=causal, softmax_scale=scale)  # noqa: E731
    ring_rank = every_rank(torch, timed(torch, lambda: train_step(ring, *shards), args.iters, args.warmup),
                           device, world)
    row.update(ring_s=max(ring_rank), ring_rank_s=ring_rank, tokens_per_s=b * seqlen / max(ring_rank),
               ring_tflops_per_gpu=flops / world / max(ring_rank) / 1e12)
    if "single_s" in row:
        row.update(single_tflops=flops / row["single_s"] / 1e12, speedup=row["single_s"] / row["ring_s"])
    return row


def format_backward_row(r: dict) -> str:
    single = f"{r['single_s'] * 1e3:8.2f} {r['single_tflops']:6.1f} {r['speedup']:5.2f}x" if "single_s" in r \
        else "       -      -      -"
    return (f"{r['seqlen']:>7} {'causal' if r['causal'] else 'full':>6} {single} {r['ring_s'] * 1e3:8.2f} "
            f"{r['tokens_per_s'] / 1e6:7.3f}M {r['ring_tflops_per_gpu']:6.1f}")


BACKWARD_HEADER = (f"{'seqlen':>7} {'mask':>6} {'1gpu_ms':>8} {'TF/gpu':>6} {'speed':>6} {'ring_ms':>8} "
                   f"{'tok/s':>8} {'TF/gpu':>6}")


def format_row(r: dict) -> str:
    single = f"{r['single_s'] * 1e3:8.2f} {r['speedup']:5.2f}x" if "single_s" in r else "      -      -"
    hidden = f"{100 * r['hidden_share']:5.1f}%" if r.get("hidden_share") is not None else "    -"
    return (f"{r['seqlen']:>7} {'causal' if r['causal'] else 'full':>6} {single} {r['ring_s'] * 1e3:8.2f} "
            f"{r['tokens_per_s'] / 1e6:7.3f}M {r['ring_tflops_per_gpu']:6.1f} {r['no_comm_s'] * 1e3:8.2f} "
            f"{r['comm_only_s'] * 1e3:7.2f} {hidden} {r['balance']:5.3f} {r['check_s'] * 1e3:6.2f}")


HEADER = (f"{'seqlen':>7} {'mask':>6} {'1gpu_ms':>8} {'speed':>6} {'ring_ms':>8} {'tok/s':>8} {'TF/gpu':>6} "
          f"{'nocomm':>8} {'comm':>7} {'hidden':>6} {'bal':>5} {'check':>6}")


def _default_kernel(args, device) -> str:
    import torch
    from .. import explain
    cc = tuple(torch.cuda.get_device_capability(device))
    return explain(dtype=args.dtype, head_dim=args.head_dim, heads=args.heads, kv_heads=args.kv_heads, lse=True,
                   cc=cc).chosen.name + " (the registry's choice)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch = require_torch()
    dist = torch.distributed
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    causal_modes = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    rows = []
    if rank == 0:
        name = torch.cuda.get_device_name(device)
        print(f"# ring attention bench: {world} x {name}, torch {torch.__version__}, "
              f"b{args.batch} h{args.heads} kv{args.kv_heads} d{args.head_dim} {args.dtype}, "
              f"kernel {args.variant or _default_kernel(args, device)}", flush=True)
    passes = [(None, HEADER, bench_case, format_row)]
    if args.backward:
        passes.append(("# forward + backward (autograd), 1 GPU's flashkit.torch.attention against ring_attention",
                       BACKWARD_HEADER, bench_backward_case, format_backward_row))
    for title, header, case, fmt in passes:
        if rank == 0:
            print("\n".join(line for line in (title, header) if line), flush=True)
        for seqlen in (int(s) for s in args.seqlen.split(",")):
            for causal in causal_modes:
                row = case(torch, args, seqlen, causal, rank, world, device)
                rows.append(row)
                if rank == 0:
                    print(fmt(row), flush=True)
                torch.cuda.empty_cache()
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"world_size": world, "device": torch.cuda.get_device_name(device),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
