"""runtime/nvrtc.py: GPU-less compiles through CuPy's NVRTC binding, and the ptxas report parser."""

from __future__ import annotations

import pytest

from flashkit.errors import CompileError, FlashkitError
from flashkit.runtime.nvrtc import CompileReport, compile_cubin, nvrtc_version, parse_ptxas_log

REAL_LOG = """\
ptxas info    : 68 bytes gmem, 4 bytes cmem[3], 160 bytes cmem[4]
ptxas info    : Compiling entry function 'flashkit_standard_pv' for 'sm_80'
ptxas info    : Function properties for flashkit_standard_pv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 8320 bytes smem, 608 bytes cmem[0]
ptxas info    : Compile time = 173.830 ms
ptxas info    : Compiling entry function 'flashkit_standard_softmax' for 'sm_80'
ptxas info    : Function properties for flashkit_standard_softmax
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 27 registers, used 0 barriers, 608 bytes cmem[0]
ptxas info    : Compile time = 43.364 ms
ptxas info    : Compiling entry function 'spilly' for 'sm_90a'
ptxas info    : Function properties for spilly
ptxas         .     808 bytes stack frame, 1568 bytes spill stores, 1924 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 808 bytes cumulative stack size, 368 bytes cmem[0]
ptxas info    : Compile time = 150.011 ms
\x00"""


def test_parse_ptxas_log():
    assert parse_ptxas_log(REAL_LOG) == [
        CompileReport("flashkit_standard_pv", 72, 0, 0, 0, 8320),
        CompileReport("flashkit_standard_softmax", 27, 0, 0, 0, 0),
        CompileReport("spilly", 24, 1568, 1924, 808, 0),
    ]


def test_serialized_wgmma_is_reported_per_entry():
    log = ("ptxas info    : Compiling entry function 'slow' for 'sm_90a'\n"
           "ptxas info    : Used 200 registers\n"
           "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
           "to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the "
           "pipeline stage in the function 'slow' in line 0\n"
           "ptxas info    : Compiling entry function 'fast' for 'sm_90a'\n"
           "ptxas info    : Used 100 registers\n")
    slow, fast = parse_ptxas_log(log)
    assert (slow.entry, slow.serialized_wgmma) == ("slow", True)
    assert (fast.entry, fast.serialized_wgmma) == ("fast", False)


def test_parse_ptxas_log_empty_and_unrelated():
    assert parse_ptxas_log("") == []
    assert parse_ptxas_log("ptxas info    : Used 10 registers\n") == []     # no entry announced


def test_frame_does_not_leak_between_entries():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_80'\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, 49152 bytes smem\n"
           "ptxas info    : Compiling entry function 'b' for 'sm_80'\n"
           "ptxas info    : Used 12 registers\n")
    assert parse_ptxas_log(log) == [CompileReport("a", 255, 8, 8, 16, 49152), CompileReport("b", 12, 0, 0, 0, 0)]


TINY = 'extern "C" __global__ void tiny(float* out) { out[threadIdx.x] = 1.0f; }\n'

SPILLY = r"""
extern "C" __global__ void spilly(const float* in, float* out) {
    float acc[48];
    #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = in[i * blockDim.x + threadIdx.x];
    #pragma unroll
    for (int r = 0; r < 8; ++r)
    #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + r + 1) % 48] + in[i];
    float s = 0;
    #pragma unroll
    for (int i = 0; i < 48; ++i) s += acc[i];
    out[threadIdx.x] = s;
}
"""


def test_nvrtc_is_available():
    v = nvrtc_version()
    assert v is not None and v >= (12, 0), v


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_89", "sm_90", "sm_90a"])
def test_compile_without_a_gpu(arch):
    compiled = compile_cubin(TINY, "tiny.cu", [f"-arch={arch}", "-std=c++17", "--ptxas-options=-v"])
    assert compiled.cubin[:4] == b"\x7fELF"
    assert compiled.seconds > 0
    (report,) = compiled.reports()
    assert report.entry == "tiny" and report.registers > 0
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0


def test_real_spills_are_reported():
    """The spill check in test_compile.py can fail: a register-starved kernel reports its spills."""
    compiled = compile_cubin(SPILLY, "spilly.cu", ["-arch=sm_80", "--ptxas-options=-v", "-maxrregcount=24"])
    (report,) = compiled.reports()
    assert report.spill_stores > 0 and report.spill_loads > 0 and report.stack_bytes > 0


def test_compile_error_carries_the_log():
    with pytest.raises(CompileError) as info:
        compile_cubin('extern "C" __global__ void broken() { undeclared_thing(); }', "broken.cu",
                      ["-arch=sm_80"])
    msg = str(info.value)
    assert isinstance(info.value, FlashkitError)
    assert msg.startswith("broken.cu: NVRTC failed with -arch=sm_80")
    assert "undeclared_thing" in msg and "error" in msg


def test_bad_option_is_a_compile_error():
    with pytest.raises(CompileError):
        compile_cubin(TINY, "tiny.cu", ["-arch=sm_80", "--no-such-option"])


def test_cubin_is_the_whole_elf_image():
    """The cubin ends where its ELF header says (CuPy's getCUBIN drops a byte; nvdisasm needs it)."""
    from flashkit.runtime.nvrtc import compile_cubin
    cubin = compile_cubin('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }',
                          "k.cu", ["-arch=sm_80"]).cubin
    field = lambda lo, hi: int.from_bytes(cubin[lo:hi], "little")  # noqa: E731
    ends = (field(0x28, 0x30) + field(0x3A, 0x3C) * field(0x3C, 0x3E),
            field(0x20, 0x28) + field(0x36, 0x38) * field(0x38, 0x3A))
    assert cubin[:4] == b"\x7fELF"
    assert len(cubin) == max(ends)
