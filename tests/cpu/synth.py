"""CPU-tier helpers: synthetic variant files (a base manifest, edited field by field) and shared assertions."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from flashkit.errors import FlashkitError, InputError

BASE_MANIFEST = {
    "name": "toy",
    "summary": "a test variant",
    "entry": "flashkit_toy_fwd",
    "arch": {"min": "8.0"},
    "dtypes": ["float16", "bfloat16"],
    "head_dims": [64, 128, 256],
    "features": {"causal": True, "block_sparse": False, "fp8": False, "backward": False, "lse": True,
                 "gqa": True},
    "priority": 10,
    "launch": {"grid": "q_blocks", "block_m": 64, "block_n": 64, "warps": 4},
}

BODY = '\n#include "flashkit/params.cuh"\nextern "C" __global__ void {entry}(const flashkit::Params params) {{}}\n'


def manifest(**fields) -> dict:
    """The base manifest with fields replaced; a value of None deletes the field."""
    data = copy.deepcopy(BASE_MANIFEST)
    for key, value in fields.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def write_cu(directory: Path, filename: str, data) -> Path:
    """A .cu file whose leading comment is `data` as YAML (a str is written verbatim), with an empty entry."""
    directory.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    entry = data.get("entry") if isinstance(data, dict) else None
    entry = entry[0] if isinstance(entry, list) and entry else entry
    if not (isinstance(entry, str) and entry.isidentifier()):
        entry = "flashkit_placeholder"
    path = directory / filename
    path.write_text(f"/*---\n{text.rstrip()}\n---*/\n" + BODY.format(entry=entry))
    return path


def spec_of(tmp_path: Path, name: str = "toy", **fields):
    """A KernelSpec parsed from a synthetic manifest."""
    from flashkit.registry.manifest import parse_manifest
    fields.setdefault("entry", f"flashkit_{name}_fwd")
    return parse_manifest(write_cu(tmp_path, f"{name}.cu", manifest(name=name, **fields)))


# --- device arrays without a device ---------------------------------------------------------------

ITEM = {"<f2": 2, "<f4": 4, "<f8": 8, "|u1": 1, "<i4": 4, "<V2": 2, "|b1": 1}


class FakeCUDA:
    """A device array as far as __cuda_array_interface__ goes (the pointer is never dereferenced)."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "strides": strides,
                                         "data": (ptr, False), "version": 3}


def cuda(shape, typestr="<f2", strides_elems=None):
    """A FakeCUDA with strides given in elements (None: C-contiguous, as the interface allows)."""
    item = ITEM[typestr]
    strides = None if strides_elems is None else tuple(s * item for s in strides_elems)
    return FakeCUDA(shape, typestr, strides)


B, SQ, SK, H, D = 2, 17, 33, 4, 64


def qkv(q_shape=(B, SQ, H, D), kv_shape=(B, SK, H, D), typestr="<f2"):
    return cuda(q_shape, typestr), cuda(kv_shape, typestr), cuda(kv_shape, typestr)


def input_error(fn, *args, **kwargs) -> str:
    """fn's InputError message, checked to be a FlashkitError on one line."""
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert isinstance(info.value, FlashkitError) and msg and "\n" not in msg, msg
    return msg
