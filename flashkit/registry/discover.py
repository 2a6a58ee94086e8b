"""Find variant files: the package's cuda_src/, FLASHKIT_KERNEL_PATH, then the `flashkit.kernels` entry points."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ..errors import ManifestError
from .manifest import KernelSpec, parse_manifest

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "cuda_src"
ENTRY_POINT_GROUP = "flashkit.kernels"


@dataclass
class Catalogue:
    """Every valid spec by name, and one line per file whose manifest was rejected."""

    specs: dict[str, KernelSpec] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def get(self, name: str) -> KernelSpec:
        if name not in self.specs:
            from ..errors import InputError
            raise InputError(f"variant: unknown variant {name!r}; known: {', '.join(sorted(self.specs))}")
        return self.specs[name]


def kernel_search_path() -> list[Path]:
    """Directories searched, in order."""
    dirs = [BUILTIN_DIR]
    dirs += [Path(p) for p in os.environ.get("FLASHKIT_KERNEL_PATH", "").split(os.pathsep) if p]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
            dirs.append(Path(target() if callable(target) else target))
        except Exception as e:  # a broken plugin must not break flashkit
            dirs.append(Path(f"<entry point {ep.name}: {e}>"))
    return dirs


_CACHE: dict[tuple, Catalogue] = {}


def discover_kernels(refresh: bool = False) -> Catalogue:
    """All variants on the search path; a name found twice raises ManifestError naming both files."""
    dirs = kernel_search_path()
    key = tuple(str(d) for d in dirs) + tuple(
        (str(f), f.stat().st_mtime_ns) for d in dirs if d.is_dir() for f in sorted(d.glob("*.cu")))
    if not refresh and key in _CACHE:
        return _CACHE[key]
    cat = Catalogue()
    for d in dirs:
        if not d.is_dir():
            cat.problems.append(f"{d}: kernel directory not found")
            continue
        for path in sorted(d.glob("*.cu")):
            try:
                spec = parse_manifest(path)
            except ManifestError as e:
                cat.problems.append(str(e))
                continue
            if spec.name in cat.specs:
                raise ManifestError(f"variant name {spec.name!r} is declared twice: "
                                    f"{cat.specs[spec.name].path} and {path}")
            cat.specs[spec.name] = spec
    _CACHE.clear()
    _CACHE[key] = cat
    return cat
