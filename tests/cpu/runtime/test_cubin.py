"""runtime/cubin.py: the ints a cubin exports, read from its ELF image without a GPU; build.py's shared-memory
figures from them, and its refusal of a build over the device's limit before anything is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import flashkit.runtime.build as build
from flashkit.errors import UnsupportedError
from flashkit.registry import discover_kernels
from flashkit.runtime.cubin import SMEM_PER_BLOCK_OPTIN, exported_ints
from flashkit.runtime.device import DeviceInfo
from flashkit.runtime.nvrtc import compile_cubin
from flashkit.verify.compile_matrix import plan_compiles

EXPORTS = r"""
extern "C" __constant__ int flashkit_smem_bytes = 147968;
extern "C" __constant__ int flashkit_smem_bytes_flashkit_pre = 0;
extern "C" __constant__ int flashkit_other = 7;
extern "C" __global__ void flashkit_pre(int* out) { out[0] = flashkit_smem_bytes + flashkit_other; }
extern "C" __global__ void flashkit_main(int* out) { out[1] = flashkit_smem_bytes_flashkit_pre; }
"""


@pytest.fixture(scope="module")
def cubin() -> bytes:
    return compile_cubin(EXPORTS, "exports.cu", ["-arch=sm_80", "-std=c++17"]).cubin


def test_exported_ints_reads_initial_values_by_prefix(cubin):
    assert exported_ints(cubin, "flashkit_smem_bytes") == {"flashkit_smem_bytes": 147968,
                                                           "flashkit_smem_bytes_flashkit_pre": 0}
    assert exported_ints(cubin, "flashkit_other") == {"flashkit_other": 7}
    assert exported_ints(cubin, "nothing") == {}
    with pytest.raises(ValueError, match="ELF64"):
        exported_ints(b"not a cubin at all, but long enough to hold a header", "x")


def test_smem_bytes_gives_each_entry_its_own_or_the_modules(cubin):
    spec = discover_kernels().get("fa2_bwd")   # entries: prepass, main, convert_dq
    module, entries = build.smem_bytes(spec, cubin)
    assert module == 147968 and entries == (147968,) * 3   # no entry of spec's names exports its own
    jobs = [job for job in plan_compiles(["fa2_bwd"], [(8, 0)])[0] if job[1].head_dim == 256][:1]
    real = build.compile_variant(*jobs[0]).cubin   # prepass and convert_dq export 0: no shared memory
    assert build.smem_bytes(spec, real) == (147968, (0, 147968, 0))   # hd256 on sm_80: Q and dO single-buffered


def test_a_build_over_the_devices_shared_memory_is_refused_before_loading(cubin, tmp_path, monkeypatch):
    spec = discover_kernels().get("fa2_bwd")
    path = tmp_path / "big.cubin"
    path.write_bytes(cubin)
    small = DeviceInfo(0, "Fake RTX", (8, 6), 82, SMEM_PER_BLOCK_OPTIN[(8, 6)], 13000, 13000)
    monkeypatch.setattr(build, "ensure_cubin", lambda *a: path)
    monkeypatch.setattr(build, "device_info", lambda *a: small)
    unloadable = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0)),
                                 RawModule=lambda **kw: pytest.fail("loaded a module that does not fit"))
    monkeypatch.setattr(build, "cupy_module", lambda: unloadable)
    config = build.make_config(spec, "bfloat16", 256, False, (8, 0))
    with pytest.raises(UnsupportedError, match=r"fa2_bwd \[.*hd256.*\] needs 147968 bytes of shared memory a block; "
                                               r"this GPU \(sm_86\) gives at most 101376"):
        build.build_module(spec, config, (8, 6))


def test_every_architecture_the_manifests_name_has_a_limit():
    """The compile tier holds each build to its target's figure; every target a manifest declares needs one."""
    from flashkit.cli.common import parse_arch
    archs = {parse_arch(t) for spec in discover_kernels().specs.values() for t in spec.declared_archs()}
    assert archs <= set(SMEM_PER_BLOCK_OPTIN), archs - set(SMEM_PER_BLOCK_OPTIN)
