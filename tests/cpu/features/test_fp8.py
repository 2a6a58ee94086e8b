"""fp8.py on the CPU: e4m3 rounding, block scales, the Hadamard rotation, scale validation, the fp8
manifest and selection, the plain FP8 implementation, and the GPU-less compile of the quantizer."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from flashkit.features import fp8
from flashkit.errors import InputError
from flashkit.registry import discover_kernels
from flashkit.registry.select import Request, reasons
from flashkit.call.validate import Problem
from ..synth import cuda

E4M3 = ml_dtypes.float8_e4m3fn


def test_round_e4m3_matches_ml_dtypes():
    rng = np.random.default_rng(0)
    finite = fp8.decode_e4m3(np.arange(256, dtype=np.uint8))
    finite = finite[np.isfinite(finite)]
    mids = (np.sort(finite)[1:] + np.sort(finite)[:-1]) / 2          # ties: round to even
    x = np.concatenate([finite, mids, rng.standard_normal(20000) * 30, rng.standard_normal(2000) * 1e-3,
                        [0.0, -0.0, 447.0, 448.0, 463.9]]).astype(np.float32)
    want = x.astype(E4M3).astype(np.float32)
    np.testing.assert_array_equal(fp8.round_e4m3(x), want)


def test_round_e4m3_saturates():
    np.testing.assert_array_equal(fp8.round_e4m3(np.array([500.0, -1e6, 1e30], np.float32)), [448, -448, 448])


def test_decode_e4m3_round_trips():
    codes = np.arange(256, dtype=np.uint8)
    vals = fp8.decode_e4m3(codes)
    ok = np.isfinite(vals)
    assert ok.sum() == 254   # 0x7f and 0xff are NaN in e4m3fn
    np.testing.assert_array_equal(vals[ok].astype(E4M3).view(np.uint8), codes[ok])


@pytest.mark.parametrize("seqlen,block", [(1, 64), (17, 64), (128, 128), (1000, 128), (300, 256)])
def test_block_scales_shape_and_value(seqlen, block):
    rng = np.random.default_rng(seqlen)
    x = rng.standard_normal((2, seqlen, 3, 64)).astype(np.float32) * rng.uniform(0.1, 10, (1, seqlen, 3, 1))
    q, scales = fp8.quantize_reference(x, block)
    n = -(-seqlen // block)
    assert scales.shape == (2, 3, n) and scales.dtype == np.float32
    for j in range(n):
        amax = np.abs(x[:, j * block:(j + 1) * block]).max(axis=(1, 3))
        np.testing.assert_allclose(scales[:, :, j], amax / 448, rtol=1e-6)
    assert np.abs(q).max() <= 448
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 above the subnormal range
    deq = fp8.dequantize_fp8(q.astype(E4M3).view(np.uint8), scales, block)
    big = np.abs(x) > scales.max() * 2.0 ** -6
    assert np.all(np.abs(deq - x)[big] <= 2.0 ** -4 * np.abs(x)[big] * (1 + 1e-6))


def test_per_tensor_scales():
    x = np.random.default_rng(1).standard_normal((2, 100, 4, 32)).astype(np.float32)
    q, scales = fp8.quantize_reference(x, None)
    assert scales.shape == (2, 4, 1)
    np.testing.assert_allclose(scales, np.abs(x).max() / 448, rtol=1e-6)


def test_zero_block_gets_unit_scale():
    x = np.zeros((1, 64, 1, 64), np.float32)
    q, scales = fp8.quantize_reference(x, 64)
    assert float(scales[0, 0, 0]) == 1.0 and not q.any()


@pytest.mark.parametrize("d", [1, 2, 16, 64, 128, 256])
def test_hadamard_is_orthogonal_and_keeps_qk(d):
    r = fp8.hadamard_rotation(d, seed=3)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-12)
    rng = np.random.default_rng(d)
    q, k = rng.standard_normal((5, d)), rng.standard_normal((7, d))
    np.testing.assert_allclose((q @ r) @ (k @ r).T, q @ k.T, atol=1e-10)
    assert not np.allclose(fp8.random_signs(d, 3), fp8.random_signs(d, 4)) or d < 4


def test_hadamard_spreads_an_outlier():
    x = np.zeros((1, 1, 1, 128), np.float32)
    x[..., 5] = 100.0
    rotated = x.reshape(1, 128) @ fp8.hadamard_rotation(128, 0)
    np.testing.assert_allclose(np.abs(rotated), 100 / np.sqrt(128), rtol=1e-6)


def test_hadamard_needs_a_power_of_two():
    with pytest.raises(InputError, match="power of two"):
        fp8.hadamard_rotation(96, 0)


@pytest.mark.parametrize("sq,nq,sk,nk,want", [
    (1000, 8, 1000, 8, 128), (100, 1, 1000, 8, 128), (17, 1, 17, 1, 64), (1, 1, 4097, 65, 64),
    (4097, 33, 4097, 33, 128), (1000, 16, 1000, 8, None), (1000, 7, 1000, 7, None)])
def test_scale_block_rows(sq, nq, sk, nk, want):
    assert fp8.scale_block_rows(sq, nq, sk, nk) == want


def _problem(b=2, sq=100, sk=300, h=4, hk=2, d=64):
    return Problem(b, sq, sk, h, hk, d, "float8_e4m3", 0.125)


@pytest.mark.parametrize("which,bad,match", [
    ("q_scale", cuda((2, 4, 1), "<f2"), "q_scale: expected float32"),
    ("q_scale", cuda((2, 2, 1), "<f4"), r"q_scale: expected shape \(batch, heads, blocks\)"),
    ("k_scale", cuda((2, 4, 3), "<f4"), r"k_scale: expected shape \(batch, kv_heads, blocks\)"),
    ("v_scale", cuda((2, 2), "<f4"), "v_scale: expected shape"),
    ("k_scale", np.ones((2, 2, 3), np.float32), "k_scale: expected a CUDA array"),
])
def test_scale_fields_validation(which, bad, match):
    args = {"q_scale": cuda((2, 4, 1), "<f4"), "k_scale": cuda((2, 2, 3), "<f4"), "v_scale": cuda((2, 2, 3), "<f4")}
    args[which] = bad
    with pytest.raises(InputError, match=match):
        fp8.scale_fields(_problem(), args["q_scale"], args["k_scale"], args["v_scale"], keep=[])


def test_quantize_fp8_validates_before_the_device():
    with pytest.raises(InputError, match="block: expected None"):
        fp8.quantize_fp8(cuda((1, 64, 2, 64), "<f2"), block=100)
    with pytest.raises(InputError, match="block: expected None"):
        fp8.quantize_fp8(cuda((1, 64, 2, 64), "<f2"), block=32)
    with pytest.raises(InputError, match="x: expected float16, bfloat16 or float32"):
        fp8.quantize_fp8(cuda((1, 64, 2, 64), "|u1"))
    with pytest.raises(InputError, match="hadamard: x's head_dim must be a power of two"):
        fp8.quantize_fp8(cuda((1, 64, 2, 96), "<f2"), hadamard=True)
    with pytest.raises(InputError, match="x: expected 4"):
        fp8.quantize_fp8(cuda((64, 2, 64), "<f2"))


def test_fp8_options_need_fp8():
    import flashkit
    with pytest.raises(InputError, match="fp8_options"):
        flashkit.attention(*(cuda((1, 8, 1, 64)),) * 3, fp8_options={"hadamard": True})


def test_manifest_and_selection():
    spec = discover_kernels(refresh=True).get("fp8")
    assert spec.arch_min == (8, 9) and spec.dtypes == ("float8_e4m3",) and spec.requires == {"fp8": True}
    assert all(spec.supports(f) for f in ("fp8", "causal", "lse", "gqa")) and spec.priority == 50
    req = dict(dtype="float8_e4m3", head_dim=128, seqlen_q=1000, seqlen_k=1000, heads=8, kv_heads=2,
               batch=1, causal=True, fp8=True, lse=True)
    assert reasons(spec, Request(cc=(9, 0), **req)) == []
    assert reasons(spec, Request(cc=(8, 9), **req)) == []
    assert reasons(spec, Request(cc=(8, 0), **req)) == ["needs compute capability >= 8.9; device has 8.0"]
    plain = dict(req, dtype="bfloat16", fp8=False)
    assert any("only runs with fp8" in r for r in reasons(spec, Request(cc=(9, 0), **plain)))
    assert spec.declared_archs() == ["sm_89", "sm_90"]


def test_plain_fp8_attention_is_close_to_the_reference():
    from flashkit.verify.fp8 import plain_fp8_attention
    from flashkit.verify.reference import reference_attention
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 50, 4, 32)).astype(np.float32) for _ in range(3))
    for causal in (False, True):
        ref, lse_ref = reference_attention(q, k, v, scale=32 ** -0.5, causal=causal)
        out, lse = plain_fp8_attention(q, k, v, scale=32 ** -0.5, causal=causal)
        assert np.abs(out - ref).max() < 0.05          # P rounded to e4m3 only
        np.testing.assert_allclose(lse, lse_ref, atol=1e-5)


QUANTIZE_BUILDS = [(arch, dtype, d, hadamard, 16) for arch, dtype, d, hadamard in itertools.product(
    ("sm_89", "sm_90"), (1, 2, 3), (64, 128, 256), (False, True))] + [
    # narrower alignments (strided views), odd and tiny head dims, the largest head dim
    ("sm_90", 1, 128, False, 2), ("sm_90", 2, 64, True, 4), ("sm_90", 3, 128, False, 4), ("sm_90", 1, 96, False, 8),
    ("sm_90", 1, 7, False, 2), ("sm_90", 2, 1, True, 2), ("sm_90", 1, 2, True, 4), ("sm_90", 3, 5, False, 4),
    ("sm_89", 2, 40, False, 16)] + [
    # wide rows: where the register budget changes (kMinBlocksPerSm, kKeepRotated)
    ("sm_90", dtype, d, hadamard, 16) for dtype, d, hadamard in itertools.product((1, 2, 3), (512, 1024), (False, True))]


@pytest.mark.parametrize("arch,dtype,d,hadamard,align", QUANTIZE_BUILDS)
def test_quantize_kernel_compiles_without_spills(arch, dtype, d, hadamard, align):
    pytest.importorskip("cupy")
    from flashkit.errors import DeviceError
    from flashkit.runtime.nvrtc import compile_cubin
    try:
        compiled = compile_cubin(fp8._source(), "fp8_quantize.cu",
                                 [f"-arch={arch}", "--ptxas-options=-v",
                                  *fp8.quantize_options(dtype, d, hadamard, align)])
    except DeviceError as e:
        pytest.skip(str(e))
    (report,) = compiled.reports()
    assert report.entry == "flashkit_fp8_quantize"
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0


def test_fa3_fp8_manifest_and_selection():
    from flashkit.registry import Request, discover_kernels, select_kernel
    specs = discover_kernels(refresh=True).specs
    spec = specs["fa3_fp8"]
    assert spec.arch_min == spec.arch_max == (9, 0) and spec.target((9, 0)) == "sm_90a"
    assert spec.requires == {"fp8": True} and spec.workspace == "v_transposed"
    assert spec.grids == ("kv_tiles", "tiles") and spec.priority > specs["fp8"].priority
    fp8_req = dict(dtype="float8_e4m3", head_dim=128, fp8=True)
    assert select_kernel(Request(cc=(9, 0), **fp8_req), specs).chosen.name == "fa3_fp8"
    assert select_kernel(Request(cc=(8, 9), **fp8_req), specs).chosen.name == "fp8"      # Ada: mma.sync e4m3
    assert select_kernel(Request(cc=(10, 0), **fp8_req), specs).chosen.name == "fp8"     # wgmma is Hopper-only
    assert select_kernel(Request(cc=(9, 0), dtype="bfloat16", head_dim=128), specs).chosen.name != "fa3_fp8"


def test_fa3_fp8_maps_v_transposed_in_the_workspace():
    from flashkit.registry import discover_kernels
    spec = discover_kernels().specs["fa3_fp8"]
    launch = spec.launch_config((9, 0), 256)
    assert spec.tensor_map_rows(launch, 256) == {"q": 128, "k": 128, "o": 64, "vt": 256}   # vt: every head-dim row
    short_causal = spec.launch_config((9, 0), 256, causal=True, seqlen_q=2048)   # 64-key tiles
    assert spec.tensor_map_rows(short_causal, 256)["k"] == 64
    assert list(spec.tensor_map_rows(spec.launch_config((9, 0), 128), 128)) == ["q", "k", "o", "vt"]   # kernel order


def test_v_transposed_workspace_and_kv_tiles_grid():
    from flashkit.runtime.launch import grid_for, workspace_bytes
    from flashkit.call.validate import Problem
    p = Problem(batch=2, seqlen_q=300, seqlen_k=300, heads=8, kv_heads=2, head_dim=128, dtype="float8_e4m3",
                softmax_scale=0.1)
    cfg = {"block_m": 64, "block_n": 128, "warps": 4}
    assert grid_for("kv_tiles", p, cfg) == (3, 2, 2)                       # ceil(300 / 128) key tiles per kv head
    assert workspace_bytes("v_transposed", p, cfg) == 2 * 2 * 128 * 384    # keys padded to whole tiles, 1 B each


def test_alignment_is_the_widest_safe_load():
    assert fp8.alignment(0x7f0000000000, (2 ** 21, 2048, 256)) == 16
    assert fp8.alignment(0x7f0000000000, (2 ** 21, 2048, 24)) == 8    # a head stride of 12 bf16
    assert fp8.alignment(0x7f0000000002, (4096, 256, 128)) == 2        # a view one element in
    assert fp8.alignment(0x7f0000000000, (4, 4, 4)) == 4


def test_quantize_options_name_every_define():
    options = fp8.quantize_options(2, 128, True, 8)
    for define in ("FLASHKIT_DTYPE=2", "FLASHKIT_HEAD_DIM=128", "FLASHKIT_HADAMARD=1",
                   f"FLASHKIT_QUANT_THREADS={fp8.QUANT_THREADS}", "FLASHKIT_ALIGN=8"):
        assert f"-D{define}" in options
