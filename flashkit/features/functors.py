"""Drop-in functors: attention(..., mod="name", mod_args={...}) with a score_mod / mask_mod from a mods/*.cu file.

Checked on metadata before any compile or launch (bind_functor); the kernels see the functor as compile-time
selections (BuildConfig.mods += score_mod / mask_mod, BuildConfig.functor: the file, keyed by its hash) and
runtime values (Params.mods.args; for mask_mod the tile lists, classified on the GPU before the launch).
score_mod works on scaled scores (FlexAttention's convention), so its build runs the softmax with
softmax_scale_log2 = log2(e). docs/functors.md is the guide.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..call.arrays import describe
from ..call.validate import Problem, check_device, check_on_gpu
from ..errors import CompileError, InputError
from ..registry.functor_manifest import ARG_SLOTS, INT32_MAX, INT32_MIN, ModArg, ModSpec
from .mods import Mods

LOG2E = 1.4426950408889634
CLASSIFY_THREADS = 128   # functor.cuh: kClassifyThreads, kCompactThreads
COMPACT_THREADS = 128
GRID_YZ_MAX = 65535
UNSAFE_PATH = re.compile(r'["\\\n]')   # a path NVRTC gets inside a quoted -D value
POINTER_DTYPES = {"int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "float32": np.dtype(np.float32),
                  "float16": np.dtype(np.float16), "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_)}


@dataclass
class BoundFunctor:
    """A functor with its call's arguments checked: what the build, the parameter block and the launch need."""

    spec: ModSpec
    values: dict[str, Any]                        # argument name -> int, float or the caller's array
    build_key: str                                # "<path>@<sha256>": BuildConfig.functor
    keep: list = field(default_factory=list)      # device arrays alive until the launch is queued

    @property
    def features(self) -> tuple[str, ...]:
        """BuildConfig.mods entries (and manifest features) this functor needs."""
        return self.spec.functions

    def request_flags(self) -> dict[str, bool]:
        return {"score_mod": self.spec.score, "mask_mod": self.spec.mask}

    def kernel_fields(self, problem: Problem, to_device) -> dict:
        """Params fields: ModArgs from the values (arrays through to_device(x, name) -> CuPy), the softmax factor."""
        ptrs, ints, floats = [0] * ARG_SLOTS["pointer"], [0] * ARG_SLOTS["int"], [0.0] * ARG_SLOTS["float"]
        for arg in self.spec.args:
            value = self.values[arg.name]
            if arg.kind == "pointer":
                arr = to_device(value, f"mod_args['{arg.name}']")
                self.keep.append(arr)
                ptrs[arg.slot] = arr.data.ptr
            elif arg.kind == "int":
                ints[arg.slot] = value
            else:
                floats[arg.slot] = value
        fields: dict[str, Any] = {"mods": {"args": {"ptr": ptrs, "ints": ints, "floats": floats,
                                                    "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k}}}
        if self.spec.score:   # score_mod returns scaled scores: the softmax multiplies by log2(e) alone
            fields["softmax_scale_log2"] = LOG2E
        return fields

    def tile_geometry(self, problem: Problem, launch: dict[str, int]) -> dict[str, int]:
        """Params.mods' tile fields: rows per broadcast batch / head, query and key tiles of the build."""
        return {"tile_batch": problem.batch if "batch" in self.spec.mask_varies else 1,
                "tile_heads": problem.heads if "head" in self.spec.mask_varies else 1,
                "q_tiles": -(-problem.seqlen_q // launch["block_m"]),
                "k_tiles": -(-problem.seqlen_k // launch["block_n"])}

    def tile_fields(self, problem: Problem, launch: dict[str, int], cupy) -> dict:
        """mask_mod's tile buffers, allocated (the classifier fills them on the GPU); {} without a mask_mod."""
        if not self.spec.mask:
            return {}
        geo = self.tile_geometry(problem, launch)
        rows = geo["tile_batch"] * geo["tile_heads"] * geo["q_tiles"]
        counts = cupy.empty(2 * rows, dtype=cupy.int32)
        lists = cupy.empty(rows * geo["k_tiles"], dtype=cupy.int32)
        state = cupy.empty(rows * geo["k_tiles"], dtype=cupy.uint8)
        self.keep += [counts, lists, state]
        return {**geo, "tile_count": counts.data.ptr, "tile_list": lists.data.ptr, "tile_state": state.data.ptr}

    def classify(self, loaded, params_block, tiles: dict) -> None:
        """Launch the tile classifier and the compaction (functor.cuh) on the current stream, before the attention;
        tiles: what tile_fields returned (the geometry and the buffers the parameter block points at)."""
        if not self.spec.mask:
            return
        groups = tiles["tile_batch"] * tiles["tile_heads"]
        rows = groups * tiles["q_tiles"]
        loaded.aux["flashkit_functor_classify"]((tiles["k_tiles"], tiles["q_tiles"], groups), (CLASSIFY_THREADS, 1, 1),
                                                (params_block,))
        loaded.aux["flashkit_functor_compact"]((-(-rows // COMPACT_THREADS), 1, 1), (COMPACT_THREADS, 1, 1),
                                               (params_block,))

    def compile_error(self, error: CompileError) -> CompileError:
        """NVRTC's log as one error whose first line names the functor's file and line (or the first error)."""
        return functor_compile_error(self.spec, str(error))


def functor_compile_error(spec: ModSpec, log: str) -> CompileError:
    path = str(spec.path)
    errors = re.findall(r"^(.*?)\((\d+)\): (?:catastrophic )?error:? (.*)$", log, re.M)
    own = [e for e in errors if Path(e[0]).name == spec.path.name]
    if own or errors:
        where, line, msg = (own or errors)[0]
        where = path if own else where
        head = f"mod {spec.name!r} does not compile: {where}:{line}: error: {msg.strip()}"
    else:
        head = f"mod {spec.name!r} does not compile ({path}); NVRTC's log follows"
    return CompileError(head + "\n" + log)


@lru_cache(maxsize=64)
def _digest(path: str, stamp: tuple) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]


def build_key(spec: ModSpec) -> str:
    """"<path>@<sha256 of the file>": editing the functor builds (and caches) a new kernel."""
    st = spec.path.stat()
    return f"{spec.path.resolve()}@{_digest(str(spec.path), (st.st_mtime_ns, st.st_size))}"


def bind_functor(mod: Any, mod_args: Any, problem: Problem, mods: Mods, device: int | None,
                 catalogue=None) -> BoundFunctor:
    """Look the functor up and check mod_args against its manifest (InputError naming the argument)."""
    if not isinstance(mod, str):
        raise InputError(f"mod: expected a functor name (str), got {type(mod).__name__}")
    if catalogue is None:
        from ..registry import discover_kernels
        catalogue = discover_kernels()
    spec = catalogue.get_mod(mod)
    if UNSAFE_PATH.search(str(spec.path.resolve())):
        raise InputError(f"mod: the functor's path {spec.path} holds a quote, backslash or newline; move the file")
    if spec.score and (mods.softcap > 0 or mods.alibi):
        raise InputError(f"mod: {mod!r} has a score_mod; softcap and alibi_slopes cannot be added to it "
                         "(apply them inside the functor)")
    if mod_args is None:
        mod_args = {}
    if not isinstance(mod_args, dict):
        raise InputError(f"mod_args: expected a dict of {mod!r}'s arguments, got {type(mod_args).__name__}")
    declared = {a.name: a for a in spec.args}
    unknown = sorted(set(mod_args) - set(declared), key=str)
    if unknown:
        raise InputError(f"mod_args: {mod!r} takes no argument {unknown[0]!r}; it takes "
                         f"{', '.join(declared) or 'none'}")
    values = {}
    for arg in spec.args:
        if arg.name not in mod_args:
            if arg.default is None:
                raise InputError(f"mod_args: {mod!r} needs {arg.name!r} ({_kind_words(arg)})")
            values[arg.name] = arg.default
            continue
        values[arg.name] = check_arg(arg, mod_args[arg.name], problem, device)
    return BoundFunctor(spec, values, build_key(spec))


def _kind_words(arg: ModArg) -> str:
    if arg.kind == "pointer":
        shape = f" of shape ({', '.join(str(d) for d in arg.shape)})" if arg.shape else ""
        return f"a contiguous {arg.dtype} CUDA array{shape}"
    return f"an {arg.kind}" if arg.kind == "int" else "a float"


def check_arg(arg: ModArg, value: Any, problem: Problem, device: int | None):
    """One argument against its declaration; the value to pass (ints and floats normalised)."""
    name = f"mod_args['{arg.name}']"
    if arg.kind == "int":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise InputError(f"{name}: expected an int, got {type(value).__name__}")
        if not INT32_MIN <= int(value) <= INT32_MAX:
            raise InputError(f"{name}: expected an int32, got {value}")
        return int(value)
    if arg.kind == "float":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InputError(f"{name}: expected a float, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise InputError(f"{name}: expected a finite float, got {value}")
        return float(value)
    m = describe(value, name)
    check_on_gpu(m)
    want = _pointer_dtype(arg.dtype)
    if m.dtype != want:
        raise InputError(f"{name}: expected dtype {arg.dtype}, got {m.dtype}")
    if arg.shape is not None:
        sizes = {"batch": problem.batch, "heads": problem.heads, "kv_heads": problem.kv_heads,
                 "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k}
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in arg.shape)
        if tuple(m.shape) != shape:
            names = ", ".join(str(d) for d in arg.shape)
            raise InputError(f"{name}: expected shape ({names}) = {shape}, got {tuple(m.shape)}")
    contiguous = tuple(int(s) for s in np.cumprod((1,) + tuple(m.shape[::-1]))[:-1][::-1]) if m.shape else ()
    if any(st != c for st, c, n in zip(m.strides, contiguous, m.shape) if n > 1):
        raise InputError(f"{name}: expected a C-contiguous array, got strides {m.strides} (elements)")
    check_device(m, device)
    return value


def _pointer_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return POINTER_DTYPES[name]
