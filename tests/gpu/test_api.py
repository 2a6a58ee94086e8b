"""The API on a real device: bad inputs on CuPy/torch arrays, the compile cache, torch interop, return_lse."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
import flashkit.api as api
import flashkit.runtime.build as build
from flashkit.errors import InputError
from flashkit.registry import discover_kernels

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    import cupy
    return cupy


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is installed without CUDA")
    return torch


@pytest.fixture
def no_compile_or_launch(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("validation must fail before any compile or launch")
    for module, name in ((build, "build_module"), (build, "compile_variant"), (api, "build_module"),
                         (api, "launch"), (api, "run")):
        monkeypatch.setattr(module, name, fail)


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    """An empty on-disk cache and no module loaded in this process."""
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_MODULES", {})
    return tmp_path / "cache"


def randn(cp, shape, dtype=np.float16, seed=0):
    return cp.random.default_rng(seed).standard_normal(shape, dtype=cp.float32).astype(dtype)


def qkv(cp, b=2, sq=37, sk=53, h=4, hk=2, d=64, dtype=np.float16):
    return (randn(cp, (b, sq, h, d), dtype, 1), randn(cp, (b, sk, hk, d), dtype, 2),
            randn(cp, (b, sk, hk, d), dtype, 3))


def assert_close_to_reference(cp, q, k, v, out, lse=None, causal=False, dtype="float16"):
    from flashkit.call.dtypes import BY_NAME
    from flashkit.verify.reference import plain_attention, reference_attention, rounding_atol
    from flashkit.verify.harness import judge
    scale = q.shape[-1] ** -0.5
    ref, lse_ref = reference_attention(q, k, v, scale=scale, causal=causal)
    plain, lse_plain = plain_attention(q, k, v, scale=scale, dtype=BY_NAME[dtype], causal=causal)
    res = judge("api", "api", out, ref, plain, rounding_atol(ref, BY_NAME[dtype]), lse, lse_ref, lse_plain)
    assert res.passed, res


# --- bad inputs on real arrays ---------------------------------------------------------------------------

BAD = [
    ("q-on-host", lambda cp, q, k, v: (cp.asnumpy(q), k, v), {}, "q", "on the CPU"),
    ("q-float64", lambda cp, q, k, v: (q.astype(cp.float64), k, v), {}, "q", "dtype float64"),
    ("k-int32", lambda cp, q, k, v: (q, k.astype(cp.int32), v), {}, "k", "dtype int32"),
    ("dtypes-differ", lambda cp, q, k, v: (q, k, v.astype(cp.float32)), {}, "k, v", "must match"),
    ("rank3", lambda cp, q, k, v: (q[0], k, v), {}, "q", "expected 4 dims"),
    ("batch", lambda cp, q, k, v: (q[:1], k, v), {}, "k", "batch must match"),
    ("head-dim", lambda cp, q, k, v: (q[..., :32], k, v), {}, "k", "head_dim must match"),
    ("heads", lambda cp, q, k, v: (q[:, :, :3], k, v), {}, "k", "must divide"),
    ("last-dim-strided", lambda cp, q, k, v: (cp.concatenate([q, q], -1)[..., ::2], k, v), {}, "q", "contiguous"),
    ("empty", lambda cp, q, k, v: (q[:, :0], k, v), {}, "q", ">= 1"),
    ("scale", lambda cp, q, k, v: (q, k, v), {"softmax_scale": float("nan")}, "softmax_scale", "finite"),
    ("causal", lambda cp, q, k, v: (q, k, v), {"causal": 1}, "causal", "True or False"),
    ("out-shape", lambda cp, q, k, v: (q, k, v), {"out": "SHAPE"}, "out", "expected shape"),
    ("out-dtype", lambda cp, q, k, v: (q, k, v), {"out": "DTYPE"}, "out", "expected shape"),
]


@pytest.mark.parametrize("edit,kwargs,arg,detail", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_cupy_inputs(cp, no_compile_or_launch, edit, kwargs, arg, detail):
    q, k, v = edit(cp, *qkv(cp))
    if kwargs.get("out") == "SHAPE":
        kwargs = {"out": cp.empty((1, 2, 3, 4), dtype=cp.float16)}
    elif kwargs.get("out") == "DTYPE":
        kwargs = {"out": cp.empty(q.shape, dtype=cp.float32)}
    with pytest.raises(InputError) as info:
        flashkit.attention(q, k, v, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and msg.split(": ")[0] == arg and detail in msg, msg


def test_bad_torch_inputs(torch, no_compile_or_launch):
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(InputError, match=r"^q: expected a CUDA array, got torch.Tensor on the CPU"):
        flashkit.attention(q.cpu(), q, q)
    with pytest.raises(InputError, match=r"^k: dtype float64 is not supported"):
        flashkit.attention(q, q.double(), q.double())
    with pytest.raises(InputError, match=r"^v: the last \(head_dim\) dimension must be contiguous"):
        flashkit.attention(q, q, q.transpose(1, 3).contiguous().transpose(1, 3))
    with pytest.raises(InputError, match=r"^k, v: dtypes must match"):
        flashkit.attention(q, q.bfloat16(), q.bfloat16())
    with pytest.raises(InputError, match=r"^q: dtype torch.complex64 is not supported"):
        flashkit.attention(q.to(torch.complex64), q, q)


# --- the compile cache -----------------------------------------------------------------------------------

def test_compile_cache(monkeypatch, fresh_cache):
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get("standard")
    cc = device_info().cc
    config = build.make_config(spec, "float16", 64, False, cc)
    first = build.build_module(spec, config, cc)
    cubins = list(fresh_cache.glob("standard-*.cubin"))
    assert len(cubins) == 1 and cubins[0].read_bytes()[:4] == b"\x7fELF"
    assert len(first.functions) == len(spec.entries)
    assert build.build_module(spec, config, cc) is first          # cached in memory

    def no_compile(*a, **k):
        raise AssertionError("the cubin on disk must be reused")
    monkeypatch.setattr(build, "compile_variant", no_compile)
    monkeypatch.setattr(build, "_MODULES", {})                   # as a new process would start
    again = build.build_module(spec, config, cc)
    assert again is not first and len(again.functions) == len(spec.entries)
    assert list(fresh_cache.glob("standard-*.cubin")) == cubins


def test_attention_compiles_once(cp, monkeypatch, fresh_cache):
    compiles = []
    real = build.compile_variant

    def counting(*args):
        compiles.append(args[1])
        return real(*args)
    monkeypatch.setattr(build, "compile_variant", counting)
    q, k, v = qkv(cp)
    flashkit.attention(q, k, v, variant="standard")
    flashkit.attention(q, k, v, variant="standard")
    q2, k2, v2 = qkv(cp, b=1, sq=5, sk=9)                       # another shape, same specialization
    flashkit.attention(q2, k2, v2, variant="standard")
    assert len(compiles) == 1, compiles
    flashkit.attention(q, k, v, variant="standard", causal=True)
    assert len(compiles) == 2 and compiles[-1].causal
    assert len(list(fresh_cache.glob("*.cubin"))) == 2


# --- results ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [None, "standard"], ids=["selected", "standard"])
def test_cupy_result_and_return_lse(cp, variant):
    q, k, v = qkv(cp)
    out = flashkit.attention(q, k, v, variant=variant)
    assert isinstance(out, cp.ndarray) and out.shape == q.shape and out.dtype == q.dtype
    out2, lse = flashkit.attention(q, k, v, variant=variant, return_lse=True, causal=True)
    assert out2.shape == q.shape
    assert isinstance(lse, cp.ndarray) and lse.dtype == cp.float32
    assert lse.shape == (2, 4, 37) and lse.flags.c_contiguous
    assert_close_to_reference(cp, q, k, v, out)
    assert_close_to_reference(cp, q, k, v, out2, lse, causal=True)


def test_fully_masked_rows_through_the_api(cp):
    q, k, v = qkv(cp, sq=40, sk=8)                                # causal: rows 0..31 see no key
    out, lse = flashkit.attention(q, k, v, causal=True, return_lse=True, variant="standard")
    assert not bool(cp.isnan(out).any()) and bool((out[:, :32] == 0).all())
    assert bool(cp.isneginf(lse[:, :, :32]).all()) and bool(cp.isfinite(lse[:, :, 32:]).all())


def test_out_argument_is_written_in_place(cp):
    q, k, v = qkv(cp)
    buf = cp.full(q.shape, cp.nan, dtype=q.dtype)
    out = flashkit.attention(q, k, v, out=buf, variant="standard")
    assert out.data.ptr == buf.data.ptr
    assert not bool(cp.isnan(buf).any())


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_torch_tensors_zero_copy(cp, torch, dtype_name):
    from flashkit.call.arrays import to_cupy
    tdtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 37, 4, 64, device="cuda", dtype=tdtype, generator=g)
    k = torch.randn(2, 53, 2, 64, device="cuda", dtype=tdtype, generator=g)
    v = torch.randn(2, 53, 2, 64, device="cuda", dtype=tdtype, generator=g)
    for t in (q, k, v):
        assert to_cupy(t, "q").data.ptr == t.data_ptr()           # a view, not a copy
    out, lse = flashkit.attention(q, k, v, return_lse=True)
    assert isinstance(out, cp.ndarray) and out.shape == tuple(q.shape) and isinstance(lse, cp.ndarray)
    assert str(out.dtype) == dtype_name
    qc, kc, vc = (to_cupy(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    assert_close_to_reference(cp, qc, kc, vc, out, lse, dtype=dtype_name)
    o = torch.full_like(q, float("nan"))
    res = flashkit.attention(q, k, v, out=o)
    assert res.data.ptr == o.data_ptr()                          # written into the torch tensor
    torch.cuda.synchronize()
    assert not torch.isnan(o).any()
    assert torch.equal(torch.from_dlpack(res), o)


@pytest.mark.parametrize("variant", ["standard", "fa1", "fa2", "causal", "hopper"])
def test_negative_softmax_scale(cp, variant):
    """A negative softmax_scale (valid: finite, non-zero) matches the reference on every dense variant."""
    from flashkit.verify.reference import reference_attention
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(variant)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{variant} needs compute capability {spec.arch_requirement()}")
    rng = cp.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 200, 2, 64), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    q_before = q.copy()
    out, lse = flashkit.attention(q, k, v, softmax_scale=-0.3, variant=variant, return_lse=True,
                                  causal=variant == "causal")
    ref, lse_ref = reference_attention(*(cp.asnumpy(x).astype(np.float64) for x in (q, k, v)), scale=-0.3,
                                       causal=variant == "causal")
    assert not bool(cp.isnan(out.astype(cp.float32)).any())
    np.testing.assert_allclose(cp.asnumpy(out.astype(cp.float32)), ref, atol=1e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), lse_ref, atol=1e-3)
    assert bool((q == q_before).all())   # the caller's q is untouched
