"""Drop-in functors (mods/*.cu) fused into fa2, causal and fa3 (score_mods also into block_sparse and
block_sparse_hopper, under a block mask), against the float64 reference with each functor's
Python reference applied (DESIGN.md's rule), over a trimmed shape matrix; a functor without a reference runs; a
functor that does not compile raises one CompileError naming its file and line.
"""

from __future__ import annotations

import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.harness import Shape
from flashkit.verify.functors import functor_checks

pytestmark = pytest.mark.gpu

# A one-row query, batch > 1, odd lengths, seqlen_q != seqlen_k both ways, GQA 8:1 and MQA, 4097 keys.
SHAPES = (Shape(1, 1, 1, 1, 1), Shape(2, 17, 17, 4, 4), Shape(3, 128, 128, 8, 1), Shape(1, 1000, 1000, 16, 2),
          Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8), Shape(1, 300, 4097, 8, 1))
SHIPPED = ("document", "prefix_lm", "relative_bias")


def _params():
    cat = discover_kernels()
    specs = [cat.specs[n] for n in ("fa2", "causal", "fa3", "block_sparse", "block_sparse_hopper")]
    out = []
    for mod in SHIPPED:
        checks = functor_checks(cat.mods[mod], specs, ["bfloat16"], [64, 128], shapes=SHAPES)
        # a score_mod also under the block-sparse forwards' block masks
        sparse = {"block_sparse", "block_sparse_hopper"} if not cat.mods[mod].mask else set()
        assert {c.variant for c in checks} == {"fa2", "causal", "fa3"} | sparse, mod
        out += [pytest.param(c, id=f"{c.variant}: {c.label}") for c in checks]
    return out


@pytest.mark.parametrize("check", _params())
def test_shipped_functor(check):
    from flashkit.cli.verify_cmd import format_result
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(check.variant)
    if not spec.runs_on(device_info().cc):
        pytest.skip(f"{check.variant} needs compute capability {spec.arch_requirement()}")
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.passed, format_result(result)


def _user_dir(tmp_path, monkeypatch, name, body):
    d = tmp_path / "kernels"
    (d / "mods").mkdir(parents=True)
    (d / "mods" / f"{name}.cu").write_text(
        f"/*---\nname: {name}\nkind: modification\nsummary: a test functor\nfunctions: [score_mod]\n---*/\n" + body)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(d))
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "cache"))
    discover_kernels(refresh=True)
    return d


def test_functor_without_reference_runs_and_matches_by_hand(tmp_path, monkeypatch):
    """A user functor (FLASHKIT_KERNEL_PATH/mods) with no .py: attention runs it; verify cannot check it."""
    import cupy

    import flashkit
    from flashkit.errors import UnsupportedError
    from flashkit.verify.functors import load_reference
    from flashkit.verify.reference import reference_attention
    _user_dir(tmp_path, monkeypatch, "halve", "__device__ float score_mod(float s, int b, int h, int i, int j, "
              "const flashkit::ModArgs& a) { return 0.5f * s; }\n")
    try:
        rng = cupy.random.default_rng(3)
        q, k, v = (rng.standard_normal((2, 130, 4, 64), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
        out = flashkit.attention(q, k, v, mod="halve")
        ref, _ = reference_attention(q, k, v, scale=0.5 * 64 ** -0.5)
        assert float(cupy.abs(out.astype(cupy.float64) - ref).max()) < 2e-2
        with pytest.raises(UnsupportedError, match="cannot check it: no Python reference"):
            load_reference(discover_kernels().get_mod("halve"))
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_functor_that_does_not_compile_names_file_and_line(tmp_path, monkeypatch):
    import cupy

    import flashkit
    from flashkit.errors import CompileError
    _user_dir(tmp_path, monkeypatch, "broken", "__device__ float score_mod(float s, int b, int h, int i, int j,\n"
              "        const flashkit::ModArgs& a) {\n    return s + undefined_name;\n}\n")
    try:
        q = cupy.ones((1, 64, 2, 64), dtype=cupy.float16)
        with pytest.raises(CompileError) as info:
            flashkit.attention(q, q, q, mod="broken")
        first = str(info.value).splitlines()[0]
        assert "broken.cu:9: error:" in first and "undefined_name" in first, first
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_document_mask_skips_tiles_between_documents():
    """Two documents of a row: the classifier keeps no tile of the cross-document block, and a call with one
    document is the plain causal kernel's answer."""
    import cupy
    import ml_dtypes

    import flashkit
    rng = cupy.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 512, 2, 64), dtype=cupy.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
    one_doc = cupy.zeros((1, 512), dtype=cupy.int32)
    a = flashkit.attention(q, k, v, causal=True, variant="causal", mod="document", mod_args={"doc_ids": one_doc})
    b = flashkit.attention(q, k, v, causal=True, variant="causal")
    assert float(cupy.abs(a.astype(cupy.float32) - b.astype(cupy.float32)).max()) < 1e-2
    two = cupy.concatenate([cupy.zeros((1, 256), cupy.int32), cupy.ones((1, 256), cupy.int32)], axis=1)
    c = flashkit.attention(q, k, v, mod="document", mod_args={"doc_ids": two}, variant="fa2")
    first = flashkit.attention(q[:, :256], k[:, :256], v[:, :256], variant="fa2")
    assert float(cupy.abs(c[:, :256].astype(cupy.float32) - first.astype(cupy.float32)).max()) < 1e-2


def test_cached_functor_calls_follow_their_arguments(monkeypatch):
    """A repeated functor signature takes the cached path (no validation): it must read this call's arguments (new
    slopes, document ids rewritten in place) and classify a mask_mod's tiles again."""
    import cupy
    import ml_dtypes

    import flashkit
    import flashkit.api as api
    from flashkit.runtime.call_cache import CALLS
    CALLS.clear()
    validated = []
    real = api.validate_inputs
    monkeypatch.setattr(api, "validate_inputs", lambda *a, **k: validated.append(1) or real(*a, **k))
    rng = cupy.random.default_rng(9)
    n, half = 640, 320
    q, k, v = (rng.standard_normal((1, n, 4, 128), dtype=cupy.float32).astype(ml_dtypes.bfloat16) for _ in range(3))

    def close(x, y):
        return float(cupy.abs(x.astype(cupy.float32) - y.astype(cupy.float32)).max()) < 1e-2

    def functor_call(cached: bool, **kw):
        before = len(validated)
        out = flashkit.attention(q, k, v, **kw)
        assert (len(validated) == before) == cached, "cached" if cached else "validated"
        return out

    ids = cupy.zeros((1, n), dtype=cupy.int32)
    one = functor_call(False, causal=True, mod="document", mod_args={"doc_ids": ids})
    assert close(one, flashkit.attention(q, k, v, causal=True))
    ids[:, half:] = 1   # the same array, two documents now
    two = functor_call(True, causal=True, mod="document", mod_args={"doc_ids": ids})
    assert close(two[:, :half], flashkit.attention(q[:, :half], k[:, :half], v[:, :half], causal=True))
    assert close(two[:, half:], flashkit.attention(q[:, half:], k[:, half:], v[:, half:], causal=True))
    for i, slopes in enumerate((cupy.full((4,), 0.5, cupy.float32), cupy.linspace(0.1, 1.0, 4, dtype=cupy.float32))):
        got = functor_call(i > 0, mod="relative_bias", mod_args={"slopes": slopes})
        assert close(got, flashkit.attention(q, k, v, alibi_slopes=slopes))
