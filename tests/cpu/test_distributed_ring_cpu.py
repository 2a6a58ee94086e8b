"""The ring without GPUs: its whole schedule simulated on NumPy, the import rule (no torch at `import
flashkit`), the merge kernel's GPU-less compile, and the cross-rank check on a 2-process Gloo group
(mismatch, a bad rank, a rank that never calls: errors on every rank, never a hang)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from flashkit.distributed.simulate import simulate_ring
from flashkit.verify.reference import reference_attention

ROOT = Path(__file__).resolve().parents[2]


def _np_local(q, k, v, causal, scale):
    return reference_attention(q, k, v, scale=scale, causal=causal)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_simulated_ring_equals_full_attention(world, causal, heads, kv_heads):
    rng = np.random.default_rng(world * 10 + heads + kv_heads)
    n = 2 * world * 3
    q = rng.standard_normal((2, n, heads, 8))
    k = rng.standard_normal((2, n, kv_heads, 8))
    v = rng.standard_normal((2, n, kv_heads, 8))
    out, lse = simulate_ring(q, k, v, world, causal, 0.35, _np_local)
    ref, ref_lse = reference_attention(q, k, v, scale=0.35, causal=causal)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)


def _run(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch blocked by the test")
sys.meta_path.insert(0, _NoTorch())
"""


def test_import_flashkit_never_imports_torch():
    proc = _run(BLOCK_TORCH + """
import flashkit, flashkit.distributed
from flashkit.distributed import shard_zigzag, ring_plan
import numpy as np
assert shard_zigzag(np.arange(8), 1, 2, dim=0).tolist() == [2, 3, 4, 5]
assert "torch" not in sys.modules
try:
    flashkit.distributed.ring_attention(None, None, None)
except flashkit.distributed.TorchMissingError as e:
    assert isinstance(e, flashkit.FlashkitError) and "flashkit[torch]" in str(e), e
    print("OK")
""")
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


def test_merge_kernel_compiles_without_a_gpu():
    from flashkit.distributed.merge_kernel import MERGE_SOURCE, ENTRIES
    from flashkit.runtime.nvrtc import compile_cubin
    for arch in ("sm_80", "sm_90"):
        reports = compile_cubin(MERGE_SOURCE, "ring_merge.cu", [f"-arch={arch}", "-std=c++17",
                                                              "--ptxas-options=-v"]).reports()
        assert {r.entry for r in reports} == set(ENTRIES.values())
        assert all(r.spill_stores == 0 and r.spill_loads == 0 for r in reports), reports


def test_threads_per_row_stay_in_one_warp():
    from flashkit.distributed.merge_kernel import threads_per_row
    for d in range(8, 257, 8):
        t = threads_per_row(d)
        assert t * 8 >= d and 32 % t == 0


torch_needed = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is an optional extra (pip install 'flashkit[torch]'): the torch-side checks need it")


@torch_needed
def test_local_checks_before_any_transfer():
    import torch
    from flashkit.errors import InputError
    from flashkit.distributed import ring_attention
    from flashkit.distributed.validation import check_local
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="CUDA"):
        ring_attention(q, q, q)   # no process group: a group of one, and CPU tensors are refused
    assert check_local(q, q, q, True, "zigzag", None, None).error is not None
    call = check_local(np.zeros((1, 8, 2, 64)), q, q, False, "zigzag", None, None)
    assert "torch tensors" in str(call.error) and call.signature[0] == 1
    assert "layout" in str(check_local(q, q, q, True, "striped", None, None).error)


@torch_needed
def test_compare_signatures_names_the_ranks():
    from flashkit.distributed import RankMismatchError
    from flashkit.distributed.validation import compare_signatures
    a = (0, 1, 4096, 4096, 16, 4, 128, 2, 1, 0, 7)
    compare_signatures([a, a], 0)
    with pytest.raises(RankMismatchError, match=r"seqlen_q.*rank 0: seqlen_q=4096.*rank 1: seqlen_q=4098"):
        compare_signatures([a, (0, 1, 4098, 4098, 16, 4, 128, 2, 1, 0, 7)], 1)
    with pytest.raises(RankMismatchError, match="rank 1 rejected its inputs"):
        compare_signatures([a, (2,) + (0,) * 10], 0)


GLOO_WORKER = """
import json, sys, time, os
from datetime import timedelta
import torch, torch.distributed as dist
rank, world, store, scenario = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
from flashkit.distributed.validation import LocalCall, agree_across_ranks
from flashkit.distributed import ring_attention
from flashkit.errors import InputError
sig = (0, 1, 4096, 4096, 16, 4, 128, 2, 1, 0, 7)
result = {"rank": rank}
t0 = time.monotonic()
try:
    if scenario == "agree":
        agree_across_ranks(LocalCall(sig), None, rank, world, torch.device("cpu"), 20)
    elif scenario == "mismatch":
        s = sig if rank == 0 else (0, 1, 4098, 4098) + sig[4:]
        agree_across_ranks(LocalCall(s), None, rank, world, torch.device("cpu"), 20)
    elif scenario == "bad_rank":
        call = LocalCall((4,) + (0,) * 10, InputError("k: bad")) if rank == 1 else LocalCall(sig)
        agree_across_ranks(call, None, rank, world, torch.device("cpu"), 20)
    elif scenario == "cpu_tensors":
        q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)
        ring_attention(q, q, q, causal=True, timeout=20)
    elif scenario == "timeout":
        if rank == 0:
            agree_across_ranks(LocalCall(sig), None, rank, world, torch.device("cpu"), 2)
        else:
            time.sleep(4)
    result["raised"] = None
except Exception as e:
    result["raised"] = type(e).__name__
    result["message"] = str(e)[:300]
result["seconds"] = time.monotonic() - t0
print(json.dumps(result), flush=True)
os._exit(0)
"""


@torch_needed
@pytest.mark.parametrize("scenario,want", [
    ("agree", [None, None]),
    ("mismatch", ["RankMismatchError", "RankMismatchError"]),
    ("bad_rank", ["RankMismatchError", "InputError"]),
    ("cpu_tensors", ["InputError", "InputError"]),
    ("timeout", ["CollectiveTimeoutError", None]),
])
def test_cross_rank_check_on_gloo(tmp_path, scenario, want):
    script = tmp_path / "worker.py"
    script.write_text(GLOO_WORKER)
    store = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(store), scenario], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"{scenario}: a rank hung")
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["raised"] for o in outs] == want, outs
    if scenario == "timeout":
        assert outs[0]["seconds"] < 15


RING_LOOP_WORKER = """
import json, sys, os
from datetime import timedelta
import torch, torch.distributed as dist
rank, world, store, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
from flashkit.distributed import shard_zigzag
from flashkit.distributed.ring import ring_forward


def attend(q, k, v, causal, scale):   # float32 attention with its LSE, GQA, bottom-right causal
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), v), lse


torch.manual_seed(0)
n = 2 * world * 5
full = [torch.randn(2, n, h, 16) for h in (4, 2, 2)]
out, lse = ring_forward(*(shard_zigzag(x, rank, world) for x in full), group=None, rank=rank, world_size=world,
                        causal=causal, scale=0.3, attend=attend)
want, want_lse = attend(*full, causal, 0.3)
err = float((out - shard_zigzag(want, rank, world)).abs().max())
lse_err = float((lse - shard_zigzag(want_lse, rank, world, dim=2)).abs().max())
print(json.dumps({"rank": rank, "err": err, "lse_err": lse_err}), flush=True)
dist.destroy_process_group()
"""


@torch_needed
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_loop_on_gloo(tmp_path, world, causal):
    """The real loop (plan, double-buffered exchange, merge) over a CPU Gloo ring, a float32 local attention."""
    script = tmp_path / "ring_worker.py"
    script.write_text(RING_LOOP_WORKER)
    results = _run_ranks(script, world, tmp_path, causal)
    assert all(r["err"] < 1e-5 and r["lse_err"] < 1e-5 for r in results), results


def _run_ranks(script, world: int, tmp_path, causal: bool) -> list[dict]:
    """Run a worker script as `world` Gloo ranks; each prints one JSON line last."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NCCL_NVLS_ENABLE="0", GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(tmp_path / "store"),
                               str(int(causal))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail("a rank hung")
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


RING_BACKWARD_WORKER = RING_LOOP_WORKER.split("torch.manual_seed(0)")[0] + """
from flashkit.distributed.ring import ring_backward


def attend_backward(dout, q, k, v, out, lse, causal, scale):   # autograd through the reference, rows of the
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))    # whole softmax: P = exp(s - lse)
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(g, 2)) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.exp(s - lse[..., None])
    o = torch.einsum("bhqk,bkhd->bqhd", p, v.repeat_interleave(g, 2))
    # d/ds of the softmax with the global D = rowsum(dO * O): dS = P (dP - D)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, v.repeat_interleave(g, 2))
    d = (dout * out).sum(-1).transpose(1, 2)[..., None]
    ds = p * (dp - d) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k.repeat_interleave(g, 2))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q).unflatten(2, (k.shape[2], g)).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dout).unflatten(2, (k.shape[2], g)).sum(3)
    return dq, dk, dv


torch.manual_seed(0)
n = 2 * world * 5
full = [torch.randn(2, n, h, 16, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2)]
want, _ = attend(*full, causal, 0.3)
dout_full = torch.randn_like(want)
want.backward(dout_full)
local = [shard_zigzag(x.detach(), rank, world) for x in full]
out, lse = ring_forward(*local, group=None, rank=rank, world_size=world, causal=causal, scale=0.3, attend=attend)
grads = ring_backward(shard_zigzag(dout_full, rank, world), *local, out, lse, group=None, rank=rank,
                      world_size=world, causal=causal, scale=0.3, attend_backward=attend_backward)
errs = [float((g - shard_zigzag(x.grad, rank, world)).abs().max()) for g, x in zip(grads, full)]
print(json.dumps({"rank": rank, "errs": errs}), flush=True)
dist.destroy_process_group()
"""


@torch_needed
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_backward_on_gloo(tmp_path, world, causal):
    """ring_backward's loop (the forward's plan, K/V forward, dK/dV travelling home) over a CPU Gloo ring, against
    autograd through the full sequence (float64 inputs, GQA 4/2, zigzag shards)."""
    script = tmp_path / "ring_backward_worker.py"
    script.write_text(RING_BACKWARD_WORKER)
    results = _run_ranks(script, world, tmp_path, causal)
    # fp32: the forward's merge and the travelling dK / dV buffers accumulate in float32 (errors ~1e-7)
    assert all(max(r["errs"]) < 1e-5 for r in results), results
