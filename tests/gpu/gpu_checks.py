"""Parametrize GPU tests over a variant's verification checks (flashkit.verify), one test per check."""

from __future__ import annotations

import zlib

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify.harness import checks_for


def check_params(names: list[str], quick: bool = False) -> list:
    """pytest params (variant, check) for every check of each named variant; a missing variant skips by name."""
    specs = discover_kernels().specs
    params = []
    for name in names:
        spec = specs.get(name)
        if spec is None:
            params.append(pytest.param(name, None, id=f"{name}-missing",
                                       marks=pytest.mark.skip(reason=f"variant {name!r} is not in the registry")))
            continue
        checks = checks_for(spec, quick=quick)
        if not checks:   # a variant with no checks must fail, not pass by having nothing to run
            params.append(pytest.param(name, None, id=f"{name}-no-checks"))
        params += [pytest.param(name, c, id=f"{name}: {c.label}") for c in checks]
    return params


def variant_on_this_device(name: str):
    """The variant's spec and this device's compute capability; skips (by name) where the variant does not run."""
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get(name)
    cc = device_info().cc
    if not spec.runs_on(cc):
        pytest.skip(f"{name} needs compute capability {spec.arch_requirement()}; "
                    f"this device has {cc[0]}.{cc[1]}")
    return spec, cc


def run_check(name: str, check) -> None:
    """Run one check with a seed fixed by its label; fail with the whole result in the message."""
    assert check is not None, f"verify.checks_for({name}) returned no checks"
    from flashkit.cli.verify_cmd import format_result
    variant_on_this_device(name)
    result = check.run(zlib.crc32(check.label.encode()))
    assert result.variant == name and result.label == check.label
    assert result.passed, format_result(result)


def boundary_lengths(tile: int) -> list[int]:
    """Sequence lengths at a tile boundary and at twice it, +- 1 (the Hopper kernels' tile-boundary tests)."""
    return [n for t in (tile, 2 * tile) for n in (t - 1, t, t + 1)]
