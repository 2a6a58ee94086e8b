"""features/bwd_lists.py and the backward's list path (backward._launch_listed) on a fake H100: a mask_mod's tiles
classified at the backward's tiles, then the lists and ranks, then the three passes, with Params.bwd_lists naming
the buffers; a block mask's lists the same way (its states by array code, patched out here: no GPU); refusals by
name before anything is compiled or launched (a score_mod functor, a block mask with a functor, a block mask that
does not fit)."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
import flashkit.backward as backward
from flashkit.errors import InputError, UnsupportedError
from flashkit.features import bwd_lists
from flashkit.runtime import build
from flashkit.runtime.params import FIELD_OFFSETS, PARAMS_DTYPE

from ..test_backward import FAKE_H100, good, no_launch  # noqa: F401  (the fixture)

PASSES = ["flashkit_fa3_bwd_prepass", "flashkit_fa3_bwd_main", "flashkit_fa3_bwd_convert_dq"]


def _field(raw: bytes, name: str):
    """A leaf field of a recorded parameter block."""
    from flashkit.runtime.params import flat_fields
    kind = {n: t for n, t, _ in flat_fields()}[name]
    off = FIELD_OFFSETS[name]
    return np.frombuffer(raw[off:off + kind.itemsize], dtype=kind)[0]


def listed_launches(monkeypatch, b, sq, sk, h, hk, d, **kw):
    """attention_backward on the fake device (tests/cpu/runtime/fake_device.py); the recorded launches."""
    pytest.importorskip("cupy")
    from ..runtime.fake_device import Recorder, fake, installed
    with installed(monkeypatch.setattr):
        monkeypatch.setattr(backward, "device_info", lambda: FAKE_H100)
        monkeypatch.setattr(backward, "build_module", lambda spec, config, cc: build.LoadedKernel(
            [Recorder(e) for e in spec.entries], 1024, {e: Recorder(e) for e in build.aux_entries(spec, config)}))
        states = []
        monkeypatch.setattr(bwd_lists.VisitLists, "block_mask_states",
                            lambda self, mask, problem, launch, causal, cupy: states.append((mask, launch, causal)))
        q, k, v = fake((b, sq, h, d)), fake((b, sk, hk, d)), fake((b, sk, hk, d))
        dout, out, lse = fake((b, sq, h, d)), fake((b, sq, h, d)), fake((b, h, sq), np.float32)
        mod_args = kw.pop("mod_args", None)
        if callable(mod_args):
            mod_args = mod_args(fake)
        flashkit.attention_backward(dout, q, k, v, out, lse, variant="fa3_bwd", mod_args=mod_args, **kw)
        return list(Recorder.launches), states


def test_mask_mod_backward_classifies_lists_then_runs_the_passes(monkeypatch):
    b, sq, sk, h, hk, d = 2, 1000, 300, 8, 2, 128
    launches, _ = listed_launches(monkeypatch, b, sq, sk, h, hk, d, causal=True, mod="document",
                                  mod_args=lambda fake: {"doc_ids": fake((b, sk), np.int32)})
    names = [name for name, *_ in launches]
    assert names == ["flashkit_functor_classify", "flashkit_bwd_list_columns", "flashkit_bwd_list_ranks"] + PASSES
    # hd128 with a mask_mod: key tiles of 128, as the dense backward; the document mask varies by batch only
    q_tiles, k_tiles, groups = -(-sq // 64), -(-sk // 128), b
    grids = [grid for _, grid, *_ in launches]
    assert grids[0] == (k_tiles, q_tiles, groups)
    assert grids[1] == (-(-groups * k_tiles // bwd_lists.LIST_THREADS), 1, 1)
    assert grids[2] == (-(-groups * q_tiles // bwd_lists.LIST_THREADS), 1, 1)
    assert grids[4] == (k_tiles, hk, b)
    main = launches[4][3]
    assert [_field(main, f"bwd_lists.{n}") for n in ("batch", "heads", "q_tiles", "k_tiles")] == [b, 1, q_tiles,
                                                                                                   k_tiles]
    for name in ("count", "list", "rank"):
        assert _field(main, f"bwd_lists.{name}") != 0
    assert _field(main, "mods.tile_state") != 0 and _field(main, "mods.args.ptr[0]") != 0
    # the list passes see the same lists and states as the main kernel
    for raw in (launches[0][3], launches[1][3], launches[2][3]):
        for name in ("bwd_lists.count", "bwd_lists.list", "bwd_lists.rank", "mods.tile_state"):
            assert _field(raw, name) == _field(main, name)
    assert len(main) == PARAMS_DTYPE.itemsize


def test_block_mask_backward_lists_by_the_mask_at_key_tiles_of_128(monkeypatch):
    from flashkit.features.block_mask import BlockMask   # as the call imports it (a test may reload the module)
    b, sq, sk, h, hk, d = 1, 500, 385, 4, 4, 64
    mask = BlockMask.random(1, h, sq, sk, 0.5, seed=1, xp=np)
    launches, states = listed_launches(monkeypatch, b, sq, sk, h, hk, d, block_mask=mask)
    assert [name for name, *_ in launches] == ["flashkit_bwd_list_columns", "flashkit_bwd_list_ranks"] + PASSES
    (got_mask, launch, causal), = states
    assert got_mask is mask and not causal and launch["block_n"] == 128   # hd64/block_sparse: blocks nest in 128
    main = launches[3][3]
    assert [_field(main, f"bwd_lists.{n}") for n in ("batch", "heads", "q_tiles", "k_tiles")] == [1, h, 8, 4]
    assert launches[3][1] == (4, hk, b)


def test_geometry_broadcasts_where_the_mask_does():
    from flashkit.call.validate import Problem
    p = Problem(dtype="bfloat16", batch=3, seqlen_q=129, seqlen_k=1000, heads=8, kv_heads=2, head_dim=64,
                softmax_scale=0.125)
    geo = bwd_lists.geometry(p, {"block_m": 64, "block_n": 128}, 1, 8)
    assert (geo.batch, geo.heads, geo.q_tiles, geo.k_tiles, geo.groups) == (1, 8, 3, 8, 8)


def test_a_score_mod_without_its_derivative_has_no_backward(no_launch, drop_in_functor):  # noqa: F811
    """A score_mod functor whose file declares no score_mod_grad is refused by name before any launch (relative_bias
    declares one: the backward takes it, tests/gpu/test_bwd_lists.py)."""
    drop_in_functor("scaled", score_expr="2.f * s")
    with pytest.raises(UnsupportedError, match=r"^mod: 'scaled' has a score_mod without score_mod_grad"):
        flashkit.attention_backward(**good(), mod="scaled")


def test_block_mask_with_a_functor_is_refused(no_launch):  # noqa: F811
    from flashkit.features.block_mask import BlockMask
    from ..synth import B, SK, SQ, cuda
    mask = BlockMask.causal(SQ, SK, xp=np)
    with pytest.raises(InputError, match=r"^block_mask: cannot be combined with mod"):
        flashkit.attention_backward(**good(), mod="document", mod_args={"doc_ids": cuda((B, SK), "<i4")},
                                    block_mask=mask)


def test_a_block_mask_that_does_not_fit_is_refused_by_name(no_launch):  # noqa: F811
    from flashkit.features.block_mask import BlockMask
    from ..synth import SK, SQ
    with pytest.raises(InputError, match=r"^block_mask: "):
        flashkit.attention_backward(**good(), block_mask=BlockMask.causal(SQ + 200, SK, xp=np))
    with pytest.raises(InputError, match=r"^block_mask: expected a flashkit.BlockMask"):
        flashkit.attention_backward(**good(), block_mask=np.ones((1, 1, 2, 2), bool))


def test_mod_args_without_mod_is_refused(no_launch):  # noqa: F811
    with pytest.raises(InputError, match=r"^mod_args: given without mod"):
        flashkit.attention_backward(**good(), mod_args={})
