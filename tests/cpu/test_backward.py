"""backward.py: attention_backward refuses bad inputs before any compile or launch; the fa2_bwd and fa3_bwd
manifests and selection (never a backward kernel for a forward call, nor the reverse; fa3_bwd on sm_90 only,
ahead of fa2_bwd there, as measured); fa3_bwd's launch on a fake H100; the reference backward."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
import flashkit.backward as backward
import flashkit.runtime.build as build
import flashkit.runtime.launch as launch_mod
from flashkit.errors import InputError, UnsupportedError
from flashkit.registry import Request, discover_kernels, select_kernel
from flashkit.runtime.device import DeviceInfo
from flashkit.runtime.launch import workspace_bytes
from flashkit.call.validate import Problem
from .synth import B, D, H, SK, SQ, cuda, qkv

FAKE_H100 = DeviceInfo(0, "Fake H100", (9, 0), 132, 227 * 1024, 13000, 13000)


@pytest.fixture
def no_launch(monkeypatch):
    """Any compile or launch fails the test; the device is a fake H100."""
    def forbid(*args, **kwargs):
        raise AssertionError("compile or launch was called: validation must come first")
    for module, name in ((build, "build_module"), (build, "compile_variant"), (launch_mod, "launch"),
                         (backward, "build_module"), (backward, "prepare_launch")):
        monkeypatch.setattr(module, name, forbid)
    monkeypatch.setattr(backward, "device_info", lambda: FAKE_H100)


def good(**over):
    q, k, v = qkv()
    args = {"dout": cuda((B, SQ, H, D)), "q": q, "k": k, "v": v, "out": cuda((B, SQ, H, D)),
            "lse": cuda((B, H, SQ), "<f4")}
    args.update(over)
    return args


@pytest.mark.parametrize("over,kw,arg", [
    ({"dout": cuda((B, SQ + 1, H, D))}, {}, "dout"),
    ({"dout": cuda((B, SQ, H, D), "<f4")}, {}, "dout"),
    ({"out": cuda((B, SQ, H, D), strides_elems=(SQ * H * D * 2, H * D * 2, D * 2, 2))}, {}, "out"),
    ({"out": None}, {}, "out"),
    ({"lse": cuda((B, SQ, H), "<f4")}, {}, "lse"),
    ({"lse": cuda((B, H, SQ))}, {}, "lse"),
    ({"lse": np.zeros((B, H, SQ), np.float32)}, {}, "lse"),
    ({"k": cuda((B, SK, 3, D)), "v": cuda((B, SK, 3, D))}, {}, "k"),
    ({}, {"causal": 1}, "causal"),
    ({}, {"deterministic": "yes"}, "deterministic"),
    ({}, {"softmax_scale": float("inf")}, "softmax_scale"),
    ({}, {"variant": 3}, "variant"),
    ({}, {"window_size": (3,)}, "window_size"),
    ({}, {"softcap": -1.0}, "softcap"),
    ({}, {"alibi_slopes": cuda((H + 1,), "<f4")}, "alibi_slopes"),
    ({}, {"attention_chunk": -2}, "attention_chunk"),
], ids=["dout-shape", "dout-dtype", "out-strided", "out-none", "lse-shape", "lse-dtype", "lse-host", "kv-heads",
        "causal", "deterministic", "scale", "variant", "window", "softcap", "alibi", "chunk"])
def test_bad_inputs_fail_before_compile_or_launch(no_launch, over, kw, arg):
    args = good(**over)
    with pytest.raises(InputError, match=rf"^{arg}: ") as e:
        flashkit.attention_backward(*args.values(), **kw)
    assert "\n" not in str(e.value)


def test_unsupported_head_dim_fails_before_launch(no_launch):
    q, k, v = qkv((B, SQ, H, 100), (B, SK, H, 100))   # no backward takes a head dim that is not a multiple of 8
    args = good(q=q, k=k, v=v, dout=cuda((B, SQ, H, 100)), out=cuda((B, SQ, H, 100)))
    with pytest.raises(UnsupportedError, match="head_dim=100"):
        flashkit.attention_backward(*args.values())


def test_fa2_bwd_manifest():
    spec = discover_kernels(refresh=True).get("fa2_bwd")
    assert spec.supports("backward") and spec.requires == {"backward": True}
    assert spec.grids == ("q_blocks", "kv_tiles", "q_blocks") and len(spec.entries) == 3
    assert spec.workspace == "dq_accum" and spec.supports("gqa") and spec.supports("causal")
    # every multiple of 8 up to 256, compiled as 64, 128, 192 or 256 (the columns past a call's head dim zero-filled)
    assert spec.head_dims.classes == (64, 128, 192, 256) and 8 in spec.head_dims and 256 in spec.head_dims
    assert 264 not in spec.head_dims and 100 not in spec.head_dims


def test_fa3_bwd_manifest():
    specs = discover_kernels(refresh=True).specs
    spec = specs["fa3_bwd"]
    assert spec.supports("backward") and spec.requires == {"backward": True}
    assert spec.arch_min == spec.arch_max == (9, 0) and spec.target((9, 0)) == "sm_90a"
    assert spec.entries == ("flashkit_fa3_bwd_prepass", "flashkit_fa3_bwd_main", "flashkit_fa3_bwd_convert_dq")
    assert spec.grids == ("q_blocks", "kv_tiles", "q_blocks") and spec.workspace == "dq_accum"
    assert spec.supports("gqa") and spec.supports("causal") and spec.head_dims.classes == (64, 128, 192, 256)
    assert all(d in spec.head_dims for d in range(8, 257, 8)) and 100 not in spec.head_dims
    # consumers split by keys, 64 each: hd128 key blocks of 128 (1 producer + 2 consumers), hd64 of 192 (+ 3)
    for hd, keys, warps in ((128, 128, 12), (64, 192, 16)):
        launch = spec.launch_config((9, 0), hd, ())
        assert launch["block_m"] == 64 and launch["block_n"] == keys and launch["warps"] == warps
        assert spec.tensor_map_rows(launch) == {"q": 64, "k": keys, "v": keys, "dout": 64}
    for hd in (192, 256):   # consumers split by head-dim columns: key blocks of 64
        launch = spec.launch_config((9, 0), hd, ())
        assert launch["block_m"] == 64 and launch["block_n"] == 64 and launch["warps"] == 12
        assert spec.tensor_map_rows(launch) == {"q": 64, "k": 64, "v": 64, "dout": 64}
    # Measured faster than fa2_bwd at both head dims (BENCHMARKS.md): it outranks fa2_bwd where both fit.
    assert spec.priority > specs["fa2_bwd"].priority


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fa3_bwd_fits_backward_calls_on_sm90_only(causal, head_dim):
    specs = discover_kernels().specs
    base = dict(dtype="bfloat16", head_dim=head_dim, seqlen_q=1000, seqlen_k=777, heads=8, kv_heads=2,
                causal=causal, backward=True)
    on_h100 = select_kernel(Request(cc=(9, 0), **base), specs)
    assert "fa3_bwd" not in on_h100.rejected and on_h100.chosen.name == "fa3_bwd"   # the sm_90 default
    varlen = select_kernel(Request(cc=(9, 0), varlen=True, **base), specs)   # fa3_bwd has no varlen build
    assert varlen.chosen.name == "fa2_bwd" and "fa3_bwd" in varlen.rejected
    assert select_kernel(Request(cc=(9, 0), **base), specs, variant="fa3_bwd").chosen.name == "fa3_bwd"
    for cc in ((8, 0), (8, 9), (10, 0)):   # wgmma and setmaxnreg: sm_90a only
        sel = select_kernel(Request(cc=cc, **base), specs)
        assert sel.chosen.name == "fa2_bwd" and "fa3_bwd" in sel.rejected
        with pytest.raises(UnsupportedError, match="fa3_bwd"):
            select_kernel(Request(cc=cc, **base), specs, variant="fa3_bwd")


@pytest.mark.parametrize("causal", [False, True])
def test_hd256_backward_is_fa3_bwd_on_sm90_and_fa2_bwd_elsewhere(causal):
    """At head dim 256 fa3_bwd on sm_90, fa2_bwd on sm_80 (Q and dO single-buffered) and on sm_86 / sm_89 / sm_120's
    99 KB a block (32-key blocks, V's fragments in registers)."""
    specs = discover_kernels().specs
    base = dict(dtype="float16", head_dim=256, seqlen_q=333, seqlen_k=1000, heads=8, kv_heads=8, causal=causal,
                backward=True)
    assert select_kernel(Request(cc=(9, 0), **base), specs).chosen.name == "fa3_bwd"
    for cc in ((8, 0), (8, 6), (8, 9), (12, 0)):
        assert select_kernel(Request(cc=cc, **base), specs).chosen.name == "fa2_bwd"


def test_fa3_bwd_refuses_forward_calls_and_other_head_dims():
    specs = discover_kernels().specs
    base = dict(dtype="bfloat16", seqlen_q=1000, seqlen_k=1000, heads=8, kv_heads=8, cc=(9, 0))
    assert "fa3_bwd" in select_kernel(Request(head_dim=128, **base), specs).rejected
    assert any("head_dim=100" in r for r in reasons_of(specs["fa3_bwd"], Request(head_dim=100, backward=True, **base)))


def reasons_of(spec, request):
    from flashkit.registry.select import reasons
    return reasons(spec, request)


def fa3_bwd_launches(monkeypatch, b, sq, sk, h, hk, d, **kw):
    """attention_backward(variant="fa3_bwd") on a fake H100 (tests/cpu/runtime/fake_device.py): the recorded
    launches (name, grid, block, ..., tensor maps) and the q, k, v, dout arrays."""
    pytest.importorskip("cupy")
    from .runtime.fake_device import Recorder, fake, installed
    with installed(monkeypatch.setattr):
        monkeypatch.setattr(backward, "device_info", lambda: FAKE_H100)
        monkeypatch.setattr(backward, "build_module", lambda spec, config, cc: build.LoadedKernel(
            [Recorder(e) for e in spec.entries], 1024))
        q, k, v = fake((b, sq, h, d)), fake((b, sk, hk, d)), fake((b, sk, hk, d))
        dout, out, lse = fake((b, sq, h, d)), fake((b, sq, h, d)), fake((b, h, sq), np.float32)
        flashkit.attention_backward(dout, q, k, v, out, lse, variant="fa3_bwd", **kw)
        return list(Recorder.launches), (q, k, v, dout)


def test_fa3_bwd_launches_three_entries_with_the_dout_map(monkeypatch):
    """Prepass, main, convert_dq, each with Params and the tensor maps of q, k, v and dout (the fake encoder
    writes a map's address into its first word)."""
    b, sq, sk, h, hk, d = 2, 1000, 300, 8, 2, 128
    launches, (q, k, v, dout) = fa3_bwd_launches(monkeypatch, b, sq, sk, h, hk, d, causal=True)
    assert [name for name, *_ in launches] == ["flashkit_fa3_bwd_prepass", "flashkit_fa3_bwd_main",
                                               "flashkit_fa3_bwd_convert_dq"]
    assert [grid for _, grid, *_ in launches] == [(16, h, b), (3, hk, b), (16, h, b)]
    assert all(block == (384, 1, 1) for _, _, block, *_ in launches)
    for *_, maps in launches:
        addresses = [int.from_bytes(m[:8], "little") for m in maps]
        assert addresses == [q.data.ptr, k.data.ptr, v.data.ptr, dout.data.ptr]


def test_fa3_bwd_hd256_launches_key_blocks_of_64(monkeypatch):
    """hd256: the main kernel's grid walks key blocks of 64 (the consumers split the head-dim columns)."""
    b, sq, sk, h, hk, d = 1, 200, 300, 4, 4, 256
    launches, _ = fa3_bwd_launches(monkeypatch, b, sq, sk, h, hk, d)
    assert [grid for _, grid, *_ in launches] == [(4, h, b), (5, hk, b), (4, h, b)]


def test_fa3_bwd_hd64_launches_three_consumers_on_key_blocks_of_192(monkeypatch):
    """hd64: key blocks of 192 keys, one producer and three consumer warpgroups (512 threads) a CTA."""
    b, sq, sk, h, hk, d = 2, 500, 385, 8, 8, 64
    launches, _ = fa3_bwd_launches(monkeypatch, b, sq, sk, h, hk, d)
    assert [grid for _, grid, *_ in launches] == [(8, h, b), (3, hk, b), (8, h, b)]
    assert all(block == (512, 1, 1) for _, _, block, *_ in launches)


@pytest.mark.parametrize("causal,group", [(True, 16), (False, 1)])
def test_fa3_bwd_main_takes_the_hosts_key_block_order(monkeypatch, causal, group):
    """Issue 12's training shape (hd64, GQA 16 / 4, 8 x 2048): causal key blocks heaviest first in groups of 16
    (batch, kv head) pairs (runtime/bwd_order.py's schedule on 132 SMs); without causal the launch order."""
    from flashkit.runtime.params import FIELD_OFFSETS
    launches, _ = fa3_bwd_launches(monkeypatch, 8, 2048, 2048, 16, 4, 64, causal=causal)
    off = FIELD_OFFSETS["bwd.order_pairs"]
    assert [int.from_bytes(params[off:off + 4], "little") for _, _, _, params, _ in launches] == [group] * 3


@pytest.mark.parametrize("causal", [False, True])
def test_selection_keeps_forward_and_backward_apart(causal):
    specs = discover_kernels().specs
    base = dict(dtype="bfloat16", head_dim=128, seqlen_q=1000, seqlen_k=1000, heads=8, kv_heads=1,
                causal=causal, cc=(9, 0))
    bwd = select_kernel(Request(backward=True, **base), specs)
    assert bwd.chosen.name == "fa3_bwd"   # sm_90
    assert all(s.supports("backward") for n, s in specs.items() if n not in bwd.rejected)
    fwd = select_kernel(Request(**base), specs)
    assert not fwd.chosen.supports("backward")
    assert "fa2_bwd" in fwd.rejected and "fa3_bwd" in fwd.rejected
    with pytest.raises(UnsupportedError, match="fa2_bwd"):
        select_kernel(Request(**base), specs, variant="fa2_bwd")
    with pytest.raises(UnsupportedError, match="backward pass not supported"):
        select_kernel(Request(backward=True, **base), specs, variant="fa2")


def test_a_backward_feature_without_requires_still_stays_out_of_forward_calls(tmp_path):
    from .synth import spec_of
    spec = spec_of(tmp_path, "bwd_only", features={"causal": True, "backward": True, "gqa": True})
    why = flashkit.registry.select.reasons(spec, Request(dtype="float16", head_dim=64, cc=(8, 0)))
    assert why == ["a backward kernel: serves attention_backward only"]


def test_dq_accum_workspace_size():
    p = Problem(batch=2, seqlen_q=100, seqlen_k=7, heads=3, kv_heads=1, head_dim=64, dtype="float16",
                softmax_scale=0.125)
    rows = 2 * 3 * 128   # seqlen_q padded to two blocks of 64
    assert workspace_bytes("dq_accum", p, {"block_m": 64}) == (rows * (64 + 2) + 2 * 3 * 2) * 4


@pytest.mark.parametrize("causal,mods", [
    (False, {}), (True, {}), (False, {"softcap": 0.7}), (True, {"alibi_slopes": np.array([0.5, 0.25, 1.0, 2.0])}),
    (False, {"softcap": 1.1, "alibi_slopes": np.array([[0.5, 0.3, 0.2, 0.1]]), "mask": "window"})])
def test_reference_backward_matches_finite_differences(causal, mods):
    """The float64 gradients, softcap's slope and ALiBi's bias and a window included, against central differences
    of the forward reference with the same modification."""
    from flashkit.verify.reference import local_mask, reference_attention
    from flashkit.verify.reference_backward import reference_backward
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 5, 4, 8))
    k = rng.standard_normal((1, 3, 2, 8))
    v = rng.standard_normal((1, 3, 2, 8))
    dout = rng.standard_normal((1, 5, 4, 8))
    kw = dict(mods, scale=0.3, causal=causal)
    if kw.get("mask") == "window":
        kw["mask"] = local_mask(5, 3, (1, 0))
    grads = reference_backward(q, k, v, dout, **kw)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        idx = (0, 1, 1, 2)
        x[idx] += eps
        up = float((reference_attention(q, k, v, **kw)[0] * dout).sum())
        x[idx] -= 2 * eps
        down = float((reference_attention(q, k, v, **kw)[0] * dout).sum())
        x[idx] += eps
        assert abs((up - down) / (2 * eps) - g[idx]) < 1e-6


# attention_varlen_backward: packed (total, heads, D) arrays, int32 cu_seqlens, checked like the forward.
TQ, TK, NSEQ = 40, 70, 3


def good_varlen(**over):
    args = {"dout": cuda((TQ, H, D)), "q": cuda((TQ, H, D)), "k": cuda((TK, H, D)), "v": cuda((TK, H, D)),
            "out": cuda((TQ, H, D)), "lse": cuda((H, TQ), "<f4"), "cu_seqlens_q": cuda((NSEQ + 1,), "<i4"),
            "cu_seqlens_k": cuda((NSEQ + 1,), "<i4"), "max_seqlen_q": 20, "max_seqlen_k": 30}
    args.update(over)
    return args


@pytest.mark.parametrize("over,kw,arg", [
    ({"dout": cuda((TQ + 1, H, D))}, {}, "dout"),
    ({"dout": cuda((TQ, H, D), "<f4")}, {}, "dout"),
    ({"out": cuda((TQ, H, D), strides_elems=(H * D * 2, D * 2, 2))}, {}, "out"),
    ({"lse": cuda((1, H, TQ), "<f4")}, {}, "lse"),
    ({"lse": cuda((TQ, H), "<f4")}, {}, "lse"),
    ({"lse": cuda((H, TQ))}, {}, "lse"),
    ({"lse": np.zeros((H, TQ), np.float32)}, {}, "lse"),
    ({"q": cuda((1, TQ, H, D))}, {}, "q"),
    ({"k": cuda((TK, 3, D)), "v": cuda((TK, 3, D))}, {}, "k"),
    ({"cu_seqlens_q": cuda((NSEQ + 1,), "<f4")}, {}, "cu_seqlens_q"),
    ({"cu_seqlens_k": cuda((NSEQ + 2,), "<i4")}, {}, "cu_seqlens_k"),
    ({"cu_seqlens_q": np.zeros(NSEQ + 1, np.int32)}, {}, "cu_seqlens_q"),
    ({"max_seqlen_q": -1}, {}, "max_seqlen_q"),
    ({"max_seqlen_k": 2.5}, {}, "max_seqlen_k"),
    ({}, {"causal": 1}, "causal"),
    ({}, {"deterministic": "yes"}, "deterministic"),
    ({}, {"check_indices": None}, "check_indices"),
    ({}, {"softmax_scale": float("nan")}, "softmax_scale"),
    ({}, {"variant": 3}, "variant"),
], ids=["dout-shape", "dout-dtype", "out-strided", "lse-dense", "lse-transposed", "lse-dtype", "lse-host", "q-rank",
        "kv-heads", "cu-dtype", "cu-k-len", "cu-host", "max-q", "max-k", "causal", "deterministic", "check-indices",
        "scale", "variant"])
def test_varlen_bad_inputs_fail_before_compile_or_launch(no_launch, over, kw, arg):
    args = good_varlen(**over)
    with pytest.raises(InputError, match=rf"^{arg}: ") as e:
        flashkit.attention_varlen_backward(*args.values(), **kw)
    assert "\n" not in str(e.value)


def test_varlen_unsupported_head_dim_fails_before_launch(no_launch):
    args = good_varlen(**{n: cuda((TQ, H, 100)) for n in ("dout", "q", "out")},
                       **{n: cuda((TK, H, 100)) for n in ("k", "v")})
    with pytest.raises(UnsupportedError, match="head_dim=100"):
        flashkit.attention_varlen_backward(*args.values())


def test_varlen_head_dim_v_wants_dout_and_out_of_v_s_head_dim(no_launch):
    """v narrower than q (head_dim_v): dout and out must be (total_q, heads, head_dim_v); q's shape is an InputError
    naming the argument, before any compile or launch."""
    for name in ("dout", "out"):
        args = good_varlen(v=cuda((TK, H, 32)), **{n: cuda((TQ, H, 32)) for n in ("dout", "out") if n != name})
        with pytest.raises(InputError, match=rf"^{name}: expected q's shape with v's head dim \(head_dim_v\) last "
                                             rf"\({TQ}, {H}, 32\)") as e:
            flashkit.attention_varlen_backward(*args.values())
        assert "\n" not in str(e.value)


def test_fa2_bwd_declares_varlen_and_its_builds_define_it():
    spec = discover_kernels(refresh=True).get("fa2_bwd")
    assert spec.supports("varlen")
    cfg = build.make_config(spec, "bfloat16", 128, True, (9, 0), mods=("varlen",))
    assert "-DFLASHKIT_VARLEN=1" in cfg.defines() and "varlen" in cfg.describe()
    assert cfg.launch_dict == build.make_config(spec, "bfloat16", 128, True, (9, 0)).launch_dict


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
def test_varlen_backward_selects_fa2_bwd_and_no_forward_kernel(causal, kv_heads):
    specs = discover_kernels().specs
    base = dict(dtype="float16", head_dim=64, seqlen_q=129, seqlen_k=65, heads=8, kv_heads=kv_heads,
                causal=causal, varlen=True, cc=(8, 0))
    sel = select_kernel(Request(backward=True, **base), specs)
    assert sel.chosen.name == "fa2_bwd"
    assert all(s.supports("backward") for n, s in specs.items() if n not in sel.rejected)
    assert "fa2_bwd" in select_kernel(Request(**base), specs).rejected


@pytest.mark.parametrize("mod", ["window", "softcap", "alibi"])
def test_varlen_backward_modifications_run_on_fa2_bwd(mod):
    sel = select_kernel(Request(dtype="float16", head_dim=64, backward=True, varlen=True, cc=(9, 0), **{mod: True}),
                        discover_kernels().specs)
    assert sel.chosen.name == "fa2_bwd"


@pytest.mark.parametrize("cc,head_dim,flags,chosen", [
    ((9, 0), 128, {"window": True, "softcap": True, "alibi": True}, "fa3_bwd"),
    ((9, 0), 256, {"softcap": True}, "fa3_bwd"),
    ((8, 0), 128, {"window": True, "softcap": True}, "fa2_bwd"),
    ((9, 0), 128, {"window": True, "chunk": True}, "fa2_bwd"),   # fa3_bwd's window test has no chunks
])
def test_backward_modifications_select(cc, head_dim, flags, chosen):
    sel = select_kernel(Request(dtype="bfloat16", head_dim=head_dim, backward=True, cc=cc, **flags),
                        discover_kernels().specs)
    assert sel.chosen.name == chosen
    if flags.get("chunk"):
        assert "attention_chunk not supported" in sel.rejected["fa3_bwd"]


def test_a_chunked_backward_runs_fa2_bwd_at_every_head_dim_on_every_architecture():
    specs = discover_kernels().specs
    for cc in ((8, 0), (8, 9), (9, 0), (12, 0)):
        sel = select_kernel(Request(dtype="bfloat16", head_dim=256, backward=True, cc=cc, window=True, chunk=True),
                            specs)
        assert sel.chosen.name == "fa2_bwd"


@pytest.mark.parametrize("mods,block_n,warps", [((), 192, 16), (("window",), 192, 16), (("softcap",), 192, 16),
                                                (("window", "softcap"), 192, 16), (("alibi",), 192, 16),
                                                (("softcap", "alibi"), 128, 12), (("window", "alibi"), 192, 16),
                                                (("window", "softcap", "alibi"), 128, 12),
                                                (("score_mod", "score_mod_bias"), 192, 16),
                                                (("score_mod", "score_mod_grad"), 128, 12), (("mask_mod",), 128, 12)])
def test_fa3_bwd_hd64_consumers_by_modification(mods, block_n, warps):
    """hd64: three consumers of 160 registers, with a window, softcap, ALiBi (beside a window too) or a score_mod
    functor that is a bias; two of 240 with ALiBi beside softcap (three spill), a score_mod functor's slopes taken at
    the recompute (three spill) or a mask_mod (its lists)."""
    launch = discover_kernels().get("fa3_bwd").launch_config((9, 0), 64, mods)
    assert (launch["block_n"], launch["warps"]) == (block_n, warps)


@pytest.mark.parametrize("causal", [False, True])
def test_fa3_bwd_hd128_modifications_run_128_key_blocks(causal):
    """hd128: every modification and a mask_mod on the dense tiles (128-key blocks, two consumers); a non-causal
    mask_mod's element mask from the producer warpgroup's warps (mask_warps), a causal one's from the consumers."""
    spec = discover_kernels().get("fa3_bwd")
    for mods in (("softcap",), ("alibi", "softcap"), ("window", "softcap", "alibi"), ("score_mod",), ("mask_mod",)):
        assert spec.launch_config((9, 0), 128, mods, causal=causal)["block_n"] == 128
    assert spec.launch_config((9, 0), 128, ("mask_mod",), causal=causal)["mask_warps"] == (0 if causal else 1)
    assert spec.launch_config((9, 0), 128, ("block_sparse",), causal=causal).get("mask_warps", 0) == 0
    for hd in (64, 256):
        assert spec.launch_config((9, 0), hd, ("mask_mod",), causal=causal).get("mask_warps", 0) == 0


def test_varlen_compile_matrix_includes_the_backward_varlen_builds():
    from flashkit.verify.compile_matrix import spec_configs
    spec = discover_kernels().get("fa2_bwd")
    configs = spec_configs(spec, (8, 0))
    varlen = [c for c in configs if "varlen" in c.mods and not c.head_dim_v]
    exact = [c for c in configs if not c.mods and not c.head_dim_padded and not c.block_sparse and not c.head_dim_v]
    assert len(varlen) == len(exact) == len(spec.dtypes) * len(spec.head_dims.classes) * 2   # dtypes x classes x causal
    # padded head dims (one below each class): the first dtype, dense (varlen ones compile on demand)
    assert {c.dtype for c in configs if c.head_dim_padded} == {spec.dtypes[0]}


def test_varlen_backward_matrix_covers_the_edges():
    from flashkit.verify.backward import VARLEN_CASES
    lens = {n for c in VARLEN_CASES for n in c.lens_q + c.keys}
    assert {0, 1, 17, 63, 64, 65, 127, 128, 129} <= lens
    assert any(c.lens_k is not None and c.lens_k != c.lens_q for c in VARLEN_CASES)
    assert {c.kv_heads == 1 for c in VARLEN_CASES} == {True, False}            # MQA and not
    assert any(1 < c.kv_heads < c.heads for c in VARLEN_CASES)                  # GQA
    assert any(nq == 0 < nk for c in VARLEN_CASES for nq, nk in zip(c.lens_q, c.keys))   # keys, no query
    assert any(nk == 0 < nq for c in VARLEN_CASES for nq, nk in zip(c.lens_q, c.keys))   # queries, no key


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_reference_is_each_sequence_alone(causal):
    """verify's packed reference: sequence b's rows are reference_backward of sequence b alone; an empty side
    gives zeros."""
    from flashkit.verify.backward import VarlenBackwardCase, _per_sequence
    from flashkit.verify.reference_backward import reference_backward
    case = VarlenBackwardCase("t", (3, 0, 5, 2), (4, 6, 2, 0), heads=4, kv_heads=2)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((10, 4, 8))
    k, v = rng.standard_normal((12, 2, 8)), rng.standard_normal((12, 2, 8))
    dout = rng.standard_normal((10, 4, 8))
    cu_q, cu_k = np.array([0, 3, 3, 8, 10]), np.array([0, 4, 10, 12, 12])
    refs, plains = _per_sequence(case, q, k, v, dout, 8, causal, "float16", cu_q, cu_k)
    assert [r.shape for r in refs] == [q.shape, k.shape, v.shape] == [p.shape for p in plains]
    alone = reference_backward(q[None, 3:8], k[None, 10:12], v[None, 10:12], dout[None, 3:8], scale=8 ** -0.5,
                               causal=causal)
    assert np.array_equal(refs[0][3:8], alone[0][0]) and np.array_equal(refs[1][10:12], alone[1][0])
    assert not refs[1][4:10].any() and not refs[2][4:10].any()   # keys of a sequence without queries
    assert not refs[0][8:10].any()                               # queries of a sequence without keys
    assert np.abs(plains[0] - refs[0]).max() < 0.05


# ---- the call cache: a repeated dense signature skips validation and selection -------------------------------

@pytest.fixture
def fake_h100(monkeypatch):
    """A fake H100 under the whole path (tests/cpu/runtime/fake_device.py) and counts of validation and selection."""
    pytest.importorskip("cupy")
    from .runtime.fake_device import counting, installed
    counts = {"validate": 0, "select": 0}
    with installed(monkeypatch.setattr):
        monkeypatch.setattr(backward, "validate_inputs", counting(counts, "validate", backward.validate_inputs))
        monkeypatch.setattr(backward, "select_kernel", counting(counts, "select", backward.select_kernel))
        yield counts


def bwd_arrays(b=2, sq=300, sk=200, h=4, hk=2, d=64):
    """dout, q, k, v, out, lse of one backward call, over fresh fake addresses."""
    from .runtime.fake_device import fake
    return (fake((b, sq, h, d)), fake((b, sq, h, d)), fake((b, sk, hk, d)), fake((b, sk, hk, d)),
            fake((b, sq, h, d)), fake((b, h, sq), np.float32))


def gradient_words_masked(params: bytes) -> bytes:
    """A recorded parameter block with Params.bwd's dq, dk, dv words zeroed (fresh arrays every call)."""
    from flashkit.runtime.params import FIELD_OFFSETS
    out = bytearray(params)
    for name in ("bwd.dq", "bwd.dk", "bwd.dv"):
        off = FIELD_OFFSETS[name]
        out[off:off + 8] = bytes(8)
    return bytes(out)


def pointer_at(params: bytes, name: str) -> int:
    from flashkit.runtime.params import FIELD_OFFSETS
    off = FIELD_OFFSETS[name]
    return int.from_bytes(params[off:off + 8], "little")


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"causal": True, "deterministic": True},
                                {"window_size": (64, 0), "softcap": 30.0}])
def test_backward_repeat_takes_the_cached_path_and_launches_what_the_full_path_launches(fake_h100, kw):
    """The second call of a signature is a look-up; on new arrays it launches, bit for bit, the block and tensor maps
    the full path builds for them (dout's map follows the new dout), its gradients fresh arrays."""
    from flashkit.runtime import call_cache
    from .runtime.fake_device import Recorder
    first = bwd_arrays()
    grads1 = flashkit.attention_backward(*first, **kw)
    assert fake_h100 == {"validate": 1, "select": 1} and len(call_cache.CALLS) == 1
    second = bwd_arrays()
    Recorder.launches = []
    grads2 = flashkit.attention_backward(*second, **kw)
    assert fake_h100 == {"validate": 1, "select": 1}                     # a dictionary look-up, no validation
    cached = list(Recorder.launches)
    assert [g.shape for g in grads2] == [g.shape for g in grads1] == [x.shape for x in second[1:4]]
    assert len({g.data.ptr for g in grads1 + grads2}) == 6
    params = cached[0][3]
    dout = second[0]
    assert [pointer_at(params, n) for n in ("bwd.dout", "bwd.dq", "bwd.dk", "bwd.dv")] == \
        [dout.data.ptr] + [g.data.ptr for g in grads2]
    call_cache.invalidate()                                              # the full path on the same arrays
    Recorder.launches = []
    flashkit.attention_backward(*second, **kw)
    assert fake_h100 == {"validate": 2, "select": 2}
    assert [(n, g, b, gradient_words_masked(p), m) for n, g, b, p, m in cached] == \
        [(n, g, b, gradient_words_masked(p), m) for n, g, b, p, m in Recorder.launches]
    maps = [int.from_bytes(m[:8], "little") for m in cached[1][4]]      # the fake encoder's address word
    assert maps == [x.data.ptr for x in (second[1], second[2], second[3], dout)]


def test_backward_alibi_calls_put_each_calls_slopes_in(fake_h100):
    from .runtime.fake_device import Recorder, fake
    arrays = bwd_arrays()
    for _ in range(3):
        slopes = fake((4,), np.float32)
        Recorder.launches = []
        flashkit.attention_backward(*arrays, causal=True, alibi_slopes=slopes)
        assert {pointer_at(p, "mods.alibi_slopes") for _, _, _, p, _ in Recorder.launches} == {slopes.data.ptr}
    assert fake_h100 == {"validate": 1, "select": 1}


@pytest.mark.parametrize("arrays,kw,message", [
    ({"lse": ((2, 4, 300), np.float16)}, {}, "lse: expected dtype float32"),
    ({"dout": ((2, 301, 4, 64), None)}, {}, "dout: expected q's shape"),
    ({}, {"causal": 1}, "causal: expected True or False"),
    ({}, {"softmax_scale": float("nan")}, "softmax_scale"),
    ({}, {"window_size": (True, 0)}, "window_size"),
])
def test_backward_bad_input_next_to_a_cached_signature_still_raises(fake_h100, arrays, kw, message):
    """arrays: the call's bad arrays as (shape, dtype or None for bf16), made on the fake device."""
    from .runtime.fake_device import BF16, Recorder, fake
    dout, q, k, v, out, lse = bwd_arrays()
    for good_kw in ({}, {"causal": True}, {"softmax_scale": 1.0}, {"window_size": (1, 0)}):
        flashkit.attention_backward(dout, q, k, v, out, lse, **good_kw)
    launches = len(Recorder.launches)
    args = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    args.update({name: fake(shape, dtype or BF16) for name, (shape, dtype) in arrays.items()})
    for _ in range(2):
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            flashkit.attention_backward(*args.values(), **kw)
    assert len(Recorder.launches) == launches                            # nothing launched


def test_backward_misaligned_calls_are_not_cached(fake_h100, monkeypatch):
    """A misaligned array runs on an aligned copy made per call: not repeatable by pointers alone (a modified call
    with a negative scale, run on a per-call -q, returns no launch to cache either: _launch_backward)."""
    from flashkit.runtime import call_cache
    from .runtime.fake_device import fake
    monkeypatch.setattr(backward, "_aligned", lambda a: fake(a.shape, a.dtype) if a.data.ptr % 16 else a)
    dout, q, k, v, out, lse = bwd_arrays()
    odd = fake(q.shape, offset=2)
    for _ in range(2):
        flashkit.attention_backward(dout, odd, k, v, out, lse)
    assert fake_h100["select"] == 2 and len(call_cache.CALLS) == 0
    flashkit.attention_backward(dout, q, k, v, out, lse)
    assert len(call_cache.CALLS) == 1


@pytest.mark.parametrize("cc,chosen", [((8, 0), "fa2_bwd"), ((8, 9), "fa2_bwd"), ((9, 0), "fa3_bwd")])
def test_a_block_mask_backward_walks_visit_lists_on_every_architecture(cc, chosen):
    """fa2_bwd walks a block mask's visit lists too (bwd_visits.cuh), so a block-sparse backward runs off Hopper; its
    build adds the list compactions (runtime AUX_ENTRIES), as fa3_bwd's does."""
    from flashkit.runtime.build import aux_entries, make_config
    specs = discover_kernels().specs
    sel = select_kernel(Request(dtype="bfloat16", head_dim=128, seqlen_q=1000, seqlen_k=1000, heads=8, kv_heads=2,
                                cc=cc, backward=True, block_sparse=True), specs)
    assert sel.chosen.name == chosen
    config = make_config(sel.chosen, "bfloat16", 128, False, cc, block_sparse=True)
    assert aux_entries(sel.chosen, config) == ("flashkit_bwd_list_columns", "flashkit_bwd_list_ranks")
