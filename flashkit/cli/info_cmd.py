"""flashkit info: the GPU, the toolchain, the cache and the kernel search path."""

from __future__ import annotations

import platform

import click

from ..registry import discover_kernels, kernel_search_path
from ..runtime.build import cache_dir
from ..runtime.nvrtc import nvrtc_version
from .common import emit_json, one_line_errors


def gather() -> dict:
    info = {"python": platform.python_version(), "cache_dir": str(cache_dir()),
            "kernel_path": [str(p) for p in kernel_search_path()],
            "mods": {name: str(m.path) for name, m in sorted(discover_kernels().mods.items())}}
    v = nvrtc_version()
    info["nvrtc"] = f"{v[0]}.{v[1]}" if v else "not installed"
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = "not installed"
        info["gpu"] = None
        return info
    from ..runtime.device import device_count, device_info
    if device_count() == 0:
        info["gpu"] = None
        return info
    d = device_info()
    info["gpu"] = {"name": d.name, "compute_capability": f"{d.cc[0]}.{d.cc[1]}", "sm_count": d.sm_count,
                   "max_smem_per_block": d.max_smem_per_block, "driver": d.driver, "runtime": d.runtime}
    return info


@click.command("info")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@one_line_errors
def command(as_json: bool) -> None:
    """Show the GPU, NVRTC and CuPy versions, the cache dir and the kernel search path."""
    info = gather()
    if as_json:
        emit_json(info)
        return
    gpu = info["gpu"]
    if gpu:
        click.echo(f"gpu:          {gpu['name']} (compute capability {gpu['compute_capability']}, "
                   f"{gpu['sm_count']} SMs, {gpu['max_smem_per_block'] // 1024} KB smem/block)")
        click.echo(f"driver:       {gpu['driver']}   runtime: {gpu['runtime']}")
    else:
        click.echo("gpu:          none found")
    click.echo(f"nvrtc:        {info['nvrtc']}")
    click.echo(f"cupy:         {info['cupy']}")
    click.echo(f"python:       {info['python']}")
    click.echo(f"cache dir:    {info['cache_dir']}")
    click.echo("kernel path:  " + "\n              ".join(info["kernel_path"]))
    click.echo("functors:     " + ("\n              ".join(f"{n} ({p})" for n, p in info["mods"].items()) or "none")
               + "\n              (each kernel directory's *.cu and mods/*.cu with kind: modification)")
