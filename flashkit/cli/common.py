"""Helpers the commands share: JSON output, errors as one line, architecture parsing."""

from __future__ import annotations

import functools
import json
import re

import click

from ..errors import FlashkitError, InputError


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def one_line_errors(fn):
    """Turn a FlashkitError into a click error: one line, exit status 1, no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FlashkitError as e:
            raise click.ClickException(str(e).splitlines()[0]) from None
    return wrapper


def parse_arch(text: str) -> tuple[int, int]:
    """'sm_90', 'sm_90a', '90' or '9.0' -> (9, 0)."""
    m = re.fullmatch(r"(?:sm_|compute_)?(\d)(\d)a?|(\d+)\.(\d+)", text.strip())
    if not m:
        raise InputError(f"--arch: expected an architecture like sm_80, sm_90 or 9.0, got {text!r}")
    major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return int(major), int(minor)


def device_cc_or_none() -> tuple[int, int] | None:
    from ..runtime.device import device_count, device_info
    return device_info().cc if device_count() else None
