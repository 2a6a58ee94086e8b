"""verify/functors.py on NumPy: the shipped references against element-by-element loops, and what verify says of a
functor it cannot check."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.errors import UnsupportedError
from flashkit.registry import discover_kernels
from flashkit.verify.functors import functor_terms, load_reference, reference_args
from flashkit.verify.harness import Shape
from flashkit.verify.reference import reference_attention

SHAPE = Shape(2, 5, 9, 3, 3)


def terms(name, seed=0):
    spec = discover_kernels().get_mod(name)
    module = load_reference(spec)
    args = reference_args(spec, module, SHAPE, seed, np)
    return args, functor_terms(spec, module, SHAPE, args, np)


def test_document_reference_matches_loops():
    args, (mask, score_fn) = terms("document", seed=3)
    doc, off = args["doc_ids"], SHAPE.seqlen_k - SHAPE.seqlen_q
    assert score_fn is None and mask.shape == (2, 3, 5, 9)
    for b, h, i, j in np.ndindex(mask.shape):
        assert mask[b, h, i, j] == (i + off >= 0 and doc[b, i + off] == doc[b, j])


def test_prefix_lm_reference_matches_loops():
    args, (mask, _) = terms("prefix_lm", seed=1)
    off = SHAPE.seqlen_k - SHAPE.seqlen_q
    for b, h, i, j in np.ndindex(mask.shape):
        assert mask[b, h, i, j] == (j < args["prefix"] or j <= i + off)


def test_relative_bias_reference_is_alibi():
    args, (mask, score_fn) = terms("relative_bias", seed=2)
    assert mask is None
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((SHAPE.batch, n, SHAPE.heads, 16)) for n in (5, 9, 9))
    ours, lse = reference_attention(q, k, v, scale=0.25, score_fn=score_fn)
    builtin, lse_b = reference_attention(q, k, v, scale=0.25, alibi_slopes=args["slopes"])
    assert np.allclose(ours, builtin) and np.allclose(lse, lse_b)


def test_a_functor_without_a_reference_cannot_be_checked(tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "lonely.cu").write_text(
        "/*---\nname: lonely\nkind: modification\nsummary: s\nfunctions: [mask_mod]\n---*/\n"
        "__device__ bool mask_mod(int b, int h, int i, int j, const flashkit::ModArgs& a) { return true; }\n")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        spec = discover_kernels(refresh=True).get_mod("lonely")
        with pytest.raises(UnsupportedError, match="cannot check it: no Python reference \\(lonely.py beside"):
            load_reference(spec)
        from click.testing import CliRunner

        from flashkit.cli import cli
        result = CliRunner().invoke(cli, ["verify", "--mod", "lonely"])
        assert result.exit_code != 0 and "cannot check it" in result.output, result.output
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)
