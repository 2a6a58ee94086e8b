"""Find variant files: the package's cuda_src/, FLASHKIT_KERNEL_PATH, then the `flashkit.kernels` entry points.

Each directory's *.cu and mods/*.cu are read; a manifest with `kind: modification` is a drop-in functor
(registry/functor_manifest.py, its own name space), any other a kernel variant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from ..errors import ManifestError
from ..runtime.call_cache import invalidate as invalidate_calls
from .functor_manifest import ModSpec, is_modification, mod_spec_from
from .manifest import KernelSpec, spec_from, load_manifest

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "cuda_src"
ENTRY_POINT_GROUP = "flashkit.kernels"
MODS_SUBDIR = "mods"   # drop-in functors may sit in a directory's mods/ folder


@dataclass
class Catalogue:
    """Every valid spec by name, and one line per file whose manifest was rejected."""

    specs: dict[str, KernelSpec] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    mods: dict[str, ModSpec] = field(default_factory=dict)   # drop-in functors by name

    def get(self, name: str) -> KernelSpec:
        if name not in self.specs:
            from ..errors import InputError
            raise InputError(f"variant: unknown variant {name!r}; known: {', '.join(sorted(self.specs))}")
        return self.specs[name]

    def get_mod(self, name: str) -> ModSpec:
        if name not in self.mods:
            from ..errors import InputError
            raise InputError(f"mod: unknown functor {name!r}; known: {', '.join(sorted(self.mods)) or 'none'} "
                             "(drop-in files: cuda_src/mods/ and each FLASHKIT_KERNEL_PATH directory)")
        return self.mods[name]


def parse_file(path: Path) -> KernelSpec | ModSpec:
    """A kernel variant or a drop-in functor, by its manifest's kind; ManifestError names the file and field."""
    data = load_manifest(path)
    return mod_spec_from(path, data) if is_modification(data) else spec_from(path, data)


@lru_cache(maxsize=1)
def _entry_point_dirs() -> tuple[Path, ...]:
    """Directories from the entry-point group, looked up once per process (the scan is slow)."""
    dirs = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            dirs.append(Path(target() if callable(target) else target))
        except Exception as e:  # a broken plugin must not break flashkit
            dirs.append(Path(f"<entry point {ep.name}: {e}>"))
    return tuple(dirs)


def kernel_search_path(refresh: bool = False) -> list[Path]:
    """Directories searched, in order."""
    if refresh:
        _entry_point_dirs.cache_clear()
    dirs = [BUILTIN_DIR]
    dirs += [Path(p) for p in os.environ.get("FLASHKIT_KERNEL_PATH", "").split(os.pathsep) if p]
    return dirs + list(_entry_point_dirs())


_CACHE: dict[tuple, Catalogue] = {}


def discover_kernels(refresh: bool = False) -> Catalogue:
    """All variants on the search path (cached per path; refresh=True rereads the files).

    A name found twice raises ManifestError naming both files.
    """
    dirs = kernel_search_path(refresh)
    key = tuple(str(d) for d in dirs)
    if not refresh and key in _CACHE:
        return _CACHE[key]
    cat = Catalogue()
    for d in dirs:
        if not d.is_dir():
            cat.problems.append(f"{d}: kernel directory not found")
            continue
        for path in sorted(d.glob("*.cu")) + sorted((d / MODS_SUBDIR).glob("*.cu")):
            try:
                spec = parse_file(path)
            except ManifestError as e:
                cat.problems.append(str(e))
                continue
            table, what = (cat.mods, "functor") if isinstance(spec, ModSpec) else (cat.specs, "variant")
            if spec.name in table:
                raise ManifestError(f"{what} name {spec.name!r} is declared twice: "
                                    f"{table[spec.name].path} and {path}")
            table[spec.name] = spec
    _CACHE.clear()
    _CACHE[key] = cat
    invalidate_calls()   # a new catalogue may select differently: drop every cached per-signature decision
    return cat
