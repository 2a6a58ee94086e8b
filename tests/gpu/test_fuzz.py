"""Random calls through the public API (verify/fuzz.py), each its own test: the kernel the API picks for a drawn
dtype, head dims, shape, masks, modifications and memory layout, forward and backward, batched and varlen, against
the float64 reference. Case i gets the data `flashkit verify --fuzz 240 --seed 0` gives it, so either reproduces
the other."""

from __future__ import annotations

import pytest

from flashkit.runtime.device import device_count
from flashkit.verify.fuzz import fuzz_cases, fuzz_check
from flashkit.verify.harness import check_seed

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs a CUDA GPU")

FUZZ_SEED = 0
FUZZ_CASES = 240


# Cases that fail for a known, documented limit (strict: each fails the tier if it starts to pass, so the entry goes)
KNOWN_FAILURES: dict[int, str] = {}


def _param(case):
    reason = KNOWN_FAILURES.get(case.index)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, id=case.label(), marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in fuzz_cases(FUZZ_CASES, FUZZ_SEED)])
def test_fuzz_case(case):
    from flashkit.cli.verify_cmd import format_result
    result = fuzz_check(case).run(check_seed(FUZZ_SEED, case.index))   # verify --fuzz 240 --seed 0's data
    assert result.passed, format_result(result)


# Cases of other seeds that found a bug (verify --fuzz COUNT --seed SEED's case INDEX, with its data): fixed ones stay
# as regressions; open ones are strict xfails naming the bug.
REGRESSIONS = [
    (300, 1, 245, None),   # causal with window (-1, 4) saw 4 keys past the diagonal (features/mods.py's check_mods)
    (150, 4, 81, None),   # keys past seqlen_k, float16: P = exp2(0 - lse2) of their zero K rows overflowed where
    (150, 7, 54, None),   # a row's LSE was below -11, and dS = inf met K's zero rows in dQ: NaN (SaturateFinite)
]


def _regression(count, seed, index, reason):
    case = fuzz_cases(count, seed)[index]
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(seed, index, case, id=f"seed{seed} {case.label()}", marks=marks)


@pytest.mark.parametrize("seed, index, case", [_regression(*r) for r in REGRESSIONS])
def test_fuzz_regression(seed, index, case):
    from flashkit.cli.verify_cmd import format_result
    result = fuzz_check(case).run(check_seed(seed, index))
    assert result.passed, format_result(result)

