"""Selection with the modification features (window, softcap, alibi): who serves them, and the exact reasons."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from flashkit import api
from flashkit.cli import cli as cli_main
from flashkit.registry import Request, discover_kernels, select_kernel
from flashkit.registry.manifest import FEATURES
from flashkit.registry.select import reasons
from flashkit.runtime.build import make_config
from flashkit.verify.compile_matrix import HEAD_DIM_V_GEOMETRY_PAIRS, spec_configs


def test_features_are_known_and_declared_by_the_fa2_family_and_fa3():
    assert {"window", "softcap", "alibi"} <= set(FEATURES)
    specs = discover_kernels(refresh=True).specs
    for name in ("fa2", "causal", "fa3"):
        assert all(specs[name].supports(f) for f in ("window", "softcap", "alibi")), name


@pytest.mark.parametrize("causal,cc,chosen", [(False, (8, 0), "fa2"), (True, (8, 0), "causal"),
                                              (False, (9, 0), "fa3"), (True, (9, 0), "fa3")])
def test_mods_select_fa3_on_hopper_and_the_fa2_family_elsewhere(causal, cc, chosen):
    req = Request(dtype="bfloat16", head_dim=128, seqlen_q=8192, seqlen_k=8192, causal=causal, window=True,
                  softcap=True, alibi=True, cc=cc)
    sel = select_kernel(req, discover_kernels().specs)
    assert sel.chosen.name == chosen
    for name, why in sel.rejected.items():
        spec = discover_kernels().specs[name]
        for feat, words in (("window", "local attention (window_size, attention_chunk) not supported"),
                            ("softcap", "softcap not supported"), ("alibi", "ALiBi slopes not supported")):
            assert (words in why) == (not spec.supports(feat)), (name, why)


def test_each_feature_has_its_own_reason():
    spec = discover_kernels().specs["hopper"]
    base = dict(dtype="bfloat16", head_dim=128, cc=(9, 0))
    assert reasons(spec, Request(**base, window=True)).count(
        "local attention (window_size, attention_chunk) not supported") == 1
    assert "softcap not supported" in reasons(spec, Request(**base, softcap=True))
    assert "ALiBi slopes not supported" in reasons(spec, Request(**base, alibi=True))
    assert not any("not supported" in r for r in reasons(discover_kernels().specs["fa2"],
                                                          Request(**base, window=True, softcap=True, alibi=True)))


def test_explain_api_and_cli():
    sel = api.explain(head_dim=64, window=True, alibi=True, cc=(9, 0))
    assert sel.chosen.name == "fa3" and "window alibi" in sel.request.summary()
    res = CliRunner().invoke(cli_main, ["explain", "--window", "--softcap", "--arch", "sm_90", "--head-dim", "128"])
    assert res.exit_code == 0, res.output
    assert "selected: fa3" in res.output and "softcap not supported" in res.output   # hopper's reason


def test_fa3_hd64_modified_tables_follow_the_measured_tables():
    """ALiBi (alone or with softcap and the window) runs hd64 on two consumers, and so does causal softcap;
    non-causal softcap runs on the three consumers of the unmodified call (3-7% faster from 8k: BENCHMARKS.md)."""
    spec = discover_kernels().specs["fa3"]

    def consumers(mods, causal=False):
        cfg = make_config(spec, "bfloat16", 64, causal, (9, 0), mods=mods).launch_dict
        return cfg["block_m"], cfg["warps"]

    assert consumers(()) == consumers(("softcap",)) == (192, 16)
    for mods in (("alibi",), ("alibi", "softcap", "window")):
        assert consumers(mods) == consumers(mods, causal=True) == (128, 12), mods
    assert consumers(("softcap",), causal=True) == (128, 12)
    assert make_config(spec, "bfloat16", 64, False, (9, 0), mods=("window",)).launch_dict["block_m"] == 192


def test_fa3_turns_and_pass_by_follow_the_measured_tables():
    """free_issue (no ping-pong turns) on two consumers at hd64's short and modified tables (functors too), dense
    hd128 (and causal softcap), hd192 and hd256; not on hd128's other modified builds, on three consumers or beside
    a functor at hd256; pass_unseen where a tile has more rows than keys (BENCHMARKS.md)."""
    spec = discover_kernels().specs["fa3"]

    def launch(hd, causal=True, seqlen_q=8192, mods=(), functor=None):
        cfg = make_config(spec, "bfloat16", hd, causal, (9, 0), False, None, mods, functor, seqlen_q=seqlen_q)
        d = cfg.launch_dict
        return d["block_m"], d["block_n"], d.get("free_issue", 0), d.get("pass_unseen", 0)

    assert launch(64) == (192, 128, 0, 1) and launch(96) == (192, 112, 0, 1)         # three consumers: the turns
    assert launch(64, seqlen_q=1024) == (128, 128, 1, 1)                            # (no pass-by code at 128 x 128)
    assert launch(64, seqlen_q=2048) == (192, 128, 0, 1)                            # persistent three consumers
    assert launch(64, False, seqlen_q=1024)[2] == 1 and launch(64, mods=("softcap",))[2] == 1
    assert launch(64, mods=("alibi",))[2] == 1 and launch(64, mods=("mask_mod",), functor="document")[2] == 1
    assert launch(128)[2:] == launch(128, False)[2:] == (1, 0) and launch(128, mods=("alibi",))[2] == 0
    assert launch(128, mods=("softcap",))[2] == 1 and launch(128, False, mods=("softcap",))[2] == 0
    assert launch(192)[2] == 1 and launch(256) == (128, 64, 1, 1)
    assert launch(256, mods=("score_mod", "score_mod_grad"), functor="relative_bias")[2:] == (0, 0)
    assert "-DFLASHKIT_FREE_ISSUE=1" in make_config(spec, "bfloat16", 256, True, (9, 0)).defines()


def test_fa3_takes_the_row_max_before_softcap_and_alibi_at_hd256_only():
    """max_first (hopper/ws_mainloop.cuh): softcap 5-8% and ALiBi 4-12% faster at hd256, slower at the other head
    dims; a build of both carries the flag, which acts on neither composed (compile_matrix builds each alone)."""
    spec = discover_kernels().specs["fa3"]

    def max_first(hd, mods=("softcap",), causal=False):
        return make_config(spec, "bfloat16", hd, causal, (9, 0), mods=mods).launch_dict.get("max_first", 0)

    assert max_first(256) == max_first(256, causal=True) == max_first(256, ("alibi",)) == 1
    assert "-DFLASHKIT_MAX_FIRST=1" in make_config(spec, "bfloat16", 256, False, (9, 0), mods=("alibi",)).defines()
    assert not any(max_first(hd, mods) for hd in (64, 96, 128, 192) for mods in (("softcap",), ("alibi",)))
    assert max_first(256, mods=()) == max_first(256, ("window",)) == 0
    singles = {c.mods for c in spec_configs(spec, (9, 0), head_dims=[256]) if c.launch_dict.get("max_first")}
    assert {("softcap",), ("alibi",)} <= singles


def test_block_sparse_hopper_turns_follow_the_measured_tables():
    """block_sparse_hopper defers the P V wait and issues freely at hd64 (ALiBi on three stages), issues freely at hd96
    but for non-causal ALiBi and the window, at hd128 only with softcap, at hd256 but for softcap and the window, and
    keeps the turns at hd192 (BENCHMARKS.md, the thirtieth session's A/B); softcap's and ALiBi's row maxima before the
    modification at hd256 (max_first: the thirty-second session's)."""
    spec = discover_kernels().specs["block_sparse_hopper"]

    def launch(hd, causal=False, mods=()):
        d = make_config(spec, "bfloat16", hd, causal, (9, 0), True, None, mods, None).launch_dict
        return d.get("free_issue", 0), d.get("defer_pv_wait", 0), d["stages"]

    assert launch(64) == launch(64, True, ("softcap",)) == launch(64, True, ("window",)) == (1, 1, 2)
    assert launch(64, mods=("alibi",)) == (1, 1, 3)
    assert launch(96)[0] == launch(96, True, ("alibi",))[0] == 1
    assert launch(96, mods=("alibi",))[0] == launch(96, True, ("window",))[0] == 0
    assert (launch(128)[0], launch(128, mods=("softcap",))[0], launch(128, True, ("alibi",))[0]) == (0, 1, 0)
    assert launch(192)[0] == 0 and launch(256)[0] == 1
    assert launch(256, mods=("softcap",))[0] == launch(256, True, ("window",))[0] == 0
    max_first = lambda hd, mods=("softcap",): make_config(spec, "bfloat16", hd, False, (9, 0), True, None,  # noqa: E731
                                                          mods, None).launch_dict.get("max_first", 0)
    assert max_first(256) == max_first(256, ("alibi",)) == 1 and max_first(256, ()) == 0
    assert not any(max_first(hd, mods) for hd in (64, 96, 128, 192) for mods in (("softcap",), ("alibi",)))


def test_build_config_defines_only_the_asked_mods():
    spec = discover_kernels().specs["fa2"]
    plain = make_config(spec, "float16", 64, False, (8, 0))
    assert not any("WINDOW" in d or "SOFTCAP" in d or "ALIBI" in d for d in plain.defines())
    cfg = make_config(spec, "float16", 64, False, (8, 0), mods=("window", "alibi"))
    assert "-DFLASHKIT_WINDOW=1" in cfg.defines() and "-DFLASHKIT_ALIBI=1" in cfg.defines()
    assert "-DFLASHKIT_SOFTCAP=1" not in cfg.defines() and "window alibi" in cfg.describe()


def test_compile_matrix_covers_the_mods_of_the_variants_declaring_them():
    specs = discover_kernels().specs
    for name in ("fa2", "causal"):
        # (the head_dim_v geometry pairs compile unmodified only: compile_matrix.HEAD_DIM_V_GEOMETRY_PAIRS)
        configs = [c for c in spec_configs(specs[name], (8, 0))
                   if (c.head_dim, c.head_dim_v) not in HEAD_DIM_V_GEOMETRY_PAIRS]
        with_mods = [c for c in configs if c.mods and "varlen" not in c.mods]
        plain = [c for c in configs if not c.mods]
        varlen = [c for c in configs if c.mods == ("varlen",)]   # the packed-sequence build, class head dims only
        assert with_mods and len(with_mods) == len(plain) and len(plain) + len(with_mods) + len(varlen) == len(configs)
        assert varlen and not any(c.head_dim_padded for c in varlen)
        assert {c.mods for c in with_mods} == {("window", "softcap", "alibi")}
    assert not any(c.mods for c in spec_configs(specs["standard"], (8, 0)))


@pytest.mark.parametrize("cc,chosen", [((8, 0), "block_sparse"), ((9, 0), "block_sparse_hopper")])
@pytest.mark.parametrize("mods", [dict(window=True), dict(window=True, chunk=True), dict(softcap=True),
                                  dict(alibi=True), dict(window=True, softcap=True, alibi=True), dict(score_mod=True)])
def test_block_masks_with_modifications_select_the_block_sparse_kernels(cc, chosen, mods):
    """A block mask composes with every built-in modification and a score_mod functor, forward and backward."""
    specs = discover_kernels().specs
    for causal in (False, True):
        req = Request(dtype="bfloat16", head_dim=128, seqlen_q=4096, seqlen_k=4096, causal=causal, block_sparse=True,
                      cc=cc, **mods)
        assert select_kernel(req, specs).chosen.name == chosen
        if not mods.get("chunk") or cc == (8, 0):   # fa3_bwd takes no attention_chunk: fa2_bwd serves it
            want = "fa3_bwd" if cc == (9, 0) and not mods.get("chunk") else "fa2_bwd"
            back = Request(dtype="bfloat16", head_dim=128, seqlen_q=4096, seqlen_k=4096, causal=causal,
                           block_sparse=True, backward=True, cc=cc, **mods)
            assert select_kernel(back, specs).chosen.name == want


def test_a_block_mask_takes_no_mask_mod():
    """The block-sparse kernels list their tiles from the block mask alone: a mask_mod is folded into it instead."""
    for name in ("block_sparse", "block_sparse_hopper"):
        spec = discover_kernels().specs[name]
        assert "drop-in mask_mod functors not supported" in reasons(
            spec, Request(dtype="bfloat16", head_dim=128, block_sparse=True, mask_mod=True, cc=(9, 0)))
