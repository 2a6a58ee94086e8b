"""features/bwd_lists.py and the backward's list path (backward._launch_listed) on a fake H100: a mask_mod's tiles
classified at the backward's tiles, then the lists and ranks, then the three passes, with Params.bwd_lists naming
the buffers; a block mask's lists the same way (its states by array code, patched out here: no GPU); refusals by
name before anything is compiled or launched (a score_mod functor without its derivative, a block mask with a
mask_mod, a block mask that does not fit); a score_mod functor under a block mask's lists."""

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
                            lambda self, mask, problem, launch, causal, mods, cupy: states.append((mask, launch,
                                                                                                  causal)))
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


def test_block_mask_with_a_mask_mod_is_refused_both_ways(no_launch):  # noqa: F811
    """A block mask and a mask_mod functor are not combined (the mask_mod takes the blocks in): the forward and the
    backward refuse by name before anything is compiled or launched."""
    from flashkit.features.block_mask import BlockMask
    from ..synth import B, SK, SQ, cuda
    mask = BlockMask.causal(SQ, SK, xp=np)
    args = dict(mod="document", mod_args={"doc_ids": cuda((B, SK), "<i4")}, block_mask=mask)
    with pytest.raises(InputError, match=r"^block_mask: cannot be combined with document's mask_mod"):
        flashkit.attention_backward(**good(), **args)
    call = good()
    with pytest.raises(InputError, match=r"^block_mask: cannot be combined with document's mask_mod"):
        flashkit.attention(call["q"], call["k"], call["v"], **args)


def test_block_mask_with_a_score_mod_lists_by_the_mask(monkeypatch):
    """A score_mod functor under a block mask: the lists from the block mask (no classifier), the functor's arguments
    in the main kernel's parameters."""
    from flashkit.features.block_mask import BlockMask
    b, sq, sk, h, hk, d = 1, 500, 385, 4, 4, 128
    mask = BlockMask.random(1, h, sq, sk, 0.5, seed=1, xp=np)
    launches, states = listed_launches(monkeypatch, b, sq, sk, h, hk, d, block_mask=mask, causal=True,
                                       mod="relative_bias", mod_args=lambda fake: {"slopes": fake((h,), np.float32)})
    assert [name for name, *_ in launches] == ["flashkit_bwd_list_columns", "flashkit_bwd_list_ranks"] + PASSES
    (got_mask, _, causal), = states
    assert got_mask is mask and causal
    assert _field(launches[3][3], "mods.args.ptr[0]") != 0


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


@pytest.mark.parametrize("sq,sk,causal,window,chunk", [
    (300, 300, False, (-1, -1), 0), (300, 500, True, (-1, -1), 0), (500, 300, True, (-1, -1), 0),
    (400, 400, False, (64, 17), 0), (257, 700, True, (100, 0), 0), (700, 257, False, (-1, 30), 0),
    (333, 333, False, (-1, -1), 100), (200, 450, True, (50, 0), 64)])
def test_key_interval_is_the_reference_masks_rows(sq, sk, causal, window, chunk):
    """key_interval (the block-mask lists' cut) gives each row's first and last visible key of the reference's element
    mask (verify/reference.py's local_mask and causal_mask), and an empty interval to a row that sees none."""
    from flashkit.call.validate import Problem
    from flashkit.features.mods import Mods
    from flashkit.verify.reference import causal_mask, local_mask
    p = Problem(dtype="bfloat16", batch=1, seqlen_q=sq, seqlen_k=sk, heads=1, kv_heads=1, head_dim=64,
                softmax_scale=0.125)
    right = (0 if window[0] >= 0 or chunk else -1) if causal else window[1]   # features/mods.check_mods' rule
    mods = Mods(window[0], right, chunk, 0.0, False)
    begin, end = bwd_lists.key_interval(np.arange(sq), p, causal, mods, np)
    want = local_mask(sq, sk, (window[0], right), chunk)
    if causal:
        want &= causal_mask(sq, sk)
    for row in range(sq):
        keys = np.flatnonzero(want[row])
        if keys.size:
            assert (begin[row], end[row]) == (keys[0], keys[-1] + 1), row
            assert keys.size == keys[-1] + 1 - keys[0]   # one interval a row
        else:
            assert end[row] <= begin[row] or end[row] <= 0 or begin[row] >= sk, row
