"""features/functors.py and attention(..., mod=, mod_args=): checks on metadata alone, kernel fields, build keys."""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
from flashkit.call.validate import Problem
from flashkit.features.functors import LOG2E, bind_functor, build_key
from flashkit.features.mods import NO_MODS, Mods
from flashkit.registry import discover_kernels
from flashkit.runtime.build import make_config
from flashkit.runtime.params import make_params

from ..synth import B, H, SK, SQ, cuda, qkv, input_error

PROBLEM = Problem(batch=B, seqlen_q=SQ, seqlen_k=SK, heads=H, kv_heads=H, head_dim=64, dtype="float16",
                  softmax_scale=0.125)


BAD = [
    ("unknown mod", dict(mod="nope"), "mod: unknown functor 'nope'"),
    ("mod type", dict(mod=3), "mod: expected a functor name"),
    ("args type", dict(mod="prefix_lm", mod_args=[1]), "mod_args: expected a dict"),
    ("missing arg", dict(mod="prefix_lm"), "mod_args: 'prefix_lm' needs 'prefix'"),
    ("unknown arg", dict(mod="prefix_lm", mod_args={"prefix": 3, "x": 1}), "takes no argument 'x'"),
    ("int type", dict(mod="prefix_lm", mod_args={"prefix": 2.5}), "mod_args['prefix']: expected an int"),
    ("bool int", dict(mod="prefix_lm", mod_args={"prefix": True}), "mod_args['prefix']: expected an int"),
    ("int32", dict(mod="prefix_lm", mod_args={"prefix": 2**40}), "expected an int32"),
    ("host array", dict(mod="document", mod_args={"doc_ids": np.zeros((B, SK), np.int32)}), "on the CPU"),
    ("dtype", dict(mod="document", mod_args={"doc_ids": cuda((B, SK), "<f4")}), "expected dtype int32"),
    ("shape", dict(mod="document", mod_args={"doc_ids": cuda((B, SQ), "<i4")}),
     r"expected shape \(batch, seqlen_k\) = \(2, 33\)"),
    ("strides", dict(mod="document", mod_args={"doc_ids": cuda((B, SK), "<i4", (1, B))}), "C-contiguous"),
    ("args alone", dict(mod_args={"prefix": 1}), "mod_args: given without mod"),
    ("softcap", dict(mod="relative_bias", mod_args={"slopes": cuda((H,), "<f4")}, softcap=2.0),
     "softcap and alibi_slopes cannot be added"),
]


@pytest.mark.parametrize("what,kwargs,message", BAD, ids=[b[0] for b in BAD])
def test_bad_functor_arguments_fail_before_any_device_work(monkeypatch, what, kwargs, message):
    import flashkit.api as api

    def forbidden(*a, **k):
        raise AssertionError("validation must finish before the device, the compiler or a launch is touched")
    for name in ("device_info", "build_module", "run", "to_cupy", "cupy_module", "select_kernel"):
        monkeypatch.setattr(api, name, forbidden)
    q, k, v = qkv()
    import re
    msg = input_error(flashkit.attention, q, k, v, **kwargs)
    assert message in msg or re.search(message, msg), msg


def test_bind_fills_defaults_slots_and_kernel_fields():
    cat = discover_kernels()
    bound = bind_functor("prefix_lm", {"prefix": np.int64(5)}, PROBLEM, NO_MODS, None)
    assert bound.values == {"prefix": 5} and bound.features == ("mask_mod",)
    assert bound.request_flags() == {"score_mod": False, "mask_mod": True}
    fields = bound.kernel_fields(PROBLEM, to_device=None)
    assert "softmax_scale_log2" not in fields   # only a score_mod changes the softmax's factor
    block = make_params(**fields)
    args = block["mods"]["args"]
    assert list(args["ints"]) == [5, 0, 0, 0] and int(args["seqlen_q"]) == SQ and int(args["seqlen_k"]) == SK
    geo = bound.tile_geometry(PROBLEM, {"block_m": 128, "block_n": 64})
    assert geo == {"tile_batch": 1, "tile_heads": 1, "q_tiles": 1, "k_tiles": 1}
    doc = bind_functor("document", {"doc_ids": cuda((B, SK), "<i4")}, PROBLEM, NO_MODS, None, cat)
    assert doc.tile_geometry(PROBLEM, {"block_m": 16, "block_n": 16}) == {
        "tile_batch": B, "tile_heads": 1, "q_tiles": 2, "k_tiles": 3}


class _Device:
    """A stand-in for to_cupy: an object with a device pointer."""

    class data:
        ptr = 0xABC0


def test_score_mod_fields_carry_the_pointer_and_log2e():
    bound = bind_functor("relative_bias", {"slopes": cuda((H,), "<f4")}, PROBLEM, Mods(window_left=3), None)
    fields = bound.kernel_fields(PROBLEM, to_device=lambda x, name: _Device())
    assert fields["softmax_scale_log2"] == LOG2E
    assert list(make_params(**fields)["mods"]["args"]["ptr"]) == [0xABC0, 0]
    assert len(bound.keep) == 1


def test_build_key_follows_the_file_content(tmp_path, monkeypatch):
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    path = mod_dir / "edit_me.cu"
    text = ("/*---\nname: edit_me\nkind: modification\nsummary: s\nfunctions: [score_mod]\n---*/\n"
            "__device__ float score_mod(float s, int b, int h, int i, int j, const flashkit::ModArgs& a) "
            "{ return s; }\n")
    path.write_text(text)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        spec = discover_kernels(refresh=True).get_mod("edit_me")
        first = build_key(spec)
        path.write_text(text.replace("return s;", "return 2.f * s;"))
        second = build_key(spec)
        assert first != second and first.split("@")[0] == second.split("@")[0] == str(path.resolve())
        fa2 = discover_kernels().specs["fa2"]
        configs = [make_config(fa2, "float16", 64, False, (8, 0), mods=("score_mod",), functor=k)
                   for k in (first, second)]
        assert configs[0] != configs[1]   # a new build (and cubin cache key) after an edit
        assert f'-DFLASHKIT_MOD_FILE="{path.resolve()}"' in configs[1].defines()
        assert "-DFLASHKIT_SCORE_MOD=1" in configs[1].defines() and "functor=edit_me" in configs[1].describe()
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_functor_signature_keys_what_the_launch_depends_on():
    """A functor call's key part: the name, the file's state, each argument (scalars with their types); None (the
    full path, which checks and names the problem) for an unknown functor or an argument of another kind."""
    from flashkit.features.functors import functor_signature
    prefix = functor_signature("prefix_lm", {"prefix": 3})
    assert prefix is not None and prefix == functor_signature("prefix_lm", {"prefix": 3})
    assert len({prefix, functor_signature("prefix_lm", {"prefix": 4}), functor_signature("prefix_lm", {"prefix": 3.0}),
                functor_signature("prefix_lm", {"prefix": True}), functor_signature("prefix_lm", None)}) == 5
    for mod, args in (("nope", None), (3, None), ("prefix_lm", [3]), ("document", {"doc_ids": np.zeros(3, np.int32)}),
                      ("document", {"doc_ids": cuda((B, SK), "<i4")}), ("prefix_lm", {"prefix": "3"})):
        assert functor_signature(mod, args) is None, (mod, args)


def test_selection_needs_a_kernel_that_builds_functors():
    from flashkit.errors import UnsupportedError
    from flashkit.registry import Request, select_kernel
    specs = discover_kernels().specs
    req = Request(dtype="bfloat16", head_dim=128, seqlen_q=1024, seqlen_k=1024, cc=(9, 0), mask_mod=True)
    sel = select_kernel(req, specs)
    assert sel.chosen.name == "fa3" and "drop-in mask_mod functors not supported" in " ".join(sel.rejected["fa1"])
    req80 = Request(dtype="bfloat16", head_dim=128, seqlen_q=1024, seqlen_k=1024, cc=(8, 0), causal=True,
                    score_mod=True)
    assert select_kernel(req80, specs).chosen.name == "causal"
    with pytest.raises(UnsupportedError, match="block masks|mask_mod"):
        select_kernel(Request(dtype="bfloat16", head_dim=128, cc=(9, 0), block_sparse=True, mask_mod=True), specs)
