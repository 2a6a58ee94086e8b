"""The `flashkit` command: a thin click group over the API, the registry, verify and bench."""

from __future__ import annotations

import logging
import os
import sys

import click

from .. import __version__
from ..errors import FlashkitError
from . import compile_cmd, explain_cmd, info_cmd, list_cmd, verify_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="flashkit")
def cli() -> None:
    """Attention kernels for NVIDIA GPUs, compiled at run time."""


for module in (list_cmd, info_cmd, explain_cmd, compile_cmd, verify_cmd):
    cli.add_command(module.command)
try:
    from . import bench_cmd
    cli.add_command(bench_cmd.command)
except ImportError:  # bench's module is optional while it is being written
    pass


def main() -> None:
    """Console entry: flashkit errors become one line on stderr and exit status 2."""
    logging.basicConfig(level=os.environ.get("FLASHKIT_LOG", "INFO").upper(), format="flashkit: %(message)s")
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except FlashkitError as e:
        click.echo(f"error: {str(e).splitlines()[0]}", err=True)
        sys.exit(2)
