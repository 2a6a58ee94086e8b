"""The flash variants (FlashAttention-1, -2, the causal specialist, the Hopper wgmma kernel and FlashAttention-3) against the
float64 reference. hopper's checks skip on anything but compute capability 9.0.

A variant not in the registry yet skips, by name.
"""

from __future__ import annotations

import pytest

from .gpu_checks import check_params, run_check

pytestmark = pytest.mark.gpu

VARIANTS = ["fa1", "fa2", "causal", "hopper", "fa3"]
PARAMS = check_params(VARIANTS, quick=True)


@pytest.mark.parametrize("variant,check", PARAMS)
def test_flash(variant, check):
    run_check(variant, check)
