"""validate.py and arrays.describe: the catalogue of bad inputs, judged on metadata alone (no GPU)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import flashkit
from flashkit.call.arrays import describe
from flashkit.errors import FlashkitError, InputError
from flashkit.call.validate import Problem, check_flag, check_scale, validate_inputs
from ..synth import B, D, H, SK, SQ, cuda, qkv

def input_error(fn, *args, **kwargs) -> str:
    """Run fn expecting an InputError; return its message after checking it is one line."""
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert isinstance(err, FlashkitError) and isinstance(err, ValueError)
    msg = str(err)
    assert msg and "\n" not in msg, msg
    return msg


def validate(q, k, v, scale=None, prequantized=False):
    return validate_inputs(describe(q, "q"), describe(k, "k"), describe(v, "v"), scale, prequantized)


def no_gpu_needed(monkeypatch):
    """Make any attempt to reach the device, compile or launch fail the test."""
    import flashkit.api as api

    def forbidden(*a, **k):
        raise AssertionError("validation must finish before the device, the compiler or a launch is touched")
    for name in ("device_info", "build_module", "launch", "run", "to_cupy", "cupy_module"):
        monkeypatch.setattr(api, name, forbidden)


# --- valid inputs ----------------------------------------------------------------------------------------

def test_valid_problem():
    p = validate(*qkv())
    assert p == Problem(B, SQ, SK, H, H, D, "float16", 1 / math.sqrt(D))


@pytest.mark.parametrize("typestr,name", [("<f2", "float16"), ("<f4", "float32")])
def test_dtype_names(typestr, name):
    assert validate(*qkv(typestr=typestr)).dtype == name


def test_bfloat16_meta():
    # bf16 arrives through DLPack/CuPy as ml_dtypes.bfloat16; validation judges metadata only.
    from flashkit.call.arrays import ArrayMeta
    meta = lambda n, s: ArrayMeta(n, s, np.dtype(ml_dtypes.bfloat16), (s[1] * s[2] * s[3], s[2] * s[3], s[3], 1),  # noqa: E731
                                  True, "cupy.ndarray", 0)
    p = validate_inputs(meta("q", (1, 5, 2, 64)), meta("k", (1, 7, 2, 64)), meta("v", (1, 7, 2, 64)))
    assert p.dtype == "bfloat16" and p.seqlen_k == 7


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 1), (8, 2), (16, 4)])
def test_gqa_and_mqa_accepted(heads, kv_heads):
    p = validate(*qkv((1, 5, heads, 64), (1, 9, kv_heads, 64)))
    assert (p.heads, p.kv_heads) == (heads, kv_heads)


def test_strided_heads_and_rows_accepted():
    # q, k, v as views into one packed (b, s, 3, h, d) buffer: rows and heads strided, last dim contiguous.
    packed = (SQ * 3 * H * D, 3 * H * D, D, 1)
    q = cuda((B, SQ, H, D), strides_elems=packed)
    p = validate(q, q, q)
    assert p.seqlen_q == p.seqlen_k == SQ


def test_explicit_scale_kept():
    assert validate(*qkv(), scale=0.25).softmax_scale == 0.25
    assert validate(*qkv(), scale=-1.0).softmax_scale == -1.0
    assert validate(*qkv(), scale=np.float32(0.5)).softmax_scale == 0.5
    assert validate(*qkv(), scale=2).softmax_scale == 2.0


def test_describe_cuda_array_interface():
    m = describe(cuda((2, 3, 4, 8)), "q")
    assert m.shape == (2, 3, 4, 8) and m.dtype == np.float16 and m.on_gpu
    assert m.strides == (96, 32, 8, 1)            # None means C-contiguous; strides are in elements
    m = describe(cuda((2, 3, 4, 8), "<f4", (200, 50, 10, 1)), "k")
    assert m.strides == (200, 50, 10, 1) and m.name == "k"


# --- the catalogue of bad inputs --------------------------------------------------------------------------

def cpu(shape=(B, SQ, H, D), dtype=np.float16):
    return np.zeros(shape, dtype=dtype)


BAD = [
    # id, (q, k, v) builder, attention kwargs, the argument the message must name first
    ("q-cpu-numpy", lambda: (cpu(), *qkv()[1:]), {}, "q", "on the CPU"),
    ("k-cpu-numpy", lambda: (qkv()[0], cpu((B, SK, H, D)), qkv()[2]), {}, "k", "on the CPU"),
    ("v-cpu-bf16-numpy", lambda: (*qkv()[:2], cpu((B, SK, H, D), ml_dtypes.bfloat16)), {}, "v", "on the CPU"),
    ("q-none", lambda: (None, *qkv()[1:]), {}, "q", "got None"),
    ("q-list", lambda: ([[1.0]], *qkv()[1:]), {}, "q", "expected a CUDA array"),
    ("q-float64", lambda: qkv(typestr="<f8"), {}, "q", "dtype float64 is not supported"),
    ("q-int32", lambda: qkv(typestr="<i4"), {}, "q", "dtype int32 is not supported"),
    ("q-uint8-hints-fp8", lambda: qkv(typestr="|u1"), {}, "q", "pass q_scale, k_scale and v_scale"),
    ("q-bool", lambda: qkv(typestr="|b1"), {}, "q", "is not supported"),
    ("dtypes-differ-k", lambda: (qkv()[0], cuda((B, SK, H, D), "<f4"), qkv()[2]), {}, "k, v", "must match"),
    ("dtypes-differ-v", lambda: (*qkv()[:2], cuda((B, SK, H, D), "<f4")), {}, "k, v", "must match"),
    ("q-rank3", lambda: (cuda((B, SQ, D)), *qkv()[1:]), {}, "q", "expected 4 dims"),
    ("k-rank5", lambda: (qkv()[0], cuda((B, SK, H, D, 1)), qkv()[2]), {}, "k", "expected 4 dims"),
    ("v-rank2", lambda: (*qkv()[:2], cuda((SK, D))), {}, "v", "expected 4 dims"),
    ("batch-mismatch", lambda: qkv(kv_shape=(B + 1, SK, H, D)), {}, "k", "batch must match q's (2), got 3"),
    ("head-dim-mismatch", lambda: qkv(kv_shape=(B, SK, H, D * 2)), {}, "k", "head_dim must match q's (64), got 128"),
    ("v-head-dim-above-q", lambda: (*qkv()[:2], cuda((B, SK, H, D * 2))), {}, "v",
     "head_dim_v=128 (v's last dim) with head_dim=64 is not supported by any kernel (causal takes head_dim_v <= "),
    ("v-head-dim-not-multiple-of-8", lambda: (*qkv()[:2], cuda((B, SK, H, 36))), {}, "v", "multiples of 8"),
    ("v-heads-mismatch", lambda: (*qkv()[:2], cuda((B, SK, H + 1, 32))), {}, "v", "expected the shape of k"),
    ("v-seqlen-mismatch", lambda: (*qkv()[:2], cuda((B, SK + 1, H, D))), {}, "v", "expected the shape of k"),
    ("heads-not-multiple", lambda: qkv((B, SQ, 6, D), (B, SK, 4, D)), {}, "k", "kv heads (4) must divide q's heads (6)"),
    ("kv-heads-exceed", lambda: qkv((B, SQ, 4, D), (B, SK, 8, D)), {}, "k", "kv heads (8) must divide q's heads (4)"),
    ("q-last-dim-strided", lambda: (cuda((B, SQ, H, D), strides_elems=(SQ * H * D * 2, H * D * 2, D * 2, 2)),
                                    *qkv()[1:]), {}, "q", "must be contiguous (stride 1)"),
    ("v-last-dim-strided", lambda: (*qkv()[:2], cuda((B, SK, H, D), strides_elems=(1, B * H * D, B * D, B * SK * H * D))),
     {}, "v", "must be contiguous"),
    ("q-empty-seqlen", lambda: (cuda((B, 0, H, D)), *qkv()[1:]), {}, "q", "every dimension must be >= 1"),
    ("k-empty-seqlen", lambda: qkv(kv_shape=(B, 0, H, D)), {}, "k", "every dimension must be >= 1"),
    ("q-empty-batch", lambda: qkv((0, SQ, H, D), (0, SK, H, D)), {}, "q", "every dimension must be >= 1"),
    ("q-empty-head-dim", lambda: qkv((B, SQ, H, 0), (B, SK, H, 0)), {}, "q", "every dimension must be >= 1"),
    ("scale-zero", qkv, {"softmax_scale": 0.0}, "softmax_scale", "finite non-zero"),
    ("scale-nan", qkv, {"softmax_scale": float("nan")}, "softmax_scale", "finite non-zero"),
    ("scale-inf", qkv, {"softmax_scale": float("inf")}, "softmax_scale", "finite non-zero"),
    ("scale-neg-inf", qkv, {"softmax_scale": -math.inf}, "softmax_scale", "finite non-zero"),
    ("scale-str", qkv, {"softmax_scale": "0.1"}, "softmax_scale", "expected a float, got str"),
    ("scale-bool", qkv, {"softmax_scale": True}, "softmax_scale", "expected a float, got bool"),
    ("scale-list", qkv, {"softmax_scale": [0.1]}, "softmax_scale", "expected a float, got list"),
    ("scale-complex", qkv, {"softmax_scale": 1j}, "softmax_scale", "expected a float, got complex"),
    ("causal-int", qkv, {"causal": 1}, "causal", "expected True or False, got 1"),
    ("causal-str", qkv, {"causal": "yes"}, "causal", "expected True or False"),
    ("causal-none", qkv, {"causal": None}, "causal", "expected True or False, got None"),
    ("return-lse-int", qkv, {"return_lse": 0}, "return_lse", "expected True or False"),
    ("fp8-str", qkv, {"fp8": "true"}, "fp8", "expected True or False"),
    ("variant-int", qkv, {"variant": 3}, "variant", "expected a variant name (str), got int"),
    ("out-dtype-not-fp8", qkv, {"out_dtype": "float32"}, "out_dtype", "only fp8 calls"),
    ("fp8-from-float32", lambda: qkv(typestr="<f4"), {"fp8": True}, "fp8", "float16 or bfloat16"),
    ("some-scales-only", qkv, {"q_scale": object()}, "q_scale, k_scale, v_scale", "all three"),
    ("scales-and-fp8", lambda: qkv(typestr="|u1"), {"q_scale": 1, "k_scale": 1, "v_scale": 1, "fp8": True},
     "fp8", "not both"),
    ("prequantized-not-uint8", qkv, {"q_scale": 1, "k_scale": 1, "v_scale": 1}, "q", "uint8"),
]


@pytest.mark.parametrize("build,kwargs,arg,detail", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(monkeypatch, build, kwargs, arg, detail):
    no_gpu_needed(monkeypatch)
    q, k, v = build()
    msg = input_error(flashkit.attention, q, k, v, **kwargs)
    assert msg.split(": ")[0] == arg, f"the message must name {arg!r} first: {msg}"
    assert detail in msg, msg


def test_bad_input_catalogue_covers_each_argument():
    assert {b[3] for b in BAD} >= {"q", "k", "v", "k, v", "softmax_scale", "causal", "return_lse", "fp8",
                                   "variant", "out_dtype"}


@pytest.mark.parametrize("value", [0.0, 0, float("nan"), float("inf"), -math.inf, "1", True, False, [1.0]])
def test_check_scale_rejects(value):
    msg = input_error(check_scale, value, 64)
    assert msg.startswith("softmax_scale: ")


def test_check_scale_default():
    assert check_scale(None, 64) == 0.125
    assert check_scale(None, 128) == pytest.approx(128 ** -0.5)


@pytest.mark.parametrize("value", [1, 0, "True", None, 1.0, np.int32(1)])
def test_check_flag_rejects(value):
    msg = input_error(check_flag, value, "causal")
    assert msg.startswith("causal: expected True or False")


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_check_flag_accepts(value):
    assert check_flag(value, "causal") is bool(value)


def test_dlpack_cpu_exporter_rejected():
    class CPUTensor:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")
    msg = input_error(describe, CPUTensor(), "k")
    assert msg.startswith("k: expected a CUDA array") and "on the CPU" in msg


def test_dlpack_other_device_rejected():
    class ROCmTensor:
        def __dlpack_device__(self):
            return (10, 0)
    msg = input_error(describe, ROCmTensor(), "v")
    assert msg.startswith("v: expected a CUDA array") and "DLPack device type 10" in msg


def test_block_mask_of_the_wrong_type(monkeypatch):
    pytest.importorskip("flashkit.features.block_mask", reason="flashkit.features.block_mask is not written yet")
    no_gpu_needed(monkeypatch)
    msg = input_error(flashkit.attention, *qkv(), block_mask=np.ones((1, 1), dtype=bool))
    assert msg.startswith("block_mask: ")
