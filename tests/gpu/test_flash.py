"""The flash variants (FlashAttention-1, -2, and the causal specialist) against the float64 reference.

A variant not in the registry yet skips, by name.
"""

from __future__ import annotations

import pytest

from .gpu_checks import check_params, run_check

pytestmark = pytest.mark.gpu

VARIANTS = ["fa1", "fa2", "causal"]
PARAMS = check_params(VARIANTS, quick=True)


@pytest.mark.parametrize("variant,check", PARAMS)
def test_flash(variant, check):
    run_check(variant, check)
