"""head_dim_v (v and the output narrower than q and k; DeepSeek's MLA: 192 / 128) without a GPU: validation before
the device, selection and its reasons, explain, the backward's selection and build (V at q / k's class), the build's
defines and cache keys, the float64 reference and gradients, verify's checks, and the NVRTC compile of the new
specializations (no spills)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import flashkit
import flashkit.api as api
import flashkit.backward as backward
import flashkit.runtime.build as build
import flashkit.runtime.launch as launch_mod
from flashkit.call.arrays import describe
from flashkit.call.dtypes import BY_NAME
from flashkit.call.validate import Problem, validate_inputs
from flashkit.cli import cli
from flashkit.errors import InputError, UnsupportedError
from flashkit.registry import Request, discover_kernels, select_kernel
from flashkit.registry.select import check_head_dim_v, reasons
from flashkit.runtime.build import cache_key, compile_variant, make_config
from flashkit.runtime.device import DeviceInfo
from flashkit.runtime.params import make_params
from flashkit.verify import checks_for
from flashkit.verify.compile_matrix import spec_configs
from flashkit.verify.reference import plain_attention, reference_attention
from .synth import cuda, input_error

H100 = DeviceInfo(0, "Fake H100", (9, 0), 132, 227 * 1024, 13000, 13000)
A100 = DeviceInfo(0, "Fake A100", (8, 0), 108, 163 * 1024, 12000, 12000)
B, SQ, SK, H, HK = 2, 17, 33, 8, 2
TAKERS = {"fa2", "causal", "fa3"}
BACKWARD_TAKERS = {"fa2_bwd", "fa3_bwd"}
FA3_V_DIMS = "multiples of 8 from 8 to 256 (compiled as 64, 96, 128, 192, 256)"   # fa3's head_dim_v <= head_dim


def mla(d=192, dv=128, typestr="<f2", kv_heads=HK):
    return cuda((B, SQ, H, d), typestr), cuda((B, SK, kv_heads, d), typestr), cuda((B, SK, kv_heads, dv), typestr)


class Stop(Exception):
    pass


@pytest.fixture
def no_device(monkeypatch):
    """Reaching the device, the compiler or a launch fails the test."""
    def forbid(*a, **k):
        raise AssertionError("validation must finish before the device, the compiler or a launch is touched")
    for name in ("device_info", "build_module", "launch", "run", "to_cupy", "cupy_module"):
        monkeypatch.setattr(api, name, forbid)
    for module, name in ((build, "build_module"), (build, "compile_variant"), (launch_mod, "launch")):
        monkeypatch.setattr(module, name, forbid)


def selected(monkeypatch, device, *arrays, **kw):
    """The Selection attention() makes for the arrays on a fake device (stopped before anything is built)."""
    seen = []
    real = api.select_kernel

    def spy(req, specs, variant=None):
        seen.append(real(req, specs, variant))
        raise Stop
    monkeypatch.setattr(api, "device_info", lambda *a: device)
    monkeypatch.setattr(api, "select_kernel", spy)
    with pytest.raises(Stop):
        flashkit.attention(*arrays, **kw)
    return seen[0]


# --- validation -------------------------------------------------------------------------------------------

def test_problem_carries_v_head_dim():
    q, k, v = mla()
    p = validate_inputs(describe(q, "q"), describe(k, "k"), describe(v, "v"))
    assert (p.head_dim, p.head_dim_v, p.softmax_scale) == (192, 128, pytest.approx(192 ** -0.5))   # scale: q's
    same = Problem(B, SQ, SK, H, HK, 64, "float16", 0.125)
    assert same.head_dim_v == 64 and same == Problem(B, SQ, SK, H, HK, 64, "float16", 0.125, 64)


@pytest.mark.parametrize("dv,detail", [
    (256, ("head_dim_v=256 (v's last dim) with head_dim=192 is not supported by any kernel (causal takes "
           "head_dim_v <= head_dim, multiples of 8 from 8 to 256")),
    (100, "multiples of 8"), (4, "head_dim_v=4"),
])
def test_unsupported_v_head_dim_is_one_input_error_before_the_device(no_device, dv, detail):
    msg = input_error(flashkit.attention, *mla(dv=dv))
    assert msg.startswith("v: ") and detail in msg, msg


def test_v_of_other_batch_seqlen_or_heads_is_still_refused(no_device):
    q, k, _ = mla()
    for shape in ((B, SK + 1, HK, 128), (B, SK, HK + 1, 128), (B + 1, SK, HK, 128)):
        assert "v: expected the shape of k" in input_error(flashkit.attention, q, k, cuda(shape))


def test_check_head_dim_v_names_each_taker():
    specs = discover_kernels().specs
    check_head_dim_v(192, 128, specs)
    check_head_dim_v(64, 64, {})   # equal head dims need no taker
    with pytest.raises(InputError, match=r"^v: head_dim_v=128 .*no variant declares head_dim_v"):
        check_head_dim_v(192, 128, {n: s for n, s in specs.items() if n not in TAKERS})
    check_head_dim_v(192, 128, specs, backward=True)
    with pytest.raises(InputError, match=r"^v: head_dim_v=128 .*no variant declares head_dim_v"):
        check_head_dim_v(192, 128, {n: s for n, s in specs.items() if n not in BACKWARD_TAKERS}, backward=True)


def test_varlen_refuses_an_unsupported_v_head_dim_before_the_device(no_device):
    q, k, v = cuda((40, H, 64)), cuda((50, HK, 64)), cuda((50, HK, 72))
    cu = cuda((3,), "<i4")
    msg = input_error(flashkit.attention_varlen, q, k, v, cu, cu, 20, 30)
    assert msg.startswith("v: head_dim_v=72") and "head_dim=64" in msg


# --- selection and explain --------------------------------------------------------------------------------

def test_the_fa2_family_fa3_and_the_backward_declare_head_dim_v():
    specs = discover_kernels().specs
    assert {n for n, s in specs.items() if s.supports("head_dim_v")} == TAKERS | BACKWARD_TAKERS
    for name in ("hopper", "fp8", "fa3_fp8", "block_sparse", "block_sparse_hopper", "decode", "standard",
                 "fa1"):
        assert not specs[name].supports("head_dim_v"), name


@pytest.mark.parametrize("device,causal,chosen", [(H100, False, "fa3"), (H100, True, "fa3"), (A100, False, "fa2"),
                                                  (A100, True, "causal")], ids=["sm90", "sm90-causal", "sm80",
                                                                                "sm80-causal"])
def test_mla_call_selects_fa3_on_sm90_and_the_fa2_family_elsewhere(monkeypatch, device, causal, chosen):
    sel = selected(monkeypatch, device, *mla(), causal=causal, return_lse=True)
    assert sel.chosen.name == chosen
    assert sel.request.head_dim_v == 128 and "head_dim_v=128" in sel.request.summary()
    assert "head_dim_v != head_dim (v's head dim differing from q's and k's) not supported" in sel.rejected["standard"]
    assert not [r for name in TAKERS for r in sel.rejected.get(name, []) if "head_dim_v" in r]


@pytest.mark.parametrize("d,dv", [(192, 128), (96, 64), (128, 64), (128, 96), (256, 128), (256, 192), (256, 64)])
def test_fa3_takes_every_smaller_head_dim_of_its_own(monkeypatch, d, dv):
    sel = selected(monkeypatch, H100, *mla(d, dv), causal=True)
    assert sel.chosen.name == "fa3"


@pytest.mark.parametrize("d,dv", [(192, 120), (200, 136), (136, 72), (96, 40), (80, 8)])
def test_fa3_takes_other_pairs_at_its_classes(d, dv):
    """fa3 compiles head-dim classes: any pair runs at q's and v's classes, the columns past the call's zero-filled by
    TMA's out-of-bounds fill and left unstored by its clipped O store."""
    sel = flashkit.explain(dtype="bfloat16", head_dim=d, head_dim_v=dv, cc=(9, 0))
    assert sel.chosen.name == "fa3"
    spec = discover_kernels().get("fa3")
    config = make_config(spec, "bfloat16", d, False, (9, 0), head_dim_v=dv)
    assert (config.head_dim, config.head_dim_v) == (spec.head_dims.class_of(d), spec.head_dims.class_of(dv))


def test_fa3_refuses_a_wider_v():
    with pytest.raises(UnsupportedError) as e:
        select_kernel(Request("bfloat16", 128, head_dim_v=192, cc=(9, 0)), discover_kernels().specs, variant="fa3")
    assert "head_dim_v=192 not supported with head_dim=128" in str(e.value)


def test_equal_head_dims_select_as_before(monkeypatch):
    sel = selected(monkeypatch, H100, *mla(dv=192))
    before = select_kernel(Request("float16", 192, SQ, SK, H, HK, B, cc=(9, 0)), discover_kernels().specs)
    assert sel.request.head_dim_v is None and sel.chosen.name == before.chosen.name


def test_forcing_a_kernel_without_head_dim_v_is_one_unsupported_error(monkeypatch):
    monkeypatch.setattr(api, "device_info", lambda *a: H100)
    for variant in ("standard", "hopper"):
        with pytest.raises(UnsupportedError) as e:
            flashkit.attention(*mla(), variant=variant)
        msg = str(e.value)
        assert "\n" not in msg and f"variant {variant!r} cannot run" in msg and "head_dim_v != head_dim" in msg, msg


def test_block_mask_and_fp8_calls_find_no_kernel():
    specs = discover_kernels().specs
    for flags in ({"block_sparse": True}, {"fp8": True, "dtype": "float8_e4m3"}):
        req = Request(**{"dtype": "bfloat16", "head_dim": 192, "head_dim_v": 128, "cc": (9, 0), **flags})
        with pytest.raises(UnsupportedError, match="head_dim_v=128"):
            select_kernel(req, specs)


def test_reasons_give_exact_bounds():
    specs = discover_kernels().specs
    req = Request("bfloat16", 128, head_dim_v=192, cc=(8, 0))
    with pytest.raises(UnsupportedError) as e:
        select_kernel(req, specs)
    assert e.value.reasons["fa2"] == [("head_dim_v=192 not supported with head_dim=128: supported head_dim_v <= "
                                       "head_dim, multiples of 8 from 8 to 256 (compiled as 32, 64, 96, 128, 160, "
                                       "192, 256)")]
    on_h100 = Request("bfloat16", 192, head_dim_v=200, cc=(9, 0))
    assert reasons(discover_kernels().get("fa3"), on_h100) == [
        f"head_dim_v=200 not supported with head_dim=192: supported head_dim_v <= head_dim, {FA3_V_DIMS}"]


def test_request_spells_equal_head_dims_one_way():
    assert Request("bfloat16", 128, head_dim_v=128) == Request("bfloat16", 128)
    assert not Request("bfloat16", 128, head_dim_v=128).split_head_dim


def test_explain_api_and_cli():
    for cc, chosen in (((9, 0), "fa3"), ((8, 0), "fa2")):
        sel = flashkit.explain(head_dim=192, head_dim_v=128, cc=cc)
        assert sel.chosen.name == chosen
        assert any("head_dim_v=128: v and the output run as head-dim class 128 under q / k's 192" in n
                   for n in sel.notes)
    res = CliRunner().invoke(cli, ["explain", "--arch", "sm_90", "--head-dim", "192", "--head-dim-v", "128",
                                   "--causal"])
    assert res.exit_code == 0, res.output
    assert "selected: fa3" in res.output and "standard: " in res.output and "head_dim_v != head_dim" in res.output
    res = CliRunner().invoke(cli, ["explain", "--arch", "sm_90", "--head-dim", "192", "--head-dim-v", "120",
                                   "--causal"])
    assert res.exit_code == 0, res.output
    assert "selected: fa3" in res.output and ("head_dim_v=120: v and the output run as head-dim class 128 under q / "
                                              "k's 192 (columns 120..127 zero-filled, not stored)") in res.output
    padded = flashkit.explain(head_dim=200, head_dim_v=136, cc=(8, 0))
    assert any("class 160 under q / k's 256 (columns 136..159 zero-filled, not stored)" in n for n in padded.notes)


def test_explain_cli_without_a_kernel_exits_1():
    res = CliRunner().invoke(cli, ["explain", "--arch", "sm_90", "--head-dim", "64", "--head-dim-v", "128"])
    assert res.exit_code == 1 and "no kernel fits" in res.output and "head_dim_v=128" in res.output


# --- the backward -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dout", "out"])
def test_attention_backward_wants_dout_and_out_of_v_s_head_dim(monkeypatch, name):
    """dout and out of q's shape under a narrower v: an InputError naming the argument before anything runs."""
    def forbid(*a, **k):
        raise AssertionError("compile or launch was called")
    for module, fn in ((backward, "build_module"), (backward, "prepare_launch"), (backward, "device_info")):
        monkeypatch.setattr(module, fn, forbid)
    q, k, v = mla()
    arrays = {"dout": cuda((B, SQ, H, 128)), "out": cuda((B, SQ, H, 128)), name: cuda((B, SQ, H, 192))}
    with pytest.raises(InputError) as e:
        flashkit.attention_backward(arrays["dout"], q, k, v, arrays["out"], cuda((B, H, SQ), "<f4"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name}: expected q's shape with v's head dim (head_dim_v) last "
                                               f"{(B, SQ, H, 128)}"), msg


@pytest.mark.parametrize("device,chosen,d,dv,compiled,compiled_v,v_padded", [
    (H100, "fa3_bwd", 192, 128, 192, 128, False), (A100, "fa2_bwd", 192, 128, 192, 128, False),
    (A100, "fa2_bwd", 128, 64, 128, 64, False), (H100, "fa3_bwd", 64, 40, 64, 64, True),
    (H100, "fa3_bwd", 200, 136, 256, 192, True)])
def test_attention_backward_compiles_v_at_its_own_class(monkeypatch, device, chosen, d, dv, compiled, compiled_v,
                                                        v_padded):
    """The backward kernels compile V, dO and dV at head_dim_v's own class (FLASHKIT_HEAD_DIM_V), padded below it as
    q / k's is, as the forward does."""
    seen = []

    def stop(spec, *args, **kw):
        seen.append((spec.name, make_config(spec, *args, **kw)))
        raise Stop
    monkeypatch.setattr(backward, "device_info", lambda *a: device)
    monkeypatch.setattr(backward, "make_config", stop)
    monkeypatch.setattr(backward, "cupy_module", lambda: _FakeCupy)
    monkeypatch.setattr(backward, "to_cupy", describe)   # (shape, dtype: what the backward reads before the build)
    monkeypatch.setattr(backward, "_aligned", lambda x: x)
    q, k, v = mla(d, dv)
    out = cuda((B, SQ, H, dv))
    with pytest.raises(Stop):
        flashkit.attention_backward(out, q, k, v, out, cuda((B, H, SQ), "<f4"), causal=True)
    ((name, config),) = seen
    assert name == chosen
    assert (config.head_dim, config.head_dim_v, config.head_dim_v_padded) == (compiled, compiled_v, v_padded)
    assert {f"-DFLASHKIT_HEAD_DIM_V={compiled_v}", f"-DFLASHKIT_HEAD_DIM_V_PADDED={int(v_padded)}"} <= \
        set(config.defines())


class _FakeCupy:
    """What attention_backward asks of CuPy before it builds: contiguous LSE views and empty gradients."""

    @staticmethod
    def ascontiguousarray(x):
        return x

    @staticmethod
    def empty(shape, dtype):
        return cuda(tuple(shape))


def test_explain_backward_names_v_s_class():
    sel = flashkit.explain(head_dim=192, head_dim_v=128, cc=(9, 0), backward=True)
    assert sel.chosen.name == "fa3_bwd"
    assert any("head_dim_v=128: v, dout and dv run as head-dim class 128 under q / k's 192" in n
               for n in sel.notes), sel.notes


# --- build, parameters, cache -------------------------------------------------------------------------------

def test_build_config_defines_and_cache_keys():
    fa2 = discover_kernels().get("fa2")
    same = make_config(fa2, "bfloat16", 192, False, (9, 0))
    assert make_config(fa2, "bfloat16", 192, False, (9, 0), head_dim_v=192) == same
    assert not any("HEAD_DIM_V" in f for f in same.defines())
    mla_cfg = make_config(fa2, "bfloat16", 192, False, (9, 0), head_dim_v=128)
    assert {"-DFLASHKIT_HEAD_DIM=192", "-DFLASHKIT_HEAD_DIM_V=128", "-DFLASHKIT_HEAD_DIM_V_PADDED=0"} <= \
        set(mla_cfg.defines())
    assert "hd192 hdv128" in mla_cfg.describe()
    padded = make_config(fa2, "bfloat16", 200, True, (8, 0), head_dim_v=136)
    assert (padded.head_dim, padded.head_dim_padded, padded.head_dim_v, padded.head_dim_v_padded) == (256, True, 160, True)
    keys = {cache_key(fa2, c, "sm_90") for c in (same, mla_cfg, make_config(fa2, "bfloat16", 192, False, (9, 0),
                                                                            head_dim_v=120))}
    assert len(keys) == 3   # head_dim_v (and its padding) are part of the cubin's key


def test_params_carry_head_dim_v():
    block = make_params(head_dim=192, head_dim_v=128)
    assert int(block["head_dim"]) == 192 and int(block["head_dim_v"]) == 128


def test_compile_matrix_plans_the_pairs():
    geometry = {(96, 64), (128, 64), (256, 192), (256, 64)}   # V / O of fewer panels than Q / K, unmodified
    backward_pairs = {"fa2_bwd": {(192, 128), (256, 192), (128, 64), (256, 64)},   # (class, v's class)
                      "fa3_bwd": {(192, 128), (256, 192), (128, 64), (256, 64)}}
    for name, cc in (("fa2_bwd", (8, 0)), ("fa3_bwd", (9, 0))):   # the backward's pairs, mods too
        configs = [c for c in spec_configs(discover_kernels().get(name), cc) if c.head_dim_v]
        assert {(c.head_dim, c.head_dim_v) for c in configs} == backward_pairs[name], name
        assert any("window" in c.mods for c in configs) and {c.causal for c in configs} == {False, True}
    for name in TAKERS:
        spec = discover_kernels().get(name)
        cc = (9, 0) if name == "fa3" else (8, 0)
        configs = [c for c in spec_configs(spec, cc) if c.head_dim_v]
        mla_pairs = {(192, 128), (256, 192)} if name == "fa3" else {(192, 128), (256, 160)}   # 200 / 136's classes
        assert {(c.head_dim, c.head_dim_v) for c in configs} == mla_pairs | geometry
        assert {c.causal for c in configs} == ({True} if name == "causal" else {False, True})
        assert any("varlen" in c.mods for c in configs) and any("window" in c.mods for c in configs)
        assert not [c for c in configs if c.mods and (c.head_dim, c.head_dim_v) in geometry - mla_pairs]
    fa3 = discover_kernels().get("fa3")
    equal = make_config(fa3, "bfloat16", 192, False, (9, 0), head_dim_v=192)
    assert equal == make_config(fa3, "bfloat16", 192, False, (9, 0)) and not any("HEAD_DIM_V" in f
                                                                                  for f in equal.defines())


@pytest.mark.parametrize("name,causal,target", [(n, c, t) for t in ("sm_80", "sm_90")
                                                 for n, c in (("fa2", False), ("fa2", True), ("causal", True))]
                         + [("fa3", False, "sm_90"), ("fa3", True, "sm_90")])
def test_mla_specializations_compile_without_spills(name, causal, target):
    spec = discover_kernels().get(name)
    cc = (int(target[3]), int(target[4]))
    config = make_config(spec, "bfloat16", 192, causal, cc, head_dim_v=128)
    reports = compile_variant(spec, config, spec.target(cc)).reports()
    assert {r.entry for r in reports} >= set(spec.entries)
    for r in reports:
        assert r.spill_stores == r.spill_loads == r.stack_bytes == 0, (config.describe(), r)


# --- the reference ------------------------------------------------------------------------------------------

def _naive(q, k, v, scale, causal):
    """Per (batch, head) loops in float64: the textbook definition with v of its own width."""
    b, sq, h, _ = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    out, lse = np.zeros((b, sq, h, dv)), np.zeros((b, h, sq))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hk)
            s = scale * q[bi, :, hi].astype(np.float64) @ k[bi, :, kh].astype(np.float64).T
            if causal:
                s = np.where(np.arange(sk)[None] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            lse[bi, hi] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
            out[bi, :, hi] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, kh].astype(np.float64)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_reference_handles_a_narrower_v(causal):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 9, 4, 24)).astype(np.float16)
    k = rng.standard_normal((2, 13, 2, 24)).astype(np.float16)
    v = rng.standard_normal((2, 13, 2, 16)).astype(np.float16)
    out, lse = reference_attention(q, k, v, scale=24 ** -0.5, causal=causal)
    want, want_lse = _naive(q, k, v, 24 ** -0.5, causal)
    assert out.shape == (2, 9, 4, 16) and lse.shape == (2, 4, 9)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    plain, _ = plain_attention(q, k, v, scale=24 ** -0.5, dtype=BY_NAME["float16"], causal=causal)
    assert plain.shape == out.shape and np.abs(plain - out).max() < 1e-2


# --- verify -------------------------------------------------------------------------------------------------

def test_verify_checks_mla_on_the_takers_only():
    specs = discover_kernels().specs
    fa2 = [c.label for c in checks_for(specs["fa2"]) if "/v" in c.label]
    assert any(lbl.endswith("d192/v128 bfloat16 causal") for lbl in fa2)
    assert any("h16/2 d192/v128" in lbl for lbl in fa2)                   # GQA 8:1
    assert any("sq127 sk1000" in lbl and "d192/v128" in lbl for lbl in fa2)   # seqlen_q != seqlen_k, odd lengths
    assert any(lbl.startswith("varlen ") and "d192/v128" in lbl for lbl in fa2)
    assert any("window" in lbl and "d192/v128" in lbl for lbl in fa2)
    assert any("d200/v136" in lbl for lbl in fa2) and any("d40/v8" in lbl for lbl in fa2)
    assert all("causal" in c.label for c in checks_for(specs["causal"]) if "/v" in c.label)
    fa3 = [c.label for c in checks_for(specs["fa3"]) if "/v" in c.label]
    assert any(lbl.endswith("d192/v128 bfloat16 causal") for lbl in fa3) and any("d128/v64" in lbl for lbl in fa3)
    assert any(lbl.startswith("varlen ") and "d192/v128" in lbl for lbl in fa3)
    assert any("window" in lbl and "d192/v128" in lbl for lbl in fa3)
    assert any("d200/v136" in lbl for lbl in fa3) and any("d136/v72" in lbl for lbl in fa3)   # at fa3's classes
    for name in ("standard", "block_sparse", "decode"):
        assert not [c for c in checks_for(specs[name]) if "/v" in c.label], name
    assert not [c for c in checks_for(specs["fa2"], head_dims=[64]) if "/v" in c.label]
