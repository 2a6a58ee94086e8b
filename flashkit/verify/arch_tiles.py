"""A variant's tiles as another architecture takes them, run on this GPU: the launch tables a manifest gives the
GPUs whose SMs hold less shared memory (sm_86 / sm_89's 99 KB a block, which sm_120's tables repeat: the FA2 family's
smaller tiles at hd192 and hd256, decode's two stages at hd128; fa2_bwd's single-buffered Q and dO on sm_80 and
sm_86) compile from the same source for this device too, so
`flashkit verify` (an extension of every variant's checks), the GPU tier and the sanitizers check them here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from ..registry.manifest import KernelSpec
from ..runtime import call_cache
from ..runtime.device import device_count, device_info
from .harness import Check, family_checks, register_extension


def arch_tiles(spec: KernelSpec, cc: tuple[int, int]) -> list[tuple[tuple[int, int], int]]:
    """(arch, head-dim class) of every other declared architecture whose launch table for a class it takes differs
    from cc's."""
    out = []
    for arch in [a for a in spec.declared_ccs() if a != cc]:
        out += [(arch, hd) for hd in spec.head_dims.classes or spec.head_dims.examples()
                if spec.head_dims.on_arch(hd, arch) and spec.launch_config(arch, hd) != spec.launch_config(cc, hd)]
    return out


@contextmanager
def tiles_of(variant: str, cc: tuple[int, int]) -> Iterator[None]:
    """Within: `variant` builds and launches with its launch tables for compute capability cc, whatever the device
    (the other variants keep the device's)."""
    real = KernelSpec.launch_config

    def as_arch(self, device_cc, *args, **kwargs):
        return real(self, cc if self.name == variant else device_cc, *args, **kwargs)
    call_cache.invalidate()
    KernelSpec.launch_config = as_arch
    try:
        yield
    finally:
        KernelSpec.launch_config = real
        call_cache.invalidate()


def arch_tile_checks(spec: KernelSpec, dtypes, head_dims, causal_opts, quick: bool) -> list[Check]:
    """The family's checks (the quick matrix) at each head-dim class among head_dims whose tiles another declared
    architecture takes otherwise, run with that architecture's tiles; none without a device (nothing to run on)."""
    if not device_count():
        return []
    wanted = {spec.head_dims.class_of(d) for d in head_dims}
    out = []
    for arch, hd in arch_tiles(spec, device_info().cc):
        if hd in wanted:
            out += [_with_tiles(check, spec.name, arch) for check in family_checks(spec, dtypes, [hd], causal_opts, True)]
    return out


def _with_tiles(check: Check, variant: str, arch: tuple[int, int]) -> Check:
    """The check run with arch's tiles, its label saying so."""
    tag = f" [sm_{arch[0]}{arch[1]}'s tiles]"

    def run(seed: int):
        with tiles_of(variant, arch):
            result = check.run(seed)
        return replace(result, label=result.label + tag)
    return Check(check.variant, check.label + tag, run)


register_extension("arch_tiles", arch_tile_checks)
