"""ModSpec: the manifest of a drop-in functor (a .cu whose YAML says `kind: modification`), parsed and checked.

    /*---
    name: prefix_lm
    kind: modification
    summary: prefix-LM mask (bidirectional over the first prefix keys, causal after)
    functions: [mask_mod]              # which of score_mod / score_mod_grad / mask_mod the file defines
    mask_varies: []                    # what mask_mod reads of (batch, head); default both (tiles per (b, h))
    bias: false                        # score_mod adds a term that does not read the score: slope 1, no
                                       #   score_mod_grad needed (the backward multiplies nothing in)
    args:                              # passed as attention(..., mod_args={...}); slots by kind, in this order
      prefix: {kind: int}              #   -> args.ints[0]
    ---*/

Argument kinds: pointer (a CUDA array, contiguous, of `dtype`, optionally of `shape`: ints or the symbols
batch, heads, kv_heads, seqlen_q, seqlen_k) -> args.ptr[i]; int -> args.ints[i]; float -> args.floats[i];
scalars may carry a `default`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ManifestError
from ..runtime.params import MOD_ARG_FLOATS, MOD_ARG_INTS, MOD_ARG_POINTERS
from .manifest import check_identity

MOD_KIND = "modification"
FUNCTIONS = ("score_mod", "score_mod_grad", "mask_mod")   # score_mod_grad: the backward of a score_mod
KERNEL_FUNCTIONS = ("score_mod", "mask_mod")   # what a variant builds in (its manifest features)
MASK_DIMS = ("batch", "head")
ARG_KINDS = ("pointer", "int", "float")
ARG_SLOTS = {"pointer": MOD_ARG_POINTERS, "int": MOD_ARG_INTS, "float": MOD_ARG_FLOATS}   # ModArgs' arrays
POINTER_DTYPES = ("int32", "int64", "float32", "float16", "bfloat16", "uint8", "bool")
SHAPE_SYMBOLS = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k")
REQUIRED = ("name", "kind", "summary", "functions")
KNOWN = set(REQUIRED) | {"mask_varies", "args", "bias"}
BIAS_FEATURE = "score_mod_bias"   # BuildConfig.mods entry of a bias (-DFLASHKIT_SCORE_MOD_BIAS: functor.cuh)
ARG_KEYS = {"pointer": {"kind", "dtype", "shape"}, "int": {"kind", "default"}, "float": {"kind", "default"}}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class ModArg:
    """One declared argument: its kind, slot in ModArgs, and (pointers) dtype and shape, (scalars) default."""

    name: str
    kind: str
    slot: int
    dtype: str | None = None
    shape: tuple[int | str, ...] | None = None
    default: int | float | None = None


@dataclass(frozen=True)
class ModSpec:
    """One drop-in functor: its manifest, its file and the Python reference beside it (or None)."""

    name: str
    summary: str
    path: Path
    functions: tuple[str, ...]
    mask_varies: tuple[str, ...] = MASK_DIMS
    args: tuple[ModArg, ...] = field(default_factory=tuple)
    bias: bool = False   # score_mod(s) = s + a term of the indices: its derivative is 1

    @property
    def score(self) -> bool:
        return "score_mod" in self.functions

    @property
    def mask(self) -> bool:
        return "mask_mod" in self.functions

    @property
    def score_grad(self) -> bool:
        """score_mod's derivative is defined (score_mod_grad, or 1 for a bias): the functor has a backward."""
        return "score_mod_grad" in self.functions or self.bias

    @property
    def build_features(self) -> tuple[str, ...]:
        """BuildConfig.mods entries of a build with this functor: its functions, and a bias's mark."""
        return self.functions + ((BIAS_FEATURE,) if self.bias else ())

    @property
    def lacks_gradient(self) -> bool:
        """A score_mod without its derivative: no backward can take it."""
        return self.score and not self.score_grad

    @property
    def kernel_functions(self) -> tuple[str, ...]:
        """The manifest features a variant needs to build this functor in."""
        return tuple(f for f in self.functions if f in KERNEL_FUNCTIONS)

    def builds_into(self, spec) -> bool:
        """Whether variant spec builds this functor in: its functions among spec's features, and for a backward a
        score_mod's derivative defined."""
        return all(spec.supports(f) for f in self.kernel_functions) and not (
            spec.features.get("backward") and self.lacks_gradient)

    @property
    def reference(self) -> Path | None:
        """The Python reference beside the .cu (same stem, .py), when there is one."""
        ref = self.path.with_suffix(".py")
        return ref if ref.is_file() else None

    def describe(self) -> str:
        args = ", ".join(f"{a.name}:{a.kind}" + (f"[{a.dtype}]" if a.dtype else "") for a in self.args)
        return f"{'+'.join(self.functions)}" + (" (a bias)" if self.bias else "") + (f" ({args})" if args else "")


def is_modification(data: Any) -> bool:
    """Whether a parsed manifest declares a drop-in functor rather than a kernel."""
    return isinstance(data, dict) and data.get("kind") == MOD_KIND


def mod_spec_from(path: Path, data: dict) -> ModSpec:
    """Check a functor's manifest field by field; ManifestError names the file and the field."""
    def bad(fld: str, expected: str, got: Any = None) -> ManifestError:
        return ManifestError(f"{path}: field '{fld}': expected {expected}, got {data.get(fld) if got is None else got!r}")

    check_identity(path, data, REQUIRED, KNOWN)
    name = data["name"]
    functions = data["functions"]
    if (not isinstance(functions, list) or not functions or len(set(functions)) != len(functions)
            or any(f not in FUNCTIONS for f in functions)):
        raise bad("functions", f"a list of {' and/or '.join(FUNCTIONS)}")
    if "score_mod_grad" in functions and "score_mod" not in functions:
        raise bad("functions", "score_mod_grad only beside score_mod (it is score_mod's derivative)")
    bias = data.get("bias", False)
    if not isinstance(bias, bool):
        raise bad("bias", "true or false")
    if bias and "score_mod" not in functions:
        raise bad("bias", "bias only beside score_mod (it says score_mod adds a term that does not read the score)")
    if bias and "score_mod_grad" in functions:
        raise bad("functions", "no score_mod_grad beside bias: true (a bias's derivative is 1)")
    varies = data.get("mask_varies", list(MASK_DIMS))
    if not isinstance(varies, list) or any(v not in MASK_DIMS for v in varies):
        raise bad("mask_varies", f"a list of {', '.join(MASK_DIMS)} (what mask_mod reads)")
    if "mask_varies" in data and "mask_mod" not in functions:
        raise bad("mask_varies", "no mask_varies without mask_mod in 'functions'")
    args = _args(path, data.get("args") or {}, bad)
    _check_defined(path, functions)
    return ModSpec(name=name, summary=data["summary"], path=path, functions=tuple(f for f in FUNCTIONS if f in functions),
                   mask_varies=tuple(v for v in MASK_DIMS if v in varies), args=args, bias=bias)


def _args(path: Path, raw: Any, bad) -> tuple[ModArg, ...]:
    if not isinstance(raw, dict):
        raise bad("args", "a mapping of argument names to {kind: pointer|int|float, ...}")
    used = {k: 0 for k in ARG_KINDS}
    out = []
    for name, decl in raw.items():
        where = f"args.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise bad("args", "argument names that are lower-case identifiers", name)
        if not isinstance(decl, dict) or decl.get("kind") not in ARG_KINDS:
            raise bad(where, f"a mapping with kind one of {', '.join(ARG_KINDS)}", decl)
        kind = decl["kind"]
        extra = set(decl) - ARG_KEYS[kind]
        if extra:
            raise bad(where, f"keys among {', '.join(sorted(ARG_KEYS[kind]))} for a {kind}", decl)
        if used[kind] == ARG_SLOTS[kind]:
            raise bad("args", f"at most {ARG_SLOTS[kind]} {kind} arguments (ModArgs' slots)", list(raw))
        dtype = shape = default = None
        if kind == "pointer":
            dtype = decl.get("dtype")
            if dtype not in POINTER_DTYPES:
                raise bad(where, f"a dtype among {', '.join(POINTER_DTYPES)}", decl)
            if "shape" in decl:
                sh = decl["shape"]
                if not isinstance(sh, list) or not sh or any(
                        not ((isinstance(d, int) and not isinstance(d, bool) and d > 0) or d in SHAPE_SYMBOLS)
                        for d in sh):
                    raise bad(where, f"a shape of positive ints and symbols ({', '.join(SHAPE_SYMBOLS)})", decl)
                shape = tuple(sh)
        elif "default" in decl:
            default = decl["default"]
            ok = (isinstance(default, int) and not isinstance(default, bool) and abs(default) <= INT32_MAX
                  if kind == "int" else isinstance(default, (int, float)) and not isinstance(default, bool))
            if not ok:
                raise bad(where, f"a {kind} default", decl)
        out.append(ModArg(name, kind, used[kind], dtype, shape, default))
        used[kind] += 1
    return tuple(out)


def _check_defined(path: Path, functions: list[str]) -> None:
    """Each declared function appears as a definition in the file's code (comments stripped)."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", path.read_text(encoding="utf-8"), flags=re.S)
    for fn in functions:
        if not re.search(rf"\b{fn}\s*\(", code):
            raise ManifestError(f"{path}: field 'functions': declares {fn} but the file defines no {fn}(...)")
