"""registry/functor_manifest.py and discovery of drop-in functors (kind: modification), field by field."""

from __future__ import annotations

import pytest
import yaml

from flashkit.errors import ManifestError
from flashkit.registry import discover_kernels
from flashkit.registry.discover import parse_file
from flashkit.registry.functor_manifest import ModSpec

BASE = {"name": "toy_mod", "kind": "modification", "summary": "a test functor", "functions": ["mask_mod"]}
MASK_BODY = ("\n__device__ bool mask_mod(int b, int h, int i, int j, const flashkit::ModArgs& a) "
             "{ return j <= i; }\n")
SCORE_BODY = ("\n__device__ float score_mod(float s, int b, int h, int i, int j, const flashkit::ModArgs& a) "
              "{ return s; }\n")


def write_mod(directory, data, body=MASK_BODY, filename=None):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (filename or f"{data.get('name', 'toy_mod')}.cu")
    path.write_text(f"/*---\n{yaml.safe_dump(data, sort_keys=False).rstrip()}\n---*/\n" + body)
    return path


def test_shipped_functors_are_discovered_with_references():
    cat = discover_kernels(refresh=True)
    assert set(cat.mods) >= {"document", "prefix_lm", "relative_bias"}
    assert not cat.problems
    doc = cat.mods["document"]
    assert doc.functions == ("mask_mod",) and doc.mask_varies == ("batch",) and doc.reference is not None
    assert [(a.name, a.kind, a.slot, a.dtype, a.shape) for a in doc.args] == [
        ("doc_ids", "pointer", 0, "int32", ("batch", "seqlen_k"))]
    assert cat.mods["prefix_lm"].mask_varies == () and cat.mods["relative_bias"].score
    assert "document" not in cat.specs   # functors have a name space of their own


def test_a_user_directory_and_its_mods_folder(tmp_path, monkeypatch):
    write_mod(tmp_path, dict(BASE, name="top_level"))
    write_mod(tmp_path / "mods", dict(BASE, name="in_mods"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        cat = discover_kernels(refresh=True)
        assert {"top_level", "in_mods"} <= set(cat.mods)
        assert cat.mods["in_mods"].reference is None
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_duplicate_functor_names_name_both_files(tmp_path, monkeypatch):
    write_mod(tmp_path, dict(BASE, name="document"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        with pytest.raises(ManifestError, match=r"functor name 'document' is declared twice: .*document\.cu and"):
            discover_kernels(refresh=True)
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_a_valid_manifest_with_every_kind_of_argument(tmp_path):
    data = dict(BASE, functions=["score_mod", "mask_mod"], mask_varies=["head"],
                args={"table": {"kind": "pointer", "dtype": "float32", "shape": ["heads", 64]},
                      "ids": {"kind": "pointer", "dtype": "int32"},
                      "n": {"kind": "int", "default": 3}, "w": {"kind": "float"}})
    spec = parse_file(write_mod(tmp_path, data, SCORE_BODY + MASK_BODY))
    assert isinstance(spec, ModSpec) and spec.score and spec.mask and spec.mask_varies == ("head",)
    assert [(a.name, a.slot) for a in spec.args] == [("table", 0), ("ids", 1), ("n", 0), ("w", 0)]
    assert spec.args[0].shape == ("heads", 64) and spec.args[2].default == 3


BAD = [
    ("summary", dict(summary=None), "field 'summary' is missing"),
    ("functions", dict(functions=[]), "field 'functions'"),
    ("functions", dict(functions=["mask_mod", "other"]), "field 'functions'"),
    ("grad alone", dict(functions=["mask_mod", "score_mod_grad"]), "score_mod_grad only beside score_mod"),
    ("bias type", dict(functions=["mask_mod"], bias="yes"), "field 'bias': expected true or false"),
    ("bias alone", dict(functions=["mask_mod"], bias=True), "field 'bias': expected bias only beside score_mod"),
    ("bias and grad", dict(functions=["score_mod", "score_mod_grad"], bias=True),
     "field 'functions': expected no score_mod_grad beside bias"),
    ("unknown", dict(entry="x"), "unknown field"),
    ("name", dict(name="Bad-Name"), "field 'name'"),
    ("mask_varies", dict(mask_varies=["time"]), "field 'mask_varies'"),
    ("arg kind", dict(args={"x": {"kind": "tensor"}}), "field 'args.x'"),
    ("pointer dtype", dict(args={"x": {"kind": "pointer", "dtype": "float64"}}), "field 'args.x'"),
    ("pointer shape", dict(args={"x": {"kind": "pointer", "dtype": "int32", "shape": ["time"]}}), "field 'args.x'"),
    ("int default", dict(args={"x": {"kind": "int", "default": 1.5}}), "field 'args.x'"),
    ("extra key", dict(args={"x": {"kind": "int", "dtype": "int32"}}), "field 'args.x'"),
    ("too many", dict(args={f"p{i}": {"kind": "pointer", "dtype": "int32"} for i in range(3)}), "at most 2 pointer"),
]


@pytest.mark.parametrize("what,fields,message", BAD, ids=[b[0] for b in BAD])
def test_invalid_manifests_name_the_field(tmp_path, what, fields, message):
    data = dict(BASE)
    for key, value in fields.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    with pytest.raises(ManifestError, match=message) as info:
        parse_file(write_mod(tmp_path, data))
    assert str(tmp_path) in str(info.value)


def test_a_declared_function_must_be_defined(tmp_path):
    with pytest.raises(ManifestError, match="declares score_mod but the file defines no score_mod"):
        parse_file(write_mod(tmp_path, dict(BASE, functions=["score_mod"]), MASK_BODY))


def test_a_broken_functor_is_a_problem_not_a_crash(tmp_path, monkeypatch):
    write_mod(tmp_path / "mods", dict(BASE, name="broken", functions=["score_mod"]), MASK_BODY)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(tmp_path))
    try:
        cat = discover_kernels(refresh=True)
        assert "broken" not in cat.mods and any("broken.cu" in p for p in cat.problems)
    finally:
        monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
        discover_kernels(refresh=True)


def test_a_score_mod_builds_into_a_backward_only_with_its_derivative(tmp_path):
    """builds_into: the variant's features cover the kernel functions, and a backward needs score_mod_grad."""
    cat = discover_kernels()
    fa3, fa3_bwd, fa2_bwd = (cat.specs[n] for n in ("fa3", "fa3_bwd", "fa2_bwd"))
    plain = parse_file(write_mod(tmp_path, dict(BASE, name="plain_score", functions=["score_mod"]), SCORE_BODY))
    grad_body = ("\n__device__ float score_mod_grad(float m, int b, int h, int i, int j, const flashkit::ModArgs& a) "
                 "{ return 1.f; }\n")
    graded = parse_file(write_mod(tmp_path / "g", dict(BASE, name="graded", functions=["score_mod", "score_mod_grad"]),
                                  SCORE_BODY + grad_body))
    assert graded.score_grad and graded.kernel_functions == ("score_mod",) and not plain.score_grad
    assert plain.builds_into(fa3) and graded.builds_into(fa3)
    assert graded.builds_into(fa3_bwd) and not plain.builds_into(fa3_bwd)
    assert graded.builds_into(fa2_bwd) and not plain.builds_into(fa2_bwd)   # score_mod functors, with the derivative
    masked = cat.mods["document"]   # a mask_mod: both backward kernels walk its visit lists
    assert masked.builds_into(fa3_bwd) and masked.builds_into(fa2_bwd)
    bias = parse_file(write_mod(tmp_path / "b", dict(BASE, name="a_bias", functions=["score_mod"], bias=True),
                                SCORE_BODY))
    assert bias.score_grad and bias.builds_into(fa3_bwd) and bias.builds_into(fa2_bwd)   # slope 1, no file function
    assert bias.build_features == ("score_mod", "score_mod_bias") and graded.build_features == graded.functions


def test_relative_bias_is_a_bias():
    """The shipped relative_bias declares bias: true: its backward multiplies no slope in (functor.cuh's kUnitGrad)."""
    spec = discover_kernels().mods["relative_bias"]
    assert spec.bias and spec.score_grad and "score_mod_grad" not in spec.functions
