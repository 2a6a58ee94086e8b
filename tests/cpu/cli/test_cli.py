"""The `flashkit` command through click's runner (and once through the real console entry)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import flashkit
from flashkit.cli import cli
from flashkit.registry import discover_kernels
from flashkit.registry.discover import BUILTIN_DIR
from flashkit.runtime.device import device_count

NO_GPU = device_count() == 0
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="checks the GPU-less behaviour; this machine has a GPU")


def invoke(*args, code=0):
    result = CliRunner().invoke(cli, list(args))
    # Only SystemExit may end a command: anything else would print a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"flashkit {' '.join(args)} raised {result.exception!r}\n{result.output}"
    if code is not None:
        assert result.exit_code == code, f"flashkit {' '.join(args)} exited {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output
    return result


def one_line_failure(result) -> str:
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    return lines[0]


def test_help_and_version():
    out = invoke("--help").stdout
    for name in ("list", "info", "explain", "compile", "verify"):
        assert name in out
    assert flashkit.__version__ in invoke("--version").stdout


def test_list():
    out = invoke("list").stdout
    for spec in discover_kernels().specs.values():
        assert spec.name in out and spec.summary in out
    assert "sm>=7.5" in out


def test_list_json():
    data = json.loads(invoke("list", "--json").stdout)
    assert set(data) == {"variants", "mods", "problems"}
    assert {m["name"] for m in data["mods"]} >= {"document", "prefix_lm", "relative_bias"}
    assert data["problems"] == []
    names = [v["name"] for v in data["variants"]]
    assert sorted(names) == sorted(discover_kernels().specs)
    prios = [v["priority"] for v in data["variants"]]
    assert prios == sorted(prios, reverse=True)
    std = next(v for v in data["variants"] if v["name"] == "standard")
    assert std["arch_min"] == "7.5" and "float32" in std["dtypes"]
    assert std["head_dims"] == "multiples of 8 from 8 to 256"
    assert std["path"] == str(BUILTIN_DIR / "standard.cu")
    if NO_GPU:
        assert all(v["runs_here"] is None for v in data["variants"])


def test_list_shows_a_drop_in(monkeypatch, variant_dir):
    variant_dir.write("mine", priority=77, summary="my own kernel")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    data = json.loads(invoke("list", "--json").stdout)
    mine = next(v for v in data["variants"] if v["name"] == "mine")
    assert mine["priority"] == 77 and mine["summary"] == "my own kernel"


def test_info(monkeypatch, tmp_path, variant_dir):
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "cachehere"))
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    out = invoke("info").stdout
    assert f"cache dir:    {tmp_path / 'cachehere'}" in out
    assert str(BUILTIN_DIR) in out and str(variant_dir.path) in out
    assert "nvrtc:" in out and "cupy:" in out and "python:" in out
    if NO_GPU:
        assert "gpu:          none found" in out


def test_info_json(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "c"))
    data = json.loads(invoke("info", "--json").stdout)
    assert {"python", "cache_dir", "kernel_path", "nvrtc", "cupy", "gpu"} <= set(data)
    assert data["cache_dir"] == str(tmp_path / "c")
    assert data["kernel_path"][0] == str(BUILTIN_DIR)
    assert data["nvrtc"] != "not installed"
    if NO_GPU:
        assert data["gpu"] is None


EXPLAIN = ["explain", "--arch", "sm_80", "--dtype", "float32", "--head-dim", "40", "--heads", "8", "--kv-heads",
           "2", "--seqlen-q", "100", "--seqlen-k", "300", "--causal", "--batch", "3"]


def test_explain_selection():
    out = invoke(*EXPLAIN).stdout
    sel = flashkit.explain(dtype="float32", head_dim=40, heads=8, kv_heads=2, seqlen_q=100, seqlen_k=300,
                           causal=True, batch=3, cc=(8, 0))
    assert out.rstrip("\n") == sel.report()          # the CLI prints exactly what the API explains
    lines = out.splitlines()
    assert lines[0] == ("request: dtype=float32 head_dim=40 batch=3 heads=8 kv_heads=2 seqlen_q=100 seqlen_k=300 "
                        "causal on sm_80")
    assert lines[1].startswith("selected: ")
    for name in discover_kernels().specs:
        assert name in out


def test_explain_names_the_head_dim_class():
    out = invoke("explain", "--arch", "sm_80", "--dtype", "bfloat16", "--head-dim", "80").stdout
    assert "selected: fa2 (priority 50)" in out
    assert "head_dim=80 runs as head-dim class 96 (columns 80..95 zero-filled, not stored)" in out
    assert "warning" not in out


def test_explain_backward_names_the_kernel_and_its_architectures_tiles():
    out = invoke("explain", "--backward", "--arch", "sm_80", "--head-dim", "200").stdout
    assert "backward on sm_80" in out and "selected: fa2_bwd (priority 50)" in out
    assert "tiles on sm_80: block_m=64 block_n=64 q_stages=1 warps=8" in out   # Q and dO single-buffered
    assert "selected: fa3_bwd" in invoke("explain", "--backward", "--arch", "sm_90", "--head-dim", "200").stdout
    small = invoke("explain", "--backward", "--arch", "sm_89", "--head-dim", "256").stdout   # 99 KB: V in registers
    assert "selected: fa2_bwd" in small and "tiles on sm_89: block_m=64 block_n=32 q_stages=1 v_in_regs=1 warps=8" in small
    forward = invoke("explain", "--arch", "sm_86", "--head-dim", "256").stdout   # the FA2 family's 99 KB tiles
    assert "selected: fa2" in forward and "tiles on sm_86: block_m=128 block_n=32 warps=8" in forward


def test_explain_warns_of_a_fallback_to_the_baseline():
    out = invoke("explain", "--arch", "sm_75", "--dtype", "float16", "--head-dim", "80").stdout
    assert "selected: standard (priority 0)" in out
    assert "warning: " in out and "the faster kernels need compute capability >= 8.0" in out
    data = json.loads(invoke("explain", "--arch", "sm_75", "--dtype", "float16", "--head-dim", "80", "--json").stdout)
    assert "compute capability >= 8.0" in data["warning"]


def test_explain_forced_variant():
    out = invoke("explain", "--arch", "9.0", "--variant", "standard", "--dtype", "float16", "--head-dim", "64").stdout
    assert "selected: standard (priority 0)" in out


def test_explain_json():
    data = json.loads(invoke(*EXPLAIN, "--json").stdout)
    assert set(data) == {"request", "selected", "notes", "warning", "outranked", "rejected"}
    assert data["selected"] in discover_kernels().specs
    for name, why in data["rejected"].items():
        assert why and all(isinstance(w, str) for w in why), name


def test_explain_no_fit():
    result = invoke("explain", "--arch", "sm_80", "--dtype", "float32", "--head-dim", "7", code=1)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no kernel fits: no kernel supports dtype=float32 head_dim=7 ")
    names = set(discover_kernels().specs)
    listed = {line.split(":")[0].strip() for line in lines[1:]}
    assert listed == names
    std = next(line for line in lines if line.strip().startswith("standard:"))
    assert "head_dim=7 not supported: supported multiples of 8 from 8 to 256" in std


def test_explain_no_fit_json():
    result = invoke("explain", "--arch", "sm_80", "--dtype", "float32", "--head-dim", "7", "--json", code=1)
    data = json.loads(result.stdout)
    assert data["selected"] is None and set(data["rejected"]) == set(discover_kernels().specs)


def test_explain_forced_unfit_variant():
    result = invoke("explain", "--arch", "sm_75", "--variant", "standard", "--head-dim", "7", code=1)
    assert "standard: head_dim=7 not supported" in result.stdout


@pytest.mark.parametrize("args,needle", [
    (["explain", "--dtype", "float64"], "dtype: unknown dtype 'float64'"),
    (["explain", "--arch", "ampere"], "--arch: expected an architecture like sm_80"),
    (["compile", "--arch", "sm_80", "--variant", "nope"], "variant: unknown variant 'nope'"),
])
def test_bad_arguments_are_one_line(args, needle):
    line = one_line_failure(invoke(*args, code=None))
    assert needle in line and line.startswith("Error: ")


def test_compile_standard_for_sm80(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHKIT_CACHE_DIR", str(tmp_path / "cache"))
    out = invoke("compile", "--arch", "sm_80", "--variant", "standard", "-j", "2").stdout
    spec = discover_kernels().get("standard")
    n = len(spec.dtypes) * len(spec.head_dims.examples()) * 2
    assert out.splitlines()[-1] == f"{n} compiled, 0 failed, 0 with spills, 0 with serialized wgmma"
    assert sum(line.startswith("ok   standard      sm_80") for line in out.splitlines()) == n
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), \
        "--arch compiles must not write the cache"


def test_compile_json_subset():
    data = json.loads(invoke("compile", "--arch", "sm_75", "--arch", "sm_90", "--variant", "standard",
                             "--dtype", "float16", "--head-dim", "64", "--json").stdout)
    rows = data["compiled"]
    assert [(r["target"], r["config"].split()[0]) for r in rows] == [("sm_75", "float16")] * 2 + \
        [("sm_90", "float16")] * 2
    assert all(r["error"] is None and r["spill_bytes"] == 0 and r["registers"] > 0 for r in rows)
    assert data["skipped"] == []


def test_compile_reports_skipped_archs():
    out = invoke("compile", "--arch", "sm_70", "--variant", "standard").stdout
    assert "skipped: standard on sm_70: needs compute capability >= 7.5" in out
    assert out.splitlines()[-1] == "0 compiled, 0 failed, 0 with spills, 0 with serialized wgmma"


def test_compile_failure_exits_1(monkeypatch, tmp_path, variant_dir):
    path = variant_dir.write("broken", arch={"min": "8.0"})
    path.write_text(path.read_text() + "\nthis is not C++;\n")
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    discover_kernels(refresh=True)
    result = invoke("compile", "--arch", "sm_80", "--variant", "broken", "--head-dim", "64", "--dtype", "float16",
                    code=1)
    assert "FAIL broken" in result.stdout and "2 compiled, 2 failed" in result.stdout


@needs_no_gpu
def test_compile_without_arch_or_gpu():
    line = one_line_failure(invoke("compile", code=None))
    assert "no CUDA device found" in line and "--arch" in line


@needs_no_gpu
@pytest.mark.parametrize("args", [["verify", "--all"], ["verify", "--variant", "standard", "--quick"],
                                  ["verify", "--fuzz", "3"], ["verify", "--fuzz", "3", "--fuzz-api", "kvcache"]])
def test_verify_without_gpu(args):
    line = one_line_failure(invoke(*args, code=None))
    assert line == "Error: no CUDA device found: this command needs an NVIDIA GPU (use --arch to compile without one)"


def test_verify_needs_a_variant():
    result = invoke("verify", code=2)
    assert "name a --variant, a --mod, or pass --all or --fuzz N" in result.output


@pytest.mark.parametrize("args", [["--fuzz", "3", "--variant", "fa2"], ["--fuzz", "3", "--quick"],
                                  ["--fuzz", "2", "--head-dim", "64"]])
def test_verify_fuzz_draws_its_own_calls(args):
    result = invoke("verify", *args, code=2)
    assert "--fuzz draws its own calls" in result.output


def test_verify_fuzz_api_goes_with_fuzz():
    result = invoke("verify", "--variant", "decode", "--fuzz-api", "kvcache", code=2)
    assert "--fuzz-api goes with --fuzz N" in result.output
    result = invoke("verify", "--fuzz", "3", "--fuzz-api", "paged", code=2)
    assert "--fuzz-api" in result.output and "'attention', 'kvcache'" in result.output


def test_verify_fuzz_needs_a_positive_count():
    result = invoke("verify", "--fuzz", "0", code=2)
    assert "--fuzz" in result.output and "0" in result.output


@needs_no_gpu
def test_console_entry_point_one_line_no_traceback():
    """The installed entry (flashkit.cli:main), not the runner: one line on stderr, non-zero, no traceback."""
    proc = subprocess.run([sys.executable, "-c", "from flashkit.cli import main; main()", "verify", "--all"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no CUDA device" in lines[0], proc.stderr


def test_explain_names_the_tiles_a_block_mask_build_takes():
    """A block mask's build takes the manifest's hd<N>/block_sparse override (build.launch_table): fa3_bwd at hd64
    runs it on two consumers of 128-key blocks, not the dense three of 192."""
    out = invoke("explain", "--backward", "--block-sparse", "--arch", "sm_90", "--head-dim", "64").stdout
    assert "selected: fa3_bwd" in out and "block_n=128" in out and "warps=12" in out


def test_compile_rows_give_a_blocks_shared_memory_and_flag_a_target_it_exceeds():
    from flashkit.cli.compile_cmd import format_row
    row = dict(variant="fa2_bwd", target="sm_86", config="bfloat16 hd256", error=None, registers=255, smem_bytes=9216,
               dynamic_smem_bytes=147968, block_smem_bytes=147968, stack_bytes=16, spill_bytes=24, seconds=1.0)
    assert "smem 147968" in format_row(row) and "OVER sm_86's 101376 B of shared memory" in format_row(row)
    assert "OVER" not in format_row({**row, "target": "sm_80"})
