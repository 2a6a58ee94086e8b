"""Compile a variant for a configuration and architecture; cache cubins on disk, modules in memory."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..call.dtypes import BY_NAME
from ..errors import UnsupportedError
from ..registry.manifest import KernelSpec
from .call_cache import invalidate as invalidate_calls
from .cubin import exported_ints
from .device import cupy_module, device_info
from .nvrtc import Compiled, compile_cubin, nvrtc_version

log = logging.getLogger("flashkit.compile")
INCLUDE_DIR = Path(__file__).resolve().parent.parent / "cuda_src" / "include"
SMEM_SYMBOL = "flashkit_smem_bytes"
DEFAULT_SMEM_LIMIT = 48 * 1024   # above this a kernel must opt in to more dynamic shared memory


@dataclass(frozen=True)
class BuildConfig:
    """One specialization of a variant: everything that becomes a -D define."""

    dtype: str
    head_dim: int                # the compiled head dim: the call's head-dim class (manifest head_dims.classes)
    causal: bool
    launch: tuple[tuple[str, int], ...]
    out_dtype: str | None = None
    block_sparse: bool = False
    mods: tuple[str, ...] = ()   # built-in modifications compiled in: window, softcap, alibi (features/mods.py)
    functor: str | None = None   # a drop-in functor built in, "<path>@<sha256 of its text>" (features/functors.py)
    head_dim_padded: bool = False   # the call's head dim (Params.head_dim) is below head_dim
    head_dim_v: int | None = None   # the compiled head dim of v and o (its class) where it differs from q / k's
    head_dim_v_padded: bool = False   # the call's head_dim_v (Params.head_dim_v) is below head_dim_v

    @property
    def launch_dict(self) -> dict[str, int]:
        return dict(self.launch)

    def defines(self) -> list[str]:
        out_dtype = self.out_dtype or self.dtype
        flags = [f"-DFLASHKIT_DTYPE={BY_NAME[self.dtype].code}",
                 f"-DFLASHKIT_OUT_DTYPE={BY_NAME[out_dtype].code}",
                 f"-DFLASHKIT_HEAD_DIM={self.head_dim}",
                 f"-DFLASHKIT_CAUSAL={int(self.causal)}",
                 f"-DFLASHKIT_BLOCK_SPARSE={int(self.block_sparse)}"]
        flags += ["-DFLASHKIT_HEAD_DIM_PADDED=1"] if self.head_dim_padded else []
        if self.head_dim_v is not None:   # traits.cuh: V and O of their own class (default: Q / K's)
            flags += [f"-DFLASHKIT_HEAD_DIM_V={self.head_dim_v}",
                      f"-DFLASHKIT_HEAD_DIM_V_PADDED={int(self.head_dim_v_padded)}"]
        flags += [f"-DFLASHKIT_{m.upper()}=1" for m in self.mods]
        if self.functor:   # functor.cuh includes the file; its hash keys the cubin cache
            path, digest = self.functor.rsplit("@", 1)
            flags += [f'-DFLASHKIT_MOD_FILE="{path}"', f"-DFLASHKIT_MOD_SHA256={digest}"]
        return flags + [f"-DFLASHKIT_{k.upper()}={v}" for k, v in self.launch]

    def describe(self) -> str:
        parts = [self.dtype] + ([f"-> {self.out_dtype}"] if self.out_dtype not in (None, self.dtype) else [])
        parts += [f"hd{self.head_dim}" + (" padded" if self.head_dim_padded else "")]
        if self.head_dim_v is not None:
            parts += [f"hdv{self.head_dim_v}" + (" padded" if self.head_dim_v_padded else "")]
        parts += ["causal"] if self.causal else []
        parts += (["block_sparse"] if self.block_sparse else []) + list(self.mods)
        parts += [f"functor={Path(self.functor.rsplit('@', 1)[0]).stem}"] if self.functor else []
        parts += [f"{k}={v}" for k, v in self.launch]
        return " ".join(parts)


def launch_table(spec: KernelSpec, cc: tuple[int, int] | None, head_dim: int, mods: tuple[str, ...], causal: bool,
                 block_sparse: bool = False, seqlen_q: int | None = None) -> dict[str, int]:
    """The launch table a build of the call takes (KernelSpec.launch_config); a block mask's build takes the
    manifest's 'hd<N>/block_sparse' override too."""
    return spec.launch_config(cc, head_dim, tuple(mods) + (("block_sparse",) if block_sparse else ()), causal,
                              seqlen_q)


def make_config(spec: KernelSpec, dtype: str, head_dim: int, causal: bool, cc: tuple[int, int] | None,
                block_sparse: bool = False, out_dtype: str | None = None, mods: tuple[str, ...] = (),
                functor: str | None = None, head_dim_v: int | None = None, seqlen_q: int | None = None) -> BuildConfig:
    """The specialization of a call of head dim `head_dim`: compiled for its class, padded when below it; with a
    head_dim_v other than head_dim (v and o narrower than q and k), V and O compiled for head_dim_v's class; its
    tiles those of a call of seqlen_q query rows (None: of the longest calls; KernelSpec.launch_config)."""
    launch = launch_table(spec, cc, head_dim, mods, causal, block_sparse, seqlen_q)
    compiled = spec.head_dims.class_of(head_dim)
    v_class = None if head_dim_v in (None, head_dim) else spec.head_dims.class_of(head_dim_v)
    return BuildConfig(dtype, compiled, causal, tuple(sorted(launch.items())), out_dtype, block_sparse, tuple(mods),
                       functor, head_dim_padded=compiled != head_dim, head_dim_v=v_class,
                       head_dim_v_padded=v_class is not None and v_class != head_dim_v)


@lru_cache(maxsize=None)
def _header_digest(include_dir: Path, stamp: tuple) -> str:
    h = hashlib.sha256()
    for path in sorted(include_dir.rglob("*.cuh")):
        h.update(str(path.relative_to(include_dir)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def header_digest(include_dir: Path | None = None) -> str:
    """A hash over every header under a directory (the shared one by default): editing one invalidates the cache."""
    root = include_dir or INCLUDE_DIR
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*.cuh")))
    return _header_digest(root, stamp)


def kernel_source(spec: KernelSpec) -> str:
    """The variant's source with the hashes of the shared headers and of the headers beside it appended."""
    return (spec.path.read_text(encoding="utf-8") + f"\n// flashkit headers sha256 {header_digest()}"
            f"\n// local headers sha256 {header_digest(spec.path.parent)}\n")


def compile_options(spec: KernelSpec, config: BuildConfig, target: str) -> list[str]:
    return [f"-arch={target}", "-std=c++17", "--ptxas-options=-v",
            f"-I{INCLUDE_DIR}", f"-I{spec.path.parent}"] + config.defines()


def compile_variant(spec: KernelSpec, config: BuildConfig, target: str) -> Compiled:
    """Compile one specialization for one NVRTC target (no GPU needed)."""
    return compile_cubin(kernel_source(spec), spec.path.name, compile_options(spec, config, target))


def cache_dir() -> Path:
    root = os.environ.get("FLASHKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "flashkit")
    return Path(root)


def cache_key(spec: KernelSpec, config: BuildConfig, target: str) -> str:
    h = hashlib.sha256()
    for part in (kernel_source(spec), " ".join(compile_options(spec, config, target)), str(nvrtc_version())):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def cubin_path(spec: KernelSpec, config: BuildConfig, target: str) -> Path:
    return cache_dir() / f"{spec.name}-{cache_key(spec, config, target)}.cubin"


def ensure_cubin(spec: KernelSpec, config: BuildConfig, target: str) -> Path:
    """The cached cubin of a specialization, compiled (and logged) first if it is not on disk."""
    path = cubin_path(spec, config, target)
    if not path.exists():
        store_cubin(spec, config, target, compile_variant(spec, config, target))
    return path


def store_cubin(spec: KernelSpec, config: BuildConfig, target: str, compiled: Compiled) -> Path:
    """Write a compiled cubin into the cache (atomically: a concurrent reader sees all of it or none)."""
    path = cubin_path(spec, config, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(compiled.cubin)
    os.replace(tmp, path)
    log.info("compiled %s [%s] for %s in %.2f s", spec.name, config.describe(), target, compiled.seconds)
    return path


@dataclass
class LoadedKernel:
    """A loaded module's entries, in launch order, and the dynamic shared memory they need."""

    functions: list
    smem_bytes: int
    aux: dict = field(default_factory=dict)   # helper entries by name (a mask_mod build's tile classifier)
    entry_smem: tuple = ()                    # per entry, where the module exports its own (else smem_bytes)
    module: object = None                     # the cupy RawModule (its globals: the timeline launch flag's stamps)

    def smem_of(self, index: int) -> int:
        """The dynamic shared memory entry `index` launches with."""
        return self.entry_smem[index] if self.entry_smem else self.smem_bytes


_MODULES: dict[tuple, LoadedKernel] = {}


def clear_loaded() -> None:
    """Forget loaded modules, so the next call rereads sources and headers (for kernel development)."""
    _MODULES.clear()
    invalidate_calls()   # the cached per-signature decisions hold loaded kernels


def build_module(spec: KernelSpec, config: BuildConfig, cc: tuple[int, int]) -> LoadedKernel:
    """Compile (or fetch from the disk cache) and load one specialization for this device.

    Loaded modules are kept per process; the source hash is checked on the first load only.
    """
    target = spec.target(cc)
    key = (spec.path, config, target, cupy_module().cuda.Device().id)
    if key in _MODULES:
        return _MODULES[key]
    path = ensure_cubin(spec, config, target)
    smem, entry_smem = smem_bytes(spec, path.read_bytes())
    limit = device_info().max_smem_per_block
    if max(entry_smem) > limit:
        raise UnsupportedError(f"{spec.name} [{config.describe()}] needs {max(entry_smem)} bytes of shared memory a "
                               f"block; this GPU ({target}) gives at most {limit}")
    module = cupy_module().RawModule(path=str(path))
    functions = [module.get_function(entry) for entry in spec.entries]
    for fn, bytes_ in zip(functions, entry_smem):
        if bytes_ > DEFAULT_SMEM_LIMIT:
            fn.max_dynamic_shared_size_bytes = bytes_
    aux = {entry: module.get_function(entry) for entry in aux_entries(spec, config)}
    loaded = LoadedKernel(functions, smem, aux, entry_smem, module)
    _MODULES[key] = loaded
    return loaded


def loaded_from(path: Path) -> list[LoadedKernel]:
    """The builds of the variant file at `path` this process has loaded (every configuration, device)."""
    return [loaded for key, loaded in _MODULES.items() if Path(key[0]) == Path(path)]


# Entries a build adds beside the manifest's: functor.cuh's FLASHKIT_FUNCTOR_ENTRIES (a mask_mod's tile classifier)
# and a backward's list compactions (bwd_lists.cuh: with a block mask or a mask_mod).
AUX_ENTRIES = {"mask_mod": ("flashkit_functor_classify", "flashkit_functor_compact"),
               "bwd_lists": ("flashkit_bwd_list_columns", "flashkit_bwd_list_ranks")}


def aux_entries(spec: KernelSpec, config: BuildConfig) -> tuple[str, ...]:
    mask_mod = bool(config.functor) and "mask_mod" in config.mods
    lists = bool(spec.features.get("backward")) and (config.block_sparse or mask_mod)
    return (AUX_ENTRIES["mask_mod"] if mask_mod else ()) + (AUX_ENTRIES["bwd_lists"] if lists else ())


def smem_bytes(spec: KernelSpec, cubin: bytes) -> tuple[int, tuple[int, ...]]:
    """The module's dynamic shared memory (FLASHKIT_EXPORT_SMEM_BYTES, 0 if none) and each entry's, read from the
    cubin: an entry that exports its own (FLASHKIT_EXPORT_ENTRY_SMEM_BYTES: a pre-pass beside a big main kernel)
    launches with it, so that it is not held to the main kernel's occupancy; the others with the module's."""
    exported = exported_ints(cubin, SMEM_SYMBOL)
    module = exported.get(SMEM_SYMBOL, 0)
    return module, tuple(exported.get(f"{SMEM_SYMBOL}_{entry}", module) for entry in spec.entries)
