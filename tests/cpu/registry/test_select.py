"""registry/select.py: selection by priority, every reason with exact bounds, forced variants, requires."""

from __future__ import annotations

import pytest

from flashkit.errors import FlashkitError, UnsupportedError
from flashkit.registry.select import Request, reasons, select_kernel
from ..synth import spec_of

RANGE = {"min": 8, "max": 256, "multiple_of": 8}


@pytest.fixture
def specs(tmp_path):
    """fast (fp16/bf16, hd 64/128/256, sm80+, prio 50), slow (every dtype, range of hd, sm75+, prio 0)."""
    fast = spec_of(tmp_path, "fast", priority=50)
    slow = spec_of(tmp_path, "slow", priority=0, arch={"min": "7.5"}, dtypes=["float16", "bfloat16", "float32"],
                   head_dims=RANGE)
    return {"fast": fast, "slow": slow}


def req(**kw) -> Request:
    kw.setdefault("dtype", "float16")
    kw.setdefault("head_dim", 128)
    kw.setdefault("cc", (8, 0))
    return Request(**kw)


def test_highest_priority_wins(specs):
    sel = select_kernel(req(), specs)
    assert sel.chosen is specs["fast"]
    assert sel.outranked == ["slow"]
    assert sel.rejected == {}


def test_priority_not_file_order(tmp_path):
    specs = {n: spec_of(tmp_path, n, priority=p) for n, p in (("a", 1), ("b", 9), ("c", 5))}
    sel = select_kernel(req(), specs)
    assert sel.chosen.name == "b"
    assert sel.outranked == ["c", "a"]


def test_equal_priority_breaks_ties_by_name(tmp_path):
    specs = {n: spec_of(tmp_path, n, priority=5) for n in ("zeta", "alpha")}
    assert select_kernel(req(), specs).chosen.name == "alpha"


def test_fallback_when_the_fast_one_does_not_fit(specs):
    sel = select_kernel(req(head_dim=96), specs)
    assert sel.chosen is specs["slow"]
    assert sel.rejected == {"fast": ["head_dim=96 not supported: supported 64, 128, 256"]}
    assert sel.outranked == []


REASON_CASES = [
    (dict(head_dim=96), {}, "head_dim=96 not supported: supported 64, 128, 256"),
    (dict(head_dim=12), dict(head_dims=RANGE), "head_dim=12 not supported: supported multiples of 8 from 8 to 256"),
    (dict(head_dim=264), dict(head_dims=RANGE),
     "head_dim=264 not supported: supported multiples of 8 from 8 to 256"),
    (dict(dtype="float32"), {}, "dtype=float32 not supported: supported float16, bfloat16"),
    (dict(cc=(7, 5)), {}, "needs compute capability >= 8.0; device has 7.5"),
    (dict(cc=(8, 6)), dict(arch={"min": "9.0"}), "needs compute capability >= 9.0; device has 8.6"),
    (dict(cc=(10, 0)), dict(arch={"min": "9.0", "max": "9.0"}),
     "needs compute capability <= 9.0 (architecture-specific instructions); device has 10.0"),
    (dict(causal=True), dict(features={"causal": False}), "causal masks not supported"),
    (dict(block_sparse=True), {}, "block masks not supported"),
    (dict(fp8=True), {}, "fp8 inputs not supported"),
    (dict(backward=True), {}, "the backward pass not supported"),
    (dict(lse=True), dict(features={"lse": False}), "return_lse not supported"),
    (dict(heads=8, kv_heads=1), dict(features={"gqa": False}), "GQA/MQA (kv_heads < heads) not supported"),
    (dict(), dict(requires={"causal": True}), "only runs with causal masks (causal=True)"),
    (dict(block_sparse=False), dict(requires={"block_sparse": True}),
     "only runs with block masks (block_sparse=True)"),
    (dict(causal=True), dict(requires={"causal": False}), "only runs without causal masks (causal=False)"),
    (dict(fp8=True), dict(features={"fp8": True}, requires={"fp8": False}),
     "only runs without fp8 inputs (fp8=False)"),
]


@pytest.mark.parametrize("request_kw,spec_kw,expected", REASON_CASES, ids=[c[2] for c in REASON_CASES])
def test_each_reason_exact(tmp_path, request_kw, spec_kw, expected):
    spec = spec_of(tmp_path, "toy", **spec_kw)
    assert reasons(spec, req(**request_kw)) == [expected]


def test_every_reason_not_just_the_first(tmp_path):
    spec = spec_of(tmp_path, "toy", features={"causal": False, "gqa": False})
    got = reasons(spec, req(dtype="float32", head_dim=96, cc=(7, 0), causal=True, heads=4, kv_heads=2, fp8=True))
    assert got == ["needs compute capability >= 8.0; device has 7.0",
                   "dtype=float32 not supported: supported float16, bfloat16",
                   "head_dim=96 not supported: supported 64, 128, 256",
                   "causal masks not supported",
                   "fp8 inputs not supported",
                   "GQA/MQA (kv_heads < heads) not supported"]


def test_no_device_means_no_arch_reason(tmp_path):
    spec = spec_of(tmp_path, "toy", arch={"min": "9.0"})
    assert reasons(spec, req(cc=None)) == []


def test_requires_met(tmp_path):
    spec = spec_of(tmp_path, "toy", requires={"causal": True}, features={"causal": True})
    assert reasons(spec, req(causal=True)) == []
    assert reasons(spec, req(causal=False)) == ["only runs with causal masks (causal=True)"]


def test_requires_keys_steer_selection(tmp_path):
    specs = {"causal_only": spec_of(tmp_path, "causal_only", priority=90, requires={"causal": True}),
             "dense": spec_of(tmp_path, "dense", priority=50)}
    assert select_kernel(req(causal=True), specs).chosen.name == "causal_only"
    sel = select_kernel(req(causal=False), specs)
    assert sel.chosen.name == "dense"
    assert sel.rejected == {"causal_only": ["only runs with causal masks (causal=True)"]}


def test_forced_variant_beats_priority(specs):
    sel = select_kernel(req(), specs, variant="slow")
    assert sel.chosen is specs["slow"]
    assert sel.outranked == ["fast"]


def test_forced_variant_that_does_not_fit(specs):
    with pytest.raises(UnsupportedError) as info:
        select_kernel(req(head_dim=96, dtype="float32"), specs, variant="fast")
    err = info.value
    why = ["dtype=float32 not supported: supported float16, bfloat16",
           "head_dim=96 not supported: supported 64, 128, 256"]
    assert err.reasons == {"fast": why}
    assert "variant 'fast' cannot run" in str(err)
    assert all(w in str(err) for w in why)
    assert req(head_dim=96, dtype="float32").summary() in str(err)


def test_forced_unknown_variant(specs):
    with pytest.raises(UnsupportedError, match=r"variant='nope' is not a known variant; known: fast, slow"):
        select_kernel(req(), specs, variant="nope")


def test_nothing_fits_carries_every_candidates_reasons(specs):
    r = req(dtype="float32", head_dim=7, cc=(7, 5))
    with pytest.raises(UnsupportedError) as info:
        select_kernel(r, specs)
    err = info.value
    assert isinstance(err, FlashkitError)
    assert err.reasons == {
        "fast": ["needs compute capability >= 8.0; device has 7.5",
                 "dtype=float32 not supported: supported float16, bfloat16",
                 "head_dim=7 not supported: supported 64, 128, 256"],
        "slow": ["head_dim=7 not supported: supported multiples of 8 from 8 to 256"],
    }
    msg = str(err)
    assert msg.startswith(f"no kernel supports {r.summary()}")
    for name, why in err.reasons.items():
        assert f"{name}: {'; '.join(why)}" in msg
    assert "\n" not in msg


def test_hints(specs):
    with pytest.raises(UnsupportedError, match=r"hint: the flash variants need an Ampere or newer GPU"):
        select_kernel(req(cc=(7, 0), head_dim=7), specs)
    with pytest.raises(UnsupportedError, match=r"hint: the flash variants take float16 or bfloat16"):
        select_kernel(req(dtype="float32", head_dim=7), specs)


def test_no_variants_at_all():
    with pytest.raises(UnsupportedError) as info:
        select_kernel(req(), {})
    assert info.value.reasons == {}


def test_request_summary():
    r = Request(dtype="bfloat16", head_dim=128, seqlen_q=17, seqlen_k=33, heads=8, kv_heads=2, batch=3,
                causal=True, lse=True, cc=(9, 0))
    assert r.summary() == ("dtype=bfloat16 head_dim=128 batch=3 heads=8 kv_heads=2 seqlen_q=17 seqlen_k=33 "
                           "causal lse on sm_90")
    assert Request(dtype="float16", head_dim=64).summary() == \
        "dtype=float16 head_dim=64 batch=1 heads=1 seqlen_q=1 seqlen_k=1 on no device"


def test_report_lists_choice_outranked_and_rejected(tmp_path, specs):
    specs = dict(specs, tiny=spec_of(tmp_path, "tiny", head_dims=[32]))
    sel = select_kernel(req(), specs)
    assert sel.report().splitlines() == [
        f"request: {req().summary()}",
        "selected: fast (priority 50)",
        "  slow: fits, lower priority",
        "  tiny: head_dim=128 not supported: supported 32",
    ]


def test_the_registered_kernels_by_architecture():
    """On the real registry: fa3 (TMA + wgmma) wins bf16 / f16 on 9.0 only, fa2 / causal elsewhere."""
    from flashkit.registry import discover_kernels
    specs = discover_kernels(refresh=True).specs
    fa3, hopper = specs["fa3"], specs["hopper"]
    for spec in (fa3, hopper):
        assert spec.arch_min == spec.arch_max == (9, 0) and spec.target((9, 0)) == "sm_90a"
        assert spec.workspace == "none"   # V read as it is (no pre-pass)
    assert fa3.grids == ("tiles",) and hopper.grids == ("q_blocks",)
    assert set(fa3.tensor_maps) == {"q", "k", "v", "o"}

    def chosen(cc, causal=False, head_dim=128, dtype="bfloat16"):
        req = Request(dtype=dtype, head_dim=head_dim, causal=causal, cc=cc, seqlen_q=1024, seqlen_k=1024)   # prefill
        return select_kernel(req, specs).chosen.name

    for causal in (False, True):
        for head_dim in (64, 96, 128, 192, 256):
            assert chosen((9, 0), causal, head_dim) == "fa3"
        assert chosen((9, 0), causal, head_dim=64, dtype="float16") == "fa3"
        assert chosen((8, 0), causal) == ("causal" if causal else "fa2")
        assert chosen((10, 0), causal) == ("causal" if causal else "fa2")
        assert chosen((8, 0), causal, head_dim=96) == ("causal" if causal else "fa2")   # head-dim class 96
        for head_dim in (8, 40, 80, 200):   # fa3's classes too: 80 runs at 96, zero-filled by TMA's out-of-bounds fill
            assert chosen((9, 0), causal, head_dim) == "fa3"
        assert chosen((9, 0), causal, head_dim=96, dtype="float32") == "standard"
    assert any("needs compute capability <= 9.0" in r for r in reasons(fa3, Request(
        dtype="bfloat16", head_dim=128, cc=(10, 0))))


def test_tma_kernels_need_the_driver_binding(monkeypatch):
    """Without cuda-bindings a kernel taking tensor maps is rejected with the reason, and the next one runs."""
    from flashkit.registry import discover_kernels
    from flashkit.runtime import tma
    monkeypatch.setattr(tma, "binding_missing", lambda: tma.MISSING_BINDING)
    monkeypatch.setattr("flashkit.registry.select.binding_missing", tma.binding_missing)
    specs = discover_kernels(refresh=True).specs
    sel = select_kernel(Request(dtype="bfloat16", head_dim=128, cc=(9, 0), seqlen_q=1024, seqlen_k=1024), specs)
    assert sel.chosen.name == "hopper" and sel.rejected["fa3"] == [tma.MISSING_BINDING]
