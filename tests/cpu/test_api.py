"""api.py: attention() refuses bad inputs before any compile or launch; explain(); variants()."""

from __future__ import annotations

import pytest

import flashkit
import flashkit.api as api
import flashkit.runtime.build as build
import flashkit.runtime.launch as launch_mod
import flashkit.runtime.nvrtc as nvrtc
from flashkit.errors import DeviceError, FallbackWarning, InputError, UnsupportedError
from flashkit.registry.discover import Catalogue
from flashkit.registry.select import Request
from flashkit.runtime.device import DeviceInfo, device_count
from .synth import cuda, qkv, spec_of

FAKE_DEVICE = DeviceInfo(0, "Fake A100", (8, 0), 108, 163 * 1024, 12000, 12000)


@pytest.fixture
def no_compile_or_launch(monkeypatch):
    """Any compile or launch fails the test; returns the list of what was attempted."""
    attempts = []

    def forbid(what):
        def fail(*args, **kwargs):
            attempts.append(what)
            raise AssertionError(f"{what} was called: validation must come first")
        return fail
    for module, name in ((build, "build_module"), (build, "compile_variant"), (build, "ensure_cubin"),
                         (nvrtc, "compile_cubin"), (launch_mod, "launch"),
                         (api, "build_module"), (api, "launch"), (api, "run")):
        monkeypatch.setattr(module, name, forbid(f"{module.__name__}.{name}"))
    return attempts


@pytest.fixture
def toy_catalogue(monkeypatch, tmp_path):
    """api sees two synthetic variants: fast (prio 50, fp16/bf16, hd 64/128/256, sm80) and slow (prio 0)."""
    specs = {"fast": spec_of(tmp_path, "fast", priority=50),
             "slow": spec_of(tmp_path, "slow", priority=0, arch={"min": "7.5"},
                             dtypes=["float16", "bfloat16", "float32"],
                             head_dims={"min": 8, "max": 256, "multiple_of": 8})}
    monkeypatch.setattr(api, "discover_kernels", lambda refresh=False: Catalogue(specs))
    return specs


@pytest.mark.parametrize("kwargs,build_inputs,arg", [
    ({}, lambda: (cuda((2, 17, 4, 64), "<f8"), *qkv()[1:]), "q"),
    ({}, lambda: qkv((2, 17, 6, 64), (2, 33, 4, 64)), "k"),
    ({"causal": "yes"}, qkv, "causal"),
    ({"softmax_scale": float("nan")}, qkv, "softmax_scale"),
    ({"return_lse": 1}, qkv, "return_lse"),
], ids=["dtype", "heads", "causal", "scale", "return_lse"])
def test_bad_inputs_fail_before_compile_or_launch(no_compile_or_launch, kwargs, build_inputs, arg):
    with pytest.raises(InputError, match=rf"^{arg}: "):
        flashkit.attention(*build_inputs(), **kwargs)
    assert no_compile_or_launch == []


@pytest.mark.skipif(device_count() > 0, reason="this machine has a CUDA device")
def test_valid_inputs_without_a_device_raise_device_error(no_compile_or_launch):
    with pytest.raises(DeviceError, match="no CUDA device"):
        flashkit.attention(*qkv())
    assert no_compile_or_launch == []


def test_request_built_from_the_inputs(monkeypatch, no_compile_or_launch, toy_catalogue):
    seen = []

    class Stop(Exception):
        pass

    def fake_select(req, specs, variant=None):
        seen.append((req, variant))
        raise Stop
    monkeypatch.setattr(api, "device_info", lambda *a: FAKE_DEVICE)
    monkeypatch.setattr(api, "select_kernel", fake_select)
    with pytest.raises(Stop):
        flashkit.attention(*qkv((3, 17, 8, 128), (3, 40, 2, 128), "<f4"), causal=True, return_lse=True,
                           variant="slow")
    assert seen == [(Request(dtype="float32", head_dim=128, seqlen_q=17, seqlen_k=40, heads=8, kv_heads=2,
                             batch=3, causal=True, block_sparse=False, fp8=False, backward=False, lse=True,
                             cc=(8, 0)), "slow")]
    assert no_compile_or_launch == []


def test_unsupported_request_fails_before_compile(monkeypatch, no_compile_or_launch, toy_catalogue):
    monkeypatch.setattr(api, "device_info", lambda *a: FAKE_DEVICE)
    with pytest.raises(UnsupportedError) as info:
        flashkit.attention(*qkv((1, 5, 2, 12), (1, 5, 2, 12)))     # head_dim 12: nobody
    assert set(info.value.reasons) == {"fast", "slow"}
    with pytest.raises(UnsupportedError, match="variant 'fast' cannot run"):
        flashkit.attention(*qkv(typestr="<f4"), variant="fast")
    assert no_compile_or_launch == []


def test_a_fallback_to_the_baseline_warns_before_compile(monkeypatch, no_compile_or_launch, toy_catalogue):
    class Stop(Exception):
        pass

    def stop():
        raise Stop
    monkeypatch.setattr(api, "device_info", lambda *a: FAKE_DEVICE)
    monkeypatch.setattr(api, "cupy_module", stop)   # the first step after selection
    with pytest.warns(FallbackWarning, match=r"head_dim=96 .*baseline kernel 'slow'.* -- fast: head_dim=96 not supported"):
        with pytest.raises(Stop):
            flashkit.attention(*qkv((1, 5, 2, 96), (1, 5, 2, 96)))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # forced, or float32 (no faster kernel takes it): no warning
        for kwargs, typestr in (({"variant": "slow"}, "<f2"), ({}, "<f4")):
            with pytest.raises(Stop):
                flashkit.attention(*qkv((1, 5, 2, 96), (1, 5, 2, 96), typestr), **kwargs)
    assert no_compile_or_launch == []


# --- explain() ---------------------------------------------------------------------------------------

def test_explain_selects_and_reports(toy_catalogue):
    sel = flashkit.explain(dtype="float16", head_dim=96, cc=(8, 0), heads=8, seqlen_q=100)
    assert sel.chosen.name == "slow"
    assert sel.rejected == {"fast": ["head_dim=96 not supported: supported 64, 128, 256"]}
    assert sel.request == Request(dtype="float16", head_dim=96, seqlen_q=100, seqlen_k=100, heads=8, kv_heads=8,
                                  batch=1, cc=(8, 0))
    assert sel.report().splitlines() == [
        "request: dtype=float16 head_dim=96 batch=1 heads=8 seqlen_q=100 seqlen_k=100 on sm_80",
        "selected: slow (priority 0)",
        "  tiles on sm_80: block_m=64 block_n=64 warps=4",
        "  warning: dtype=float16 head_dim=96 batch=1 heads=8 seqlen_q=100 seqlen_k=100 on sm_80 runs on the baseline "
        "kernel 'slow' (unfused, O(seqlen^2) memory): no faster kernel fits -- fast: head_dim=96 not supported: "
        "supported 64, 128, 256",
        "  fast: head_dim=96 not supported: supported 64, 128, 256"]


def test_explain_defaults(toy_catalogue):
    sel = flashkit.explain()
    assert sel.request == Request(dtype="bfloat16", head_dim=128, seqlen_q=1024, seqlen_k=1024, heads=16,
                                  kv_heads=16, batch=1, cc=None)
    assert sel.chosen.name == "fast" and sel.outranked == ["slow"]


def test_explain_fp8_dtype_implies_fp8(toy_catalogue):
    with pytest.raises(UnsupportedError) as info:
        flashkit.explain(dtype="float8_e4m3", head_dim=128)
    assert "fp8 inputs not supported" in info.value.reasons["fast"]


def test_explain_forced_and_unfit(toy_catalogue):
    assert flashkit.explain(variant="slow", cc=(9, 0)).chosen.name == "slow"
    with pytest.raises(UnsupportedError) as info:
        flashkit.explain(variant="fast", cc=(7, 5), causal=True, kv_heads=4, dtype="float32")
    assert info.value.reasons == {"fast": ["needs compute capability >= 8.0; device has 7.5",
                                           "dtype=float32 not supported: supported float16, bfloat16"]}


def test_explain_unknown_dtype(toy_catalogue):
    with pytest.raises(InputError, match=r"^dtype: unknown dtype 'float64'"):
        flashkit.explain(dtype="float64")


def test_explain_accepts_dtype_aliases(toy_catalogue):
    assert flashkit.explain(dtype="bf16", cc=(8, 0)).request.dtype == "bfloat16"
    assert flashkit.explain(dtype="fp16", cc=(8, 0)).request.dtype == "float16"


def test_explain_nothing_fits(toy_catalogue):
    with pytest.raises(UnsupportedError) as info:
        flashkit.explain(dtype="float32", head_dim=7, cc=(8, 0))
    assert set(info.value.reasons) == {"fast", "slow"}


def test_explain_launches_nothing(no_compile_or_launch):
    flashkit.explain(dtype="float16", head_dim=64, cc=(8, 0))      # the real registry
    assert no_compile_or_launch == []


def test_explain_on_the_builtin_registry():
    # standard is the universal fallback: every dtype it declares, any head dim in its range, sm_75+.
    sel = flashkit.explain(dtype="float32", head_dim=40, cc=(7, 5), causal=True, kv_heads=2, heads=8)
    assert sel.chosen.name == "standard"
    for name, why in sel.rejected.items():
        assert why, name


# --- variants() -----------------------------------------------------------------------------------------

def test_variants_sorted_by_priority_then_name(monkeypatch, variant_dir):
    variant_dir.write("zzz_top", priority=1000)
    variant_dir.write("aaa_top", priority=1000)
    variant_dir.write("bottom", priority=-5)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    names = [s.name for s in flashkit.variants()]
    assert names[:2] == ["aaa_top", "zzz_top"] and names[-1] == "bottom"
    assert "standard" in names
    prios = [s.priority for s in flashkit.variants()]
    assert prios == sorted(prios, reverse=True)


def test_public_names():
    for name in flashkit.__all__:
        if name in ("BlockMask", "quantize_fp8"):
            continue    # lazy: written by the block-sparse and fp8 work
        assert getattr(flashkit, name) is not None, name
    with pytest.raises(AttributeError):
        flashkit.no_such_name  # noqa: B018
    assert issubclass(flashkit.InputError, ValueError)
