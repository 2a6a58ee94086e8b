"""Random calls through the public API (verify/fuzz.py), each its own test: the kernel the API picks for a drawn
dtype, head dims, shape, masks, modifications and memory layout, forward and backward, batched and varlen, against
the float64 reference."""

from __future__ import annotations

import pytest

from flashkit.runtime.device import device_count
from flashkit.verify.fuzz import fuzz_cases, fuzz_check

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs a CUDA GPU")

FUZZ_SEED = 0
FUZZ_CASES = 240


@pytest.mark.parametrize("case", fuzz_cases(FUZZ_CASES, FUZZ_SEED), ids=lambda c: c.label())
def test_fuzz_case(case):
    from flashkit.cli.verify_cmd import format_result
    result = fuzz_check(case).run(FUZZ_SEED)
    assert result.passed, format_result(result)
