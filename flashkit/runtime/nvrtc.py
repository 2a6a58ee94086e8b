"""NVRTC through CuPy's low-level binding: compiles to a cubin with no GPU present."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from ..errors import CompileError, DeviceError
from .cubin import ELF_MAGIC, program_table, section_table


@dataclass(frozen=True)
class CompileReport:
    """What ptxas said about one entry of one compile."""

    entry: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    serialized_wgmma: bool = False   # ptxas could not pipeline the entry's wgmma (C7510-C7515)


@dataclass
class Compiled:
    cubin: bytes
    log: str
    seconds: float

    def reports(self) -> list[CompileReport]:
        return parse_ptxas_log(self.log)


def nvrtc_module():
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as e:
        raise DeviceError(f"NVRTC is not available ({type(e).__name__}: {e}); "
                          "install the nvidia-cuda-nvrtc wheel for your CUDA (pip install 'flashkit[test]')") from None
    return nvrtc


def nvrtc_version() -> tuple[int, int] | None:
    try:
        return tuple(nvrtc_module().getVersion())
    except DeviceError:
        return None


def compile_cubin(source: str, filename: str, options: list[str]) -> Compiled:
    """Compile CUDA C++ to a cubin; CompileError carries NVRTC's log."""
    nvrtc = nvrtc_module()
    start = time.perf_counter()
    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except Exception:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"{filename}: NVRTC failed with {' '.join(options)}\n{log}") from None
        return Compiled(_whole_elf(nvrtc.getCUBIN(prog)), nvrtc.getProgramLog(prog), time.perf_counter() - start)
    finally:
        nvrtc.destroyProgram(prog)


def _whole_elf(cubin: bytes) -> bytes:
    """CuPy's getCUBIN drops the image's last byte (it treats it as a C string's NUL); restore the
    length the ELF64 header declares (its section or program header table ends the file), so that tools such as
    nvdisasm accept the cached cubin too."""
    if cubin[:4] != ELF_MAGIC or len(cubin) < ELF64_HEADER_BYTES:
        return cubin
    end = max(offset + size * count for offset, size, count in (section_table(cubin), program_table(cubin)))
    return cubin + b"\0" * (end - len(cubin)) if end > len(cubin) else cubin


ELF64_HEADER_BYTES = 0x40
_ENTRY_RE = re.compile(r"Compiling entry function '(\w+)'")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SERIALIZED_RE = re.compile(r"wgmma\.mma_async instructions are serialized.*?in the function '(\w+)'")


def parse_ptxas_log(log: str) -> list[CompileReport]:
    """One report per entry function in a --ptxas-options=-v log."""
    reports, entry, frame = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            entry, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME_RE.search(line)) and entry:
            frame = tuple(int(x) for x in m.groups())
        elif (m := _USED_RE.search(line)) and entry:
            smem = int(m.group(2) or 0)
            reports.append(CompileReport(entry, int(m.group(1)), frame[1], frame[2], frame[0], smem))
            entry = None
    serialized = set(_SERIALIZED_RE.findall(log))
    return [replace(r, serialized_wgmma=r.entry in serialized) for r in reports]
