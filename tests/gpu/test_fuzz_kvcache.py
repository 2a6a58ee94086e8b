"""Random serving calls (verify/fuzz_kvcache.py), each its own test: attention_with_kvcache with drawn lengths,
appends, paged caches and their block tables, speculative rows and memory layouts, against the float64 reference
and the caches' expected contents. Case i gets the data `flashkit verify --fuzz 160 --seed 0 --fuzz-api kvcache`
gives it, so either reproduces the other."""

from __future__ import annotations

import pytest

from flashkit.runtime.device import device_count
from flashkit.verify.fuzz_kvcache import fuzz_kvcache_check, kvcache_cases
from flashkit.verify.harness import check_seed

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs a CUDA GPU")

FUZZ_SEED = 0
FUZZ_CASES = 160


@pytest.mark.parametrize("case", [pytest.param(c, id=c.label()) for c in kvcache_cases(FUZZ_CASES, FUZZ_SEED)])
def test_fuzz_kvcache_case(case):
    from flashkit.cli.verify_cmd import format_result
    result = fuzz_kvcache_check(case).run(check_seed(FUZZ_SEED, case.index))
    assert result.passed, format_result(result)
