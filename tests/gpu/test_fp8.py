"""The fp8 variants on the GPU: the quantizer against its NumPy model, the verification checks, the
attention(fp8=True) path, and fa3_fp8 at its tile boundaries. Skips (by name) below compute capability 8.9;
fa3_fp8's checks skip on anything but 9.0."""

from __future__ import annotations

import numpy as np
import pytest

from .gpu_checks import boundary_lengths, check_params, run_check, variant_on_this_device

pytestmark = pytest.mark.gpu


@pytest.fixture
def fp8_device():
    from flashkit.runtime.device import device_info
    cc = device_info().cc
    if cc < (8, 9):
        pytest.skip(f"fp8 needs compute capability >= 8.9; this device has {cc[0]}.{cc[1]}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("block,hadamard", [(64, False), (128, False), (None, False), (128, True), (256, False),
                                            (512, True)])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_quantize_matches_the_model(fp8_device, dtype, block, hadamard, d):
    # blocks of 256 and 512 rows span several register tiles: the two-pass path
    check_quantize(dtype, (2, 300, 3, d), block, hadamard)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("d,hadamard", [(7, False), (40, False), (96, False), (16, True), (512, True)])
def test_quantize_odd_and_wide_head_dims(fp8_device, dtype, d, hadamard):
    check_quantize(dtype, (1, 200, 2, d), 64, hadamard)


def check_quantize(dtype, shape, block, hadamard):
    import cupy
    from flashkit.features import fp8
    from flashkit.call.dtypes import BY_NAME
    d = shape[3]
    rng = cupy.random.default_rng(d)
    x = (rng.standard_normal(shape, dtype=cupy.float32) * 3).astype(BY_NAME[dtype].storage)
    x[0, 5, 1, d // 2] = 200   # an outlier
    data, scales = fp8.quantize_fp8(x, block=block, hadamard=hadamard, seed=7)
    want, want_scales = fp8.quantize_reference(cupy.asnumpy(x.astype(cupy.float32)), block, hadamard, 7)
    assert data.dtype == cupy.uint8 and data.shape == x.shape and data.flags.c_contiguous
    assert scales.dtype == cupy.float32 and scales.shape == want_scales.shape
    np.testing.assert_allclose(cupy.asnumpy(scales), want_scales, rtol=1e-5 if hadamard else 0)
    got = cupy.asnumpy(fp8.decode_e4m3(data))
    if hadamard:   # butterflies vs a matmul: sums in another order may flip a rounding by one step
        assert np.abs(got - want).max() <= np.abs(want).max() * 2.0 ** -3
        assert (got != want).mean() < 1e-2
    else:
        np.testing.assert_array_equal(got, want)


def test_quantize_strided_input(fp8_device):
    import cupy
    from flashkit.features import fp8
    x = cupy.random.default_rng(0).standard_normal((1, 200, 4, 128), dtype=cupy.float32).astype(cupy.float16)
    view = x[:, :, ::2]   # head stride 2 * d
    data, scales = fp8.quantize_fp8(view)
    data2, scales2 = fp8.quantize_fp8(cupy.ascontiguousarray(view))
    assert bool((data == data2).all()) and bool((scales == scales2).all())


@pytest.mark.parametrize("hadamard", [False, True])
def test_quantize_misaligned_view(fp8_device, hadamard):
    import cupy
    from flashkit.features import fp8
    big = cupy.random.default_rng(1).standard_normal((2, 150, 3, 130), dtype=cupy.float32).astype(cupy.float16)
    view = big[..., 1:129]   # rows start 2 bytes past a 16-byte boundary: 2-byte loads
    assert fp8.alignment(view.data.ptr, view.strides[:3]) == 2
    data, scales = fp8.quantize_fp8(view, hadamard=hadamard, seed=5)
    data2, scales2 = fp8.quantize_fp8(cupy.ascontiguousarray(view), hadamard=hadamard, seed=5)
    assert bool((data == data2).all()) and bool((scales == scales2).all())


@pytest.mark.parametrize("variant,check", check_params(["fp8", "fa3_fp8"], quick=True))
def test_fp8_checks(variant, check):
    run_check(variant, check)


def test_attention_fp8_true(fp8_device):
    import cupy
    import flashkit
    from flashkit.verify.reference import reference_attention
    rng = cupy.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 500, 8, 128), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    from flashkit.features.fp8 import quantize_qkv
    options = {"hadamard": True, "seed": 3}
    out = flashkit.attention(q, k, v, fp8=True, causal=True, fp8_options=options)
    assert out.dtype == cupy.float16
    # fp8=True is exactly quantize-then-run on the pre-quantized path...
    (qd, qs), (kd, ks), (vd, vs) = quantize_qkv(q, k, v, **options)
    pre = flashkit.attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, causal=True, out_dtype="float16")
    assert bool((out == pre).all())
    # ...and lands at FP8's accuracy (FlashAttention-3 reports RMSE ~1e-2 on N(0,1) inputs).
    ref, _ = reference_attention(q, k, v, scale=128 ** -0.5, causal=True)
    rmse = float(cupy.sqrt(((out.astype(cupy.float64) - ref) ** 2).mean()))
    assert rmse < 3e-2, rmse


def fp8_failures(spec, head_dim: int, causal: bool, cases) -> list[str]:
    """fp8_check of each (shape, scale block rows, seed) in cases; a line for each that fails."""
    from flashkit.verify.fp8 import fp8_check
    failures = []
    for shape, block, seed in cases:
        result = fp8_check(spec, shape, head_dim, "bfloat16", causal, block=block).run(seed)
        if not result.passed:
            failures.append(f"{result.label}: error {result.max_error:.3g} > {result.bound:.3g} {result.note}")
    return failures


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_fp8_tile_boundaries(head_dim, causal):
    """fa3_fp8 at every multiple of block_m / block_n (and 2x) +- 1, both ways, with scale blocks of 64, 128 and 256
    rows (64-row blocks: a 128-key tile spans two, each with its own k and v scale)."""
    from flashkit.verify import Shape
    spec, cc = variant_on_this_device("fa3_fp8")
    cfg = spec.launch_config(cc, head_dim, causal=causal, seqlen_q=1024)
    lengths_q, lengths_k = boundary_lengths(cfg["block_m"]), boundary_lengths(cfg["block_n"])
    cases = [(shape, (64, 128, 256)[i % 3], 4000 + i)
             for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k[::-1]))
             for shape in (Shape(2, sq, sk, 4, 2), Shape(1, sk, sq, 2, 1))]
    failures = fp8_failures(spec, head_dim, causal, cases)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_fp8_every_length_table(head_dim, causal):
    """fa3_fp8 on each side of every 'seqlen_q<=L' key of its manifest (hd256: 64-key tiles up to 2048 causal rows,
    128-key serial_pv tiles above), ragged both ways and seqlen_q != seqlen_k, so that every tile table a call can
    reach runs, not only the one the short boundary shapes pick."""
    from flashkit.verify import Shape
    spec, _ = variant_on_this_device("fa3_fp8")
    bounds = spec.length_bounds(head_dim) or (2048,)
    cases = [(shape, (64, 128)[i % 2], 4100 + i)
             for i, rows in enumerate(n for bound in bounds for n in (bound, bound + 1))
             for shape in (Shape(1, rows, rows + 77, 2, 1), Shape(1, rows, max(1, rows - 131), 4, 2))]
    failures = fp8_failures(spec, head_dim, causal, cases)
    assert not failures, "\n".join(failures)
