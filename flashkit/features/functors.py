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
from ..errors import CompileError, InputError, UnsupportedError
from ..registry.functor_manifest import ARG_SLOTS, INT32_MAX, INT32_MIN, ModArg, ModSpec
from ..runtime.call_cache import arrays_signature, current_device
from ..runtime.launch import POINTER_FIELDS
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
    mods: Mods = Mods()                           # the call's built-in modifications (they shape the tiles)
    snapshot: Any = None                          # features/mod_mask.KeptTiles (a ModMask, named_tiles) or None
    keep: list = field(default_factory=list)      # device arrays alive until the launch is queued
    tiles: tuple = ()                             # tile_fields' (buffers, held by the snapshot)
    launch: "FunctorLaunch | None" = None         # set by api.run once built: what a cached call redoes

    @property
    def features(self) -> tuple[str, ...]:
        """BuildConfig.mods entries (and manifest features) this functor needs."""
        return self.spec.build_features

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

    def mask_rows(self, problem: Problem) -> tuple[int, int]:
        """(batch, heads) of the mask_mod's tile rows: the call's where the manifest's mask_varies names them, else
        1 (the tiles broadcast)."""
        return (problem.batch if "batch" in self.spec.mask_varies else 1,
                problem.heads if "head" in self.spec.mask_varies else 1)

    def tile_geometry(self, problem: Problem, launch: dict[str, int]) -> dict[str, int]:
        """Params.mods' tile fields: rows per broadcast batch / head, query and key tiles of the build."""
        batch, heads = self.mask_rows(problem)
        return {"tile_batch": batch, "tile_heads": heads,
                "q_tiles": -(-problem.seqlen_q // launch["block_m"]),
                "k_tiles": -(-problem.seqlen_k // launch["block_n"])}

    def variable_fields(self) -> tuple[str, ...]:
        """The Params fields a cached call of this functor puts in per call (FunctorLaunch.pointers' order): its
        array arguments' addresses, then a mask_mod's fresh tile buffers."""
        return tuple(f"mods.args.ptr[{a.slot}]" for a in self.spec.args if a.kind == "pointer") + (
            TILE_BUFFERS if self.spec.mask else ())

    def tiles_key(self, direction: str, variant: str, config, problem: Problem) -> tuple:
        """What a mask_mod's classification depends on beside its arguments: the direction (forward and backward
        tiles differ), the variant and build (tile sizes, causal), the problem, the built-in modifications (window,
        chunk) and the device; a ModMask keeps its classifications under it."""
        return (direction, variant, config, problem, self.mods, current_device())

    def tile_fields(self, problem: Problem, launch: dict[str, int], cupy, key: tuple) -> dict:
        """mask_mod's tile geometry and buffers ({} without one): the snapshot's classified ones under key, else
        new ones (FunctorLaunch.classify fills them)."""
        if not self.spec.mask:
            return {}
        geo = self.tile_geometry(problem, launch)
        held = self.snapshot.held(key) if self.snapshot is not None else None
        buffers = tile_buffers(geo, cupy) if held is None else held
        self.tiles = (buffers, held is not None)
        self.keep += buffers
        return {**geo, **{name: b.data.ptr for name, b in zip(TILE_FIELDS, buffers)}}

    def classify(self, params) -> None:
        """The full path's classification of its tile_fields (launch: set), unless a snapshot held them; a
        snapshot keeps the new ones."""
        if not self.spec.mask:
            return
        buffers, held = self.tiles
        if not held:
            self.launch.classify(params, snapshot=self.snapshot, buffers=buffers)

    def launcher(self, loaded, problem: Problem, launch: dict[str, int], key: tuple) -> "FunctorLaunch":
        """What a call of this functor redoes per call, on the build `loaded` (its classify / compact entries)."""
        return FunctorLaunch(self.spec, loaded, self.tile_geometry(problem, launch) if self.spec.mask else {}, key)

    def compile_error(self, error: CompileError) -> CompileError:
        """NVRTC's log as one error whose first line names the functor's file and line (or the first error)."""
        return functor_compile_error(self.spec, str(error))


TILE_FIELDS = ("tile_count", "tile_list", "tile_state")          # Params.mods' tile buffers (functor.cuh)
TILE_BUFFERS = tuple(f"mods.{name}" for name in TILE_FIELDS)


def tile_buffers(geo: dict[str, int], cupy) -> tuple:
    """A mask_mod's tile buffers for one call, TILE_FIELDS' order: per (batch, head, query tile) row its
    counts of partial and full key tiles, its key-tile list, and each tile's state."""
    rows = geo["tile_batch"] * geo["tile_heads"] * geo["q_tiles"]
    return (cupy.empty(2 * rows, dtype=cupy.int32), cupy.empty(rows * geo["k_tiles"], dtype=cupy.int32),
            cupy.empty(rows * geo["k_tiles"], dtype=cupy.uint8))


@dataclass(frozen=True)
class FunctorLaunch:
    """A functor's part of a launch: its array arguments' addresses and, for a mask_mod, the tile classification
    on the GPU before the attention (both per call; the scalars are fixed by the call's signature)."""

    spec: ModSpec
    loaded: Any                 # the build: its flashkit_functor_classify / _compact entries
    geometry: dict[str, int]    # tile_geometry ({} without a mask_mod)
    key: tuple = ()             # BoundFunctor.tiles_key: where a ModMask keeps this launch's classification

    def prepare(self, params, mod_args: dict, cupy, keep: list, extra: tuple[int, ...] = (),
                snapshot: Any = None) -> tuple[int, ...]:
        """BoundFunctor.variable_fields' values for a call whose mod_args are CuPy arrays and scalars (a cached
        signature's), after extra (the call's other variable fields): the arrays' addresses, then a mask_mod's tile
        buffers, the snapshot's (a ModMask) where it holds this launch's, else new ones (held in keep until the
        launch is queued) classified now and, with a snapshot, kept by it."""
        ptrs = tuple(mod_args[a.name].data.ptr for a in self.spec.args if a.kind == "pointer")
        if not self.spec.mask:
            return ptrs
        held = snapshot.held(self.key) if snapshot is not None else None
        if held is not None:
            return ptrs + tuple(b.data.ptr for b in held)
        buffers = tile_buffers(self.geometry, cupy)
        keep += buffers
        ptrs += tuple(b.data.ptr for b in buffers)
        self.classify(params, extra + ptrs, snapshot, buffers)
        return ptrs

    def classify(self, params, extra: tuple[int, ...] = (), snapshot: Any = None, buffers: tuple = ()) -> None:
        """Launch the tile classifier and the compaction (functor.cuh) on the current stream, before the attention;
        params: the launch's ParamTemplate, extra: the call's values of its variable fields (none: the template's
        own). The classifier reads the arguments and writes the tiles, never an array of the attention: those
        addresses go in as 0, on either path. A snapshot (a ModMask) keeps the tile buffers classified."""
        if not self.spec.mask:
            return
        params_block = params.fill(*(0,) * len(POINTER_FIELDS), *extra)
        geo = self.geometry
        groups = geo["tile_batch"] * geo["tile_heads"]
        rows = groups * geo["q_tiles"]
        aux = self.loaded.aux
        launch_classifier(aux, params_block, groups, geo["q_tiles"], geo["k_tiles"])
        aux["flashkit_functor_compact"]((-(-rows // COMPACT_THREADS), 1, 1), (COMPACT_THREADS, 1, 1), (params_block,))
        if snapshot is not None:
            snapshot.hold(self.key, buffers)


def launch_classifier(aux: dict, params_block, groups: int, q_tiles: int, k_tiles: int) -> None:
    """A mask_mod build's tile classifier (functor.cuh's flashkit_functor_classify) over groups (tile batch x tile
    head) x q_tiles x k_tiles, writing Params.mods.tile_state; the forward's and the backward's lists start here."""
    aux["flashkit_functor_classify"]((k_tiles, q_tiles, groups), (CLASSIFY_THREADS, 1, 1), (params_block,))


def functor_signature(mod: Any, mod_args: Any) -> tuple | None:
    """The functor's part of a cached attention() key: its name, its file's state (an edit builds anew) and its
    arguments (scalars with their types, CuPy arrays by metadata); None where the call takes the full path (an
    unknown functor, an argument of another kind: the full path checks and names it)."""
    from ..registry import discover_kernels
    if type(mod) is not str or not (mod_args is None or type(mod_args) is dict):
        return None
    spec = discover_kernels().mods.get(mod)
    if spec is None:
        return None
    try:
        st = spec.path.stat()
    except OSError:
        return None
    args = []
    for name, value in sorted((mod_args or {}).items(), key=lambda item: str(item[0])):
        if isinstance(value, SCALAR_TYPES):
            args.append((name, type(value), value))
            continue
        sig = arrays_signature(value)
        if sig is None:
            return None
        args.append((name, sig[0]))
    return ("mod", mod, str(spec.path), st.st_mtime_ns, st.st_size, tuple(args))


SCALAR_TYPES = (int, float, np.integer, np.floating)   # bool is an int: its type in the key tells it apart


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
        raise InputError(f"mod: expected a functor name (str) or a flashkit.ModMask, got {type(mod).__name__}")
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
    return BoundFunctor(spec, values, build_key(spec), mods)


def check_gradient(spec: ModSpec, hint: str = "") -> None:
    """UnsupportedError where a backward would need spec's score_mod derivative and the file lacks it."""
    if spec.lacks_gradient:
        raise UnsupportedError(f"mod: {spec.name!r} has a score_mod without score_mod_grad, its derivative, which "
                               f"the backward needs (or bias: true where it adds a term that does not read the score; "
                               f"docs/functors.md){hint}")


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
