"""The standard (materialized scores) variant against the float64 reference over the full shape matrix."""

from __future__ import annotations

import pytest

from .gpu_checks import check_params, run_check

pytestmark = pytest.mark.gpu

PARAMS = check_params(["standard"], quick=True)


def test_the_matrix_is_not_empty():
    from flashkit.registry import discover_kernels
    spec = discover_kernels().get("standard")
    labels = [p.values[1].label for p in PARAMS]
    assert len(labels) == len(set(labels)) > 0
    for dtype in spec.dtypes:
        assert any(f" {dtype}" in label for label in labels), dtype
    assert any(label.endswith("causal") for label in labels)


@pytest.mark.parametrize("variant,check", PARAMS)
def test_standard(variant, check):
    run_check(variant, check)
