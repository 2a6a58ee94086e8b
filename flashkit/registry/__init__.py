"""The kernel registry: manifests, discovery and selection."""

from .discover import Catalogue, discover_kernels, kernel_search_path
from .functor_manifest import ModSpec
from .manifest import KernelSpec, parse_manifest
from .select import Request, Selection, select_kernel

__all__ = ["Catalogue", "KernelSpec", "ModSpec", "Request", "Selection", "discover_kernels",
           "kernel_search_path", "parse_manifest", "select_kernel"]
