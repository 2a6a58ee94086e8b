#!/usr/bin/env bash
# The modifications on a GPU machine in one go: precompile the FA2-family specializations (all cores),
# the GPU tests of the modifications and of the dense fa2/causal checks, then the window benchmark.
# Usage: scripts/gpu-mods.sh LOGDIR [pytest -k expression for tests/gpu/test_mods.py]
set -u
out=${1:?log directory}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > "$out/device.txt" 2>&1
python3 - <<'PY' 2>&1 | tail -3 | tee "$out/precompile.log"
import itertools, os, time
from flashkit.registry import discover_kernels
from flashkit.runtime.build import make_config
from flashkit.verify.compile_matrix import compile_matrix
t = time.time()
cat, jobs = discover_kernels(), []
subsets = [m for r in range(4) for m in itertools.combinations(("window", "softcap", "alibi"), r)]
for name in ("fa2", "causal"):
    spec = cat.get(name)
    for dt, hd, c, m in itertools.product(("float16", "bfloat16"), (64, 128, 256), spec.causal_options(), subsets):
        jobs.append((spec, make_config(spec, dt, hd, c, (9, 0), False, None, m), spec.target((9, 0))))
rows = compile_matrix(jobs, jobs=os.cpu_count(), to_cache=True)
print(len(rows), "compiled,", sum(bool(r["error"]) for r in rows), "errors,", round(time.time() - t, 1), "s")
PY
python3 -m pytest tests/gpu/test_mods.py -q --maxfail=8 -p no:cacheprovider ${2:+-k "$2"} 2>&1 | tail -25 > "$out/test_mods.log"
tail -3 "$out/test_mods.log"
python3 -m pytest tests/gpu/test_flash.py -q -k "fa2 or causal" -p no:cacheprovider 2>&1 | tail -8 > "$out/test_flash.log"
tail -3 "$out/test_flash.log"
timeout 150 python3 -m flashkit.bench.mods --out "$out/bench_mods.json" 2>&1 | grep -v Warning | tee "$out/bench_mods.log"
