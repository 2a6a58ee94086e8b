"""features/mod_mask.py: a ModMask's refusals by name before any device work, and, on a fake H100, its tiles
classified once per kernel geometry and reused (forward, full and cached paths, and backward lists), again after
refresh(), and a reuse ordered after the classification's stream."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
from flashkit.errors import InputError
from flashkit.features import mod_mask
from flashkit.features.mod_mask import ModMask, unwrap_mod

from ..synth import input_error, qkv

CLASSIFY = ["flashkit_functor_classify", "flashkit_functor_compact"]
LISTS = ["flashkit_functor_classify", "flashkit_bwd_list_columns", "flashkit_bwd_list_ranks"]


@pytest.mark.parametrize("args,message", [
    (("nope",), "mod: unknown functor 'nope'"),
    ((3,), "mod: expected a functor name"),
    (("relative_bias", {"slopes": None}), "'relative_bias' has no mask_mod"),
    (("prefix_lm", [1]), "mod_args: expected a dict"),
])
def test_a_mask_that_cannot_be_refused_by_name(args, message):
    msg = input_error(ModMask, *args)
    assert message in msg, msg


def test_a_mask_carries_its_arguments(monkeypatch):
    import flashkit.api as api

    def forbidden(*a, **k):
        raise AssertionError("validation must finish before the device, the compiler or a launch is touched")
    for name in ("device_info", "build_module", "run", "cupy_module", "select_kernel"):
        monkeypatch.setattr(api, name, forbidden)
    mask = ModMask("prefix_lm", {"prefix": 3})
    assert unwrap_mod(mask, None) == ("prefix_lm", {"prefix": 3}, mask)
    assert unwrap_mod("prefix_lm", {"prefix": 3}) == ("prefix_lm", {"prefix": 3}, None)
    q, k, v = qkv()
    msg = input_error(flashkit.attention, q, k, v, mod=mask, mod_args={"prefix": 3})
    assert "mod_args: a ModMask carries its arguments" in msg
    msg = input_error(flashkit.attention, q, k, v, mod=ModMask("prefix_lm", {"prefix": 2.5}))
    assert "mod_args['prefix']: expected an int" in msg   # checked per call, as mod_args are
    msg = input_error(flashkit.attention, q, k, v, mod=object())
    assert "mod: expected a functor name (str) or a flashkit.ModMask" in msg
    assert "prefix_lm" in repr(mask) and len(mask) == 0 and flashkit.ModMask is ModMask


@pytest.fixture
def fake_gpu(monkeypatch):
    """The fake H100 (tests/cpu/runtime/fake_device.py), with the masks' stream marks recorded: no CUDA here."""
    pytest.importorskip("cupy")
    from ..runtime.fake_device import installed
    marks, waits = [], []
    with installed(monkeypatch.setattr):
        monkeypatch.setattr(mod_mask, "mark_stream", lambda: marks.append(len(marks)) or (marks[-1], 7))
        monkeypatch.setattr(mod_mask, "order_after", lambda event, stream: waits.append((event, stream)))
        yield marks, waits


def _launches(call) -> list:
    from ..runtime.fake_device import Recorder
    Recorder.launches = []
    call()
    return list(Recorder.launches)


def _field(raw: bytes, name: str):
    from .test_bwd_lists import _field as field
    return field(raw, name)


def test_forward_tiles_are_classified_once_per_geometry(fake_gpu):
    from flashkit.runtime import call_cache
    from ..runtime.fake_device import fake
    marks, waits = fake_gpu
    q, k, v = (fake((1, 256, 2, 64)) for _ in range(3))
    ids = fake((1, 256), np.int32)
    mask = ModMask("document", {"doc_ids": ids})
    first = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod=mask))
    assert [n for n, *_ in first] == CLASSIFY + ["flashkit_fa3_fwd"] and len(mask) == 1 and marks == [0]
    cached = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod=mask))
    assert [n for n, *_ in cached] == ["flashkit_fa3_fwd"] and waits == [(0, 7)]
    call_cache.CALLS.clear()   # the full path reads the kept tiles too
    full = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod=mask))
    assert [n for n, *_ in full] == ["flashkit_fa3_fwd"]
    for name in ("mods.tile_count", "mods.tile_list", "mods.tile_state"):
        assert _field(first[-1][3], name) == _field(cached[0][3], name) == _field(full[0][3], name) != 0
    # the same functor by name classifies every call; another geometry, or a refresh, classifies again
    by_name = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod="document", mod_args={"doc_ids": ids}))
    assert [n for n, *_ in by_name] == CLASSIFY + ["flashkit_fa3_fwd"]
    other = _launches(lambda: flashkit.attention(q, k, v, causal=False, mod=mask))
    assert [n for n, *_ in other] == CLASSIFY + ["flashkit_fa3_fwd"] and len(mask) == 2
    mask.refresh()
    again = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod=mask))
    assert [n for n, *_ in again] == CLASSIFY + ["flashkit_fa3_fwd"] and len(mask) == 1


def test_backward_lists_are_built_once_per_geometry(fake_gpu):
    from ..runtime.fake_device import fake
    from .test_bwd_lists import PASSES
    marks, waits = fake_gpu
    b, sq, sk, h, d = 2, 300, 300, 4, 128
    q, k, v, dout, out = (fake((b, sq, h, d)) for _ in range(5))
    lse = fake((b, h, sq), np.float32)
    mask = ModMask("document", {"doc_ids": fake((b, sk), np.int32)})
    call = lambda: flashkit.attention_backward(dout, q, k, v, out, lse, causal=True, mod=mask)  # noqa: E731
    first, second = _launches(call), _launches(call)
    assert [n for n, *_ in first] == LISTS + PASSES and [n for n, *_ in second] == PASSES
    assert len(mask) == 1 and marks == [0] and waits == [(0, 7)]
    for name in ("bwd_lists.count", "bwd_lists.list", "bwd_lists.rank", "mods.tile_state"):
        assert _field(first[4][3], name) == _field(second[1][3], name) != 0
    forward = _launches(lambda: flashkit.attention(q, k, v, causal=True, mod=mask))
    assert [n for n, *_ in forward][:2] == CLASSIFY and len(mask) == 2   # the forward's tiles are its own


def test_a_scalar_mask_by_name_keeps_its_tiles(fake_gpu):
    """prefix_lm takes scalars alone: by name, its tiles are classified once per signature and geometry (its
    signature holds the scalars), forward and backward, on the cached and the full path."""
    from flashkit.runtime import call_cache
    from ..runtime.fake_device import fake
    from .test_bwd_lists import PASSES
    b, s, h, d = 1, 256, 2, 64
    q, k, v, dout, out = (fake((b, s, h, d)) for _ in range(5))
    lse = fake((b, h, s), np.float32)
    forward = lambda prefix: _launches(  # noqa: E731
        lambda: flashkit.attention(q, k, v, mod="prefix_lm", mod_args={"prefix": prefix}))
    assert [n for n, *_ in forward(64)] == CLASSIFY + ["flashkit_fa3_fwd"]
    assert [n for n, *_ in forward(64)] == ["flashkit_fa3_fwd"]          # the cached path
    call_cache.CALLS.clear()
    assert [n for n, *_ in forward(64)] == ["flashkit_fa3_fwd"]          # the full path
    assert [n for n, *_ in forward(65)] == CLASSIFY + ["flashkit_fa3_fwd"]   # another signature
    backward = lambda: _launches(  # noqa: E731
        lambda: flashkit.attention_backward(dout, q, k, v, out, lse, mod="prefix_lm", mod_args={"prefix": 64}))
    assert [n for n, *_ in backward()] == LISTS + PASSES and [n for n, *_ in backward()] == PASSES
    assert len(mod_mask._NAMED) == 2
    for prefix in range(mod_mask.NAMED_SIGNATURES + 3):   # at most NAMED_SIGNATURES kept, the oldest dropped
        forward(prefix)
    assert len(mod_mask._NAMED) == mod_mask.NAMED_SIGNATURES
    assert [n for n, *_ in forward(64)] == CLASSIFY + ["flashkit_fa3_fwd"]
    # an array argument's contents may change: by name, such a functor classifies every call
    ids = fake((b, s), np.int32)
    document = lambda: _launches(  # noqa: E731
        lambda: flashkit.attention(q, k, v, mod="document", mod_args={"doc_ids": ids}))
    assert [n for n, *_ in document()] == CLASSIFY + ["flashkit_fa3_fwd"] == [n for n, *_ in document()]
