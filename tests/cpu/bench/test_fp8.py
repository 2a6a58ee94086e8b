"""flashkit.bench without a GPU: fp8 variants in the sweep (bench/fp8.py)."""

from __future__ import annotations

from flashkit.bench import fp8


def test_fp8_variants_are_recognised_by_their_manifest():
    assert fp8.is_fp8_variant("fa3_fp8") and fp8.is_fp8_variant("fp8")
    assert not fp8.is_fp8_variant("fa2") and not fp8.is_fp8_variant(None)
    assert not fp8.is_fp8_variant("no_such_variant")
