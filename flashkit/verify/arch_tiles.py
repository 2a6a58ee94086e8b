"""A variant's tiles as another architecture takes them, run on this GPU: the launch tables a manifest gives the
GPUs whose SMs hold less shared memory (fa2_bwd's single-buffered Q and dO on sm_80 / sm_86) compile from the same
source for this device too, so the GPU tier and the sanitizers check them here."""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

from ..registry.manifest import KernelSpec
from ..runtime import call_cache


def arch_tiles(spec: KernelSpec, cc: tuple[int, int]) -> list[tuple[tuple[int, int], int]]:
    """(arch, head-dim class) of every other declared architecture whose launch table for a class it takes differs
    from cc's."""
    from ..cli.common import parse_arch
    out = []
    for arch in sorted({parse_arch(t) for t in spec.declared_archs()} - {cc}):
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
