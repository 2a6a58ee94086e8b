"""features/mods.py and the API's modification arguments: validation on metadata alone, the kernel fields."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
from flashkit.call.validate import Problem
from flashkit.features.mods import NO_MODS, Mods, check_mods, kernel_fields
from flashkit.runtime.params import make_params

from ..synth import B, H, cuda, qkv, input_error

PROBLEM = Problem(batch=B, seqlen_q=17, seqlen_k=33, heads=H, kv_heads=H, head_dim=64, dtype="float16",
                  softmax_scale=0.125)


def no_gpu_needed(monkeypatch):
    import flashkit.api as api

    def forbidden(*a, **k):
        raise AssertionError("validation must finish before the device, the compiler or a launch is touched")
    for name in ("device_info", "build_module", "launch", "run", "to_cupy", "cupy_module", "select_kernel"):
        monkeypatch.setattr(api, name, forbidden)


BAD = [
    ("window_size", dict(window_size=5), "two ints >= -1"),
    ("window_size", dict(window_size=(1, 2, 3)), "two ints >= -1"),
    ("window_size", dict(window_size=(1.0, 2)), "two ints >= -1"),
    ("window_size", dict(window_size=(True, 2)), "two ints >= -1"),
    ("window_size", dict(window_size=(-2, 0)), "-1: unbounded"),
    ("softcap", dict(softcap="1"), "expected a float"),
    ("softcap", dict(softcap=True), "expected a float"),
    ("softcap", dict(softcap=-1.0), ">= 0"),
    ("softcap", dict(softcap=float("inf")), "finite"),
    ("softcap", dict(softcap=float("nan")), "finite"),
    ("attention_chunk", dict(attention_chunk=-4), "int >= 0"),
    ("attention_chunk", dict(attention_chunk=2.5), "int >= 0"),
    ("alibi_slopes", dict(alibi_slopes=np.ones(H, dtype=np.float32)), "on the CPU"),
    ("alibi_slopes", dict(alibi_slopes=cuda((H,), "<f2")), "float32"),
    ("alibi_slopes", dict(alibi_slopes=cuda((H + 1,), "<f4")), f"({H},) or ({B}, {H})"),
    ("alibi_slopes", dict(alibi_slopes=cuda((B, H, 1), "<f4")), f"({H},) or ({B}, {H})"),
    ("alibi_slopes", dict(alibi_slopes=cuda((B + 1, H), "<f4")), f"({H},) or ({B}, {H})"),
]


@pytest.mark.parametrize("arg,kwargs,detail", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_bad_modification_names_its_argument_before_any_launch(monkeypatch, arg, kwargs, detail):
    no_gpu_needed(monkeypatch)
    msg = input_error(flashkit.attention, *qkv(), **kwargs)
    assert msg.split(": ")[0] == arg, msg
    assert detail in msg, msg


def test_alibi_on_another_device(monkeypatch):
    import dataclasses

    import flashkit.features.mods as mods_module
    slopes = cuda((H,), "<f4")
    meta = dataclasses.replace(mods_module.describe(slopes, "alibi_slopes"), device=3)
    monkeypatch.setattr(mods_module, "describe", lambda x, name: meta)
    msg = input_error(check_mods, PROBLEM, False, alibi_slopes=slopes, device=0)
    assert msg.startswith("alibi_slopes: must be on q's device (0), got device 3")


def test_valid_arguments_give_mods():
    assert check_mods(PROBLEM, False) == NO_MODS and NO_MODS.features == ()
    m = check_mods(PROBLEM, False, window_size=(16, -1), softcap=30, alibi_slopes=cuda((B, H), "<f4"),
                   attention_chunk=np.int64(8))
    assert m == Mods(16, -1, 8, 30.0, True) and m.features == ("window", "softcap", "alibi")
    assert check_mods(PROBLEM, False, window_size=(-1, -1)).features == ()   # (-1, -1) is no window
    assert check_mods(PROBLEM, False, window_size=[3, 4]).window() == (3, 4)


def test_causal_sets_the_right_side_to_zero():
    assert check_mods(PROBLEM, True, window_size=(8, 5)).window() == (8, 0)
    assert check_mods(PROBLEM, True, window_size=(8, -1)).window() == (8, 0)
    chunked = check_mods(PROBLEM, True, attention_chunk=16)
    assert chunked.window() == (-1, 0) and chunked.chunk == 16 and chunked.features == ("window",)
    assert check_mods(PROBLEM, True, softcap=5.0).window() == (-1, -1)   # causal alone stays CausalMask


@pytest.mark.parametrize("window", [(-1, 4), (-1, 0), (-1, 10**6), [-1, 7]])
def test_causal_with_no_left_side_is_causal_alone(window):
    """(-1, r) under causal is (-1, 0): no window at all (verify --fuzz found the kernels seeing r keys past the
    diagonal when r stayed)."""
    m = check_mods(PROBLEM, True, window_size=window)
    assert m.window() == (-1, -1) and not m.local and m.features == ()
    assert check_mods(PROBLEM, False, window_size=window).window() == tuple(window)   # not causal: kept


def test_kernel_fields_close_open_sides_and_scale_to_raw_units():
    span = PROBLEM.seqlen_q + PROBLEM.seqlen_k
    fields = kernel_fields(Mods(10**9, -1, 8, 4.0), PROBLEM)["mods"]
    assert fields["window_left"] == span and fields["window_right"] == span and fields["chunk"] == 8
    assert fields["softcap_in"] == pytest.approx(0.125 / 4.0) and fields["softcap_out"] == pytest.approx(32.0)
    assert fields["inv_softmax_scale"] == pytest.approx(8.0)
    neg = kernel_fields(Mods(softcap=4.0), Problem(**{**PROBLEM.__dict__, "softmax_scale": -0.125}))["mods"]
    assert neg["softcap_in"] == pytest.approx(0.125 / 4.0)   # runs as -q with |scale|
    block = make_params(**kernel_fields(Mods(3, 0), PROBLEM))
    assert int(block["mods"]["window_left"]) == 3 and int(block["mods"]["window_right"]) == 0


class FakeSlopes:
    def __init__(self, shape, strides):
        self.shape, self.ndim, self.itemsize = shape, len(shape), 4
        self.strides = strides
        self.data = type("Ptr", (), {"ptr": 0x1000})()


def test_kernel_fields_alibi_strides():
    one = kernel_fields(Mods(alibi=True), PROBLEM, FakeSlopes((H,), (8,)))["mods"]
    assert (one["alibi_batch_stride"], one["alibi_head_stride"], one["alibi_slopes"]) == (0, 2, 0x1000)
    two = kernel_fields(Mods(alibi=True), PROBLEM, FakeSlopes((B, H), (4 * H * 4, 4)))["mods"]
    assert (two["alibi_batch_stride"], two["alibi_head_stride"]) == (4 * H, 1)
