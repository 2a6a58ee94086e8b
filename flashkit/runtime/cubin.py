"""What a cubin exports, read from its ELF image without a GPU: the `__constant__ int` values a variant declares
with FLASHKIT_EXPORT_SMEM_BYTES (params.cuh), so that a build's shared memory is known before it is loaded, and the
GPU-less compile tier can hold every build to its architecture's limit."""

from __future__ import annotations

import struct

ELF_MAGIC = b"\x7fELF"
SHT_SYMTAB = 2
SHT_NOBITS = 8          # a section with no bytes in the file (.bss-like: zero-initialized)
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")   # ELF64 Shdr: name type flags addr offset size link info align entsize
SYMBOL = struct.Struct("<IBBHQQ")               # ELF64 Sym: name info other shndx value size
INT32 = struct.Struct("<i")

# The most dynamic shared memory a block may opt in to, by compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"): what a build compiled for that architecture must fit.
SMEM_PER_BLOCK_OPTIN = {(7, 5): 65536, (8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376, (9, 0): 232448,
                        (10, 0): 232448, (12, 0): 101376}


def header_field(image: bytes, lo: int, hi: int) -> int:
    """The little-endian ELF64 header field at bytes [lo, hi) (e_shoff 0x28, e_shentsize 0x3A, e_shnum 0x3C, ...)."""
    return int.from_bytes(image[lo:hi], "little")


def section_table(image: bytes) -> tuple[int, int, int]:
    """(offset, entry size, count) of the ELF64 image's section header table."""
    return header_field(image, 0x28, 0x30), header_field(image, 0x3A, 0x3C), header_field(image, 0x3C, 0x3E)


def program_table(image: bytes) -> tuple[int, int, int]:
    """(offset, entry size, count) of the ELF64 image's program header table."""
    return header_field(image, 0x20, 0x28), header_field(image, 0x36, 0x38), header_field(image, 0x38, 0x3A)


def exported_ints(cubin: bytes, prefix: str) -> dict[str, int]:
    """Every 4-byte symbol of the cubin whose name starts with `prefix`, with its initial value."""
    if cubin[:4] != ELF_MAGIC or cubin[4] != 2:   # ELFCLASS64
        raise ValueError("not an ELF64 cubin")
    shoff, shentsize, shnum = section_table(cubin)
    sections = [SECTION_HEADER.unpack_from(cubin, shoff + i * shentsize) for i in range(shnum)]
    out: dict[str, int] = {}
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != SHT_SYMTAB:
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize or SYMBOL.size):
            name_at, _, _, shndx, value, sym_size = SYMBOL.unpack_from(cubin, at)
            end = cubin.index(b"\0", strtab + name_at)
            name = cubin[strtab + name_at:end].decode()
            if not name.startswith(prefix) or sym_size != INT32.size or not 0 < shndx < len(sections):
                continue
            holder = sections[shndx]
            out[name] = 0 if holder[1] == SHT_NOBITS else INT32.unpack_from(cubin, holder[4] + value)[0]
    return out
