"""runtime/params.py mirrors `flashkit::Params` (params.cuh): field order, offsets, sizes, checked by NVRTC."""

from __future__ import annotations

import re

import numpy as np
import pytest

from flashkit.errors import CompileError
from flashkit.runtime.build import INCLUDE_DIR
from flashkit.runtime.nvrtc import compile_cubin, nvrtc_version
from flashkit.runtime.params import PARAMS_DTYPE, flat_fields, make_params

PARAMS_CUH = INCLUDE_DIR / "flashkit" / "params.cuh"
C_SIZES = {"index_t": 8, "int": 4, "float": 4}    # pointers are 8


NESTED = {"BwdParams", "KvCacheParams", "ModParams", "ModArgs", "VarlenParams", "BwdListParams"}  # nested blocks, flattened ("bwd.dq")
FLAT = {n: (t, off) for n, t, off in flat_fields()}


def struct_fields(struct: str = "Params", prefix: str = "") -> list[tuple[str, str]]:
    """(name, C type) of each member of a struct, in declaration order, comments stripped; nested ones flattened."""
    text = PARAMS_CUH.read_text()
    body = re.search(rf"struct\s+{struct}\s*\{{(.*?)\n\}};", text, re.S)
    assert body, f"struct {struct} not found in params.cuh"
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", body.group(1), flags=re.S)
    fields = []
    for decl in code.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = re.fullmatch(r"((?:const )?(?:unsigned )?[A-Za-z_][\w:]*\s*\*?)\s*(.+)", decl)
        assert m, f"cannot parse declaration {decl!r}"
        ctype = m.group(1).replace(" ", "")
        for name in m.group(2).split(","):
            name = name.strip()
            pointer = name.startswith("*")
            if ctype in NESTED:
                fields += struct_fields(ctype, f"{prefix}{name}.")
                continue
            name = name.lstrip("*").strip()
            array = re.fullmatch(r"(\w+)\s*\[(\d+)\]", name)   # a C array: one field per element
            names = [f"{array.group(1)}[{i}]" for i in range(int(array.group(2)))] if array else [name]
            fields += [(prefix + n, ctype + ("*" if pointer else "")) for n in names]
    return fields


def test_struct_parses_into_many_fields():
    fields = struct_fields()
    assert len(fields) >= 30
    assert fields[0] == ("q", "constvoid*")
    assert ("softmax_scale", "float") in fields


def test_field_order_matches_the_numpy_mirror():
    assert [n for n, _ in struct_fields()] == list(FLAT)
    assert ("bwd.dq", "void*") in struct_fields() and {"bwd", "cache", "mods"} <= set(PARAMS_DTYPE.names)


def test_field_sizes_and_kinds_match():
    for name, ctype in struct_fields():
        np_type = FLAT[name][0]
        if ctype.endswith("*"):
            assert np_type == np.uint64, f"{name}: a pointer is carried as uint64, got {np_type}"
        elif ctype == "float":
            assert np_type == np.float32, name
        elif ctype == "int":
            assert np_type == np.int32, name
        elif ctype == "index_t":
            assert np_type == np.int64, name
        else:
            pytest.fail(f"{name}: unexpected C type {ctype}")
        assert np_type.itemsize == C_SIZES.get(ctype, 8)


def layout_asserts(dtype: np.dtype) -> str:
    lines = ['#include "flashkit/params.cuh"', "typedef flashkit::Params Params;"]
    for name, np_type, offset in flat_fields(dtype):
        lines.append(f"static_assert(__builtin_offsetof(Params, {name}) == {offset}, \"offset of {name}\");")
        lines.append(f"static_assert(sizeof(((Params*)0)->{name}) == {np_type.itemsize}, \"size of {name}\");")
    lines.append(f"static_assert(sizeof(Params) == {dtype.itemsize}, \"sizeof(Params)\");")
    lines.append(f"static_assert(alignof(Params) == {dtype.alignment}, \"alignof(Params)\");")
    lines.append('extern "C" __global__ void flashkit_params_probe(const Params p) {}')
    return "\n".join(lines) + "\n"


def compile_layout(source: str):
    return compile_cubin(source, "params_layout.cu", ["-arch=sm_80", "-std=c++17", f"-I{INCLUDE_DIR}"])


def builtin_offsetof_missing() -> str | None:
    """Why this NVRTC cannot evaluate __builtin_offsetof in a constant expression (None when it can)."""
    try:
        compile_layout('struct S { int a; int b; };\nstatic_assert(__builtin_offsetof(S, b) == 4, "");\n')
    except CompileError as e:
        return f"NVRTC {nvrtc_version()} has no constant __builtin_offsetof: {str(e).splitlines()[-1]}"
    return None


def test_offsets_itemsize_and_alignment_match_the_c_struct():
    """NVRTC (no GPU needed) compiles one static_assert per field: offsetof and sizeof as NumPy lays them out."""
    why = builtin_offsetof_missing()
    if why:
        pytest.skip(why + " (test_offsets_from_ptx checks the same layout)")
    compiled = compile_layout(layout_asserts(PARAMS_DTYPE))
    assert compiled.cubin[:4] == b"\x7fELF"


def test_the_layout_check_can_fail():
    """A mirror with one field moved must not compile (the check above is not vacuous)."""
    why = builtin_offsetof_missing()
    if why:
        pytest.skip(why)
    names = list(PARAMS_DTYPE.names)
    i, j = names.index("softmax_scale"), names.index("softmax_scale_log2")
    names[i], names[j] = names[j], names[i]                      # swap two floats: same size, new offsets
    formats = [PARAMS_DTYPE.fields[n][0] for n in names]
    swapped = np.dtype({"names": names, "formats": formats,
                        "offsets": [PARAMS_DTYPE.fields[n][1] for n in PARAMS_DTYPE.names],
                        "itemsize": PARAMS_DTYPE.itemsize})
    with pytest.raises(CompileError, match=r"offset of softmax_scale"):
        compile_layout(layout_asserts(swapped))


def ptx_layout() -> tuple[dict[str, tuple[int, int]], int, int]:
    """What the compiler does with the struct: {field: (offset, bytes loaded)}, sizeof and alignof, from PTX.

    One probe kernel per field reads it from the by-value parameter; PTX names the parameter's size and
    alignment and each load's offset and width. Works on any NVRTC, no builtins needed.
    """
    from cupy.cuda import nvrtc
    ident = lambda n: n.replace(".", "_").replace("[", "_").replace("]", "")  # noqa: E731
    kernels = [f'extern "C" __global__ void probe_{ident(n)}(const flashkit::Params p, unsigned long long* out) '
               f"{{ out[0] = (unsigned long long)(p.{n}); }}" for n in FLAT]
    source = '#include "flashkit/params.cuh"\n' + "\n".join(kernels) + "\n"
    prog = nvrtc.createProgram(source, "params_ptx.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_80", "-std=c++17", f"-I{INCLUDE_DIR}"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    layout, sizes = {}, set()
    for n in FLAT:
        decl = re.search(rf"\.param \.align (\d+) \.b8 probe_{ident(n)}_param_0\[(\d+)\]", ptx)
        load = re.search(rf"ld\.param\.[a-z](\d+)\s+%\w+, \[probe_{ident(n)}_param_0(?:\+(\d+))?\]", ptx)
        assert decl and load, f"no parameter declaration or load for {n} in the PTX"
        sizes.add((int(decl.group(2)), int(decl.group(1))))
        layout[n] = (int(load.group(2) or 0), int(load.group(1)) // 8)
    assert len(sizes) == 1, sizes
    (size, align), = sizes
    return layout, size, align


def test_offsets_from_ptx():
    layout, size, align = ptx_layout()
    want = {n: (off, t.itemsize) for n, (t, off) in FLAT.items()}
    wrong = {n: (layout[n], want[n]) for n in want if layout[n] != want[n]}
    assert not wrong, f"(offset, bytes) in C vs NumPy: {wrong}"
    assert (size, align) == (PARAMS_DTYPE.itemsize, PARAMS_DTYPE.alignment)


def test_make_params_sets_fields_and_zeroes_the_rest():
    block = make_params(q=0x1000, seqlen_q=17, softmax_scale=0.125, q_row_stride=-3)
    assert block.dtype == PARAMS_DTYPE and block.shape == ()
    assert int(block["q"]) == 0x1000 and int(block["seqlen_q"]) == 17
    assert float(block["softmax_scale"]) == 0.125 and int(block["q_row_stride"]) == -3
    assert int(block["k"]) == 0 and int(block["lse"]) == 0 and float(block["softmax_scale_log2"]) == 0
    raw = block.tobytes()
    assert len(raw) == PARAMS_DTYPE.itemsize
    off = PARAMS_DTYPE.fields["seqlen_q"][1]
    assert int.from_bytes(raw[off:off + 4], "little") == 17


def test_make_params_rejects_unknown_fields():
    with pytest.raises(KeyError, match="Params has no field 'seqlen'"):
        make_params(seqlen=3)


def test_merge_fields_merges_nested_blocks_field_by_field():
    from flashkit.runtime.params import merge_fields
    base = {"q": 1, "mods": {"window_left": 3, "chunk": 0}}
    merged = merge_fields(base, {"mods": {"chunk": 64}, "cache": {"splits": 2}, "q": 5})
    assert merged == {"q": 5, "mods": {"window_left": 3, "chunk": 64}, "cache": {"splits": 2}}
    assert base == {"q": 1, "mods": {"window_left": 3, "chunk": 0}}   # the inputs stay as they were
