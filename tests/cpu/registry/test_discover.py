"""registry/discover.py: the search path, drop-in variants, duplicates, broken manifests, entry points."""

from __future__ import annotations

import os
import sys
import uuid
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from flashkit.cli import cli
from flashkit.errors import InputError, ManifestError
from flashkit.registry import discover
from flashkit.registry.discover import BUILTIN_DIR, ENTRY_POINT_GROUP, discover_kernels, kernel_search_path
from ..synth import manifest, write_cu


@pytest.fixture(autouse=True)
def fresh_entry_points():
    """Entry points may be looked up once per process: forget them around each test here."""
    def clear():
        lookup = getattr(discover, "_entry_point_dirs", None)
        if lookup is not None:
            lookup.cache_clear()
    clear()
    yield
    clear()


def test_builtins_found_without_any_path():
    cat = discover_kernels(refresh=True)
    assert "standard" in cat.specs
    assert all(spec.path.parent == BUILTIN_DIR for spec in cat.specs.values())
    assert cat.problems == []
    assert kernel_search_path()[0] == BUILTIN_DIR


def test_drop_in_variant_appears(monkeypatch, variant_dir):
    path = variant_dir.write("dropin", priority=3)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    assert kernel_search_path()[:2] == [BUILTIN_DIR, variant_dir.path]
    cat = discover_kernels()
    assert "dropin" in cat.specs and "standard" in cat.specs
    assert cat.specs["dropin"].path == path
    assert cat.specs["dropin"].priority == 3
    assert cat.get("dropin") is cat.specs["dropin"]


def test_drop_in_disappears_with_the_path(monkeypatch, variant_dir):
    variant_dir.write("dropin")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    assert "dropin" in discover_kernels().specs
    monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
    assert "dropin" not in discover_kernels().specs


def test_several_path_entries_in_order(monkeypatch, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_cu(a, "one.cu", manifest(name="one", entry="flashkit_one"))
    write_cu(b, "two.cu", manifest(name="two", entry="flashkit_two"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", os.pathsep.join([str(a), "", str(b)]))
    assert kernel_search_path()[1:3] == [a, b]
    assert {"one", "two"} <= set(discover_kernels().specs)


def test_refresh_rereads_an_edited_manifest(monkeypatch, variant_dir):
    path = variant_dir.write("dropin", priority=3)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    assert discover_kernels().specs["dropin"].priority == 3
    variant_dir.write("dropin", priority=7)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # a new mtime even on a coarse clock
    assert discover_kernels(refresh=True).specs["dropin"].priority == 7


def test_refresh_finds_a_new_file(monkeypatch, variant_dir):
    variant_dir.write("first")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    assert "second" not in discover_kernels().specs
    variant_dir.write("second")
    assert {"first", "second"} <= set(discover_kernels(refresh=True).specs)


def test_duplicate_of_a_builtin_names_both_files(monkeypatch, variant_dir):
    path = variant_dir.write("standard", filename="my_standard.cu")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    with pytest.raises(ManifestError) as info:
        discover_kernels(refresh=True)
    msg = str(info.value)
    assert "'standard'" in msg
    assert str(BUILTIN_DIR / "standard.cu") in msg and str(path) in msg


def test_duplicate_across_path_dirs_names_both_files(monkeypatch, tmp_path):
    first = write_cu(tmp_path / "a", "x.cu", manifest(name="twin", entry="flashkit_x"))
    second = write_cu(tmp_path / "b", "y.cu", manifest(name="twin", entry="flashkit_y"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    with pytest.raises(ManifestError) as info:
        discover_kernels()
    assert str(first) in str(info.value) and str(second) in str(info.value)


def test_broken_manifest_is_a_problem_not_a_crash(monkeypatch, variant_dir):
    variant_dir.write("good")
    broken = write_cu(variant_dir.path, "broken.cu", manifest(name="broken", dtypes=["float64"]))
    no_header = variant_dir.path / "noheader.cu"
    no_header.write_text('extern "C" __global__ void f() {}\n')
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    cat = discover_kernels(refresh=True)
    assert "good" in cat.specs and "broken" not in cat.specs
    assert len(cat.problems) == 2, cat.problems
    assert any(str(broken) in p and "'dtypes'" in p for p in cat.problems), cat.problems
    assert any(str(no_header) in p and "no manifest" in p for p in cat.problems), cat.problems


def test_missing_directory_is_a_problem(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(missing))
    cat = discover_kernels(refresh=True)
    assert "standard" in cat.specs
    assert cat.problems == [f"{missing}: kernel directory not found"]


def test_flashkit_list_survives_a_broken_manifest(monkeypatch, variant_dir):
    variant_dir.write("good")
    broken = write_cu(variant_dir.path, "broken.cu", "name: [unclosed")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    result = CliRunner().invoke(cli, ["list"])
    assert result.exit_code == 0, result.output
    assert "good" in result.stdout and "standard" in result.stdout
    assert f"skipped: {broken}" in result.stderr


def test_unknown_variant_lookup():
    with pytest.raises(InputError, match="variant: unknown variant 'nope'; known: .*standard"):
        discover_kernels().get("nope")


def fake_entry_point(name, load):
    return SimpleNamespace(name=name, load=load)


def test_entry_point_group(monkeypatch, tmp_path):
    d1, d2 = tmp_path / "ep1", tmp_path / "ep2"
    write_cu(d1, "epone.cu", manifest(name="epone", entry="flashkit_epone"))
    write_cu(d2, "eptwo.cu", manifest(name="eptwo", entry="flashkit_eptwo"))
    asked = []

    def entry_points(group):
        asked.append(group)
        return [fake_entry_point("callable", lambda: (lambda: str(d1))),   # a function returning a dir
                fake_entry_point("plain", lambda: d2),                      # the dir itself
                fake_entry_point("broken", lambda: 1 / 0)]                   # a plugin that fails to load
    monkeypatch.setattr(discover, "metadata", SimpleNamespace(entry_points=entry_points))
    path = kernel_search_path()
    assert asked == [ENTRY_POINT_GROUP] == ["flashkit.kernels"]
    assert path[1:3] == [d1, d2]
    cat = discover_kernels(refresh=True)
    assert {"epone", "eptwo", "standard"} <= set(cat.specs)
    assert len(cat.problems) == 1 and "entry point broken" in cat.problems[0], cat.problems


def test_entry_point_after_kernel_path(monkeypatch, tmp_path, variant_dir):
    variant_dir.write("fromenv")
    ep_dir = tmp_path / "ep"
    write_cu(ep_dir, "fromep.cu", manifest(name="fromep", entry="flashkit_fromep"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    monkeypatch.setattr(discover, "metadata",
                        SimpleNamespace(entry_points=lambda group: [fake_entry_point("x", lambda: ep_dir)]))
    assert kernel_search_path() == [BUILTIN_DIR, variant_dir.path, ep_dir]


def test_real_installed_entry_point(monkeypatch, tmp_path):
    """A distribution on sys.path declaring the group is found through importlib.metadata."""
    module = f"flashkit_test_plugin_{uuid.uuid4().hex[:8]}"
    kernels = tmp_path / "plugin_kernels"
    write_cu(kernels, "plugged.cu", manifest(name="plugged", entry="flashkit_plugged"))
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(f"def kernels():\n    return {str(kernels)!r}\n")
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nplugged = {module}:kernels\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        assert kernels in kernel_search_path()
        assert "plugged" in discover_kernels(refresh=True).specs
    finally:
        sys.modules.pop(module, None)
