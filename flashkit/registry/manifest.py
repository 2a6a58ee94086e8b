"""KernelSpec: what a variant's leading YAML comment declares, parsed and checked field by field."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from ..call.dtypes import BY_NAME
from ..errors import ManifestError

MANIFEST_RE = re.compile(r"\A\s*/\*---\s*\n(.*?)\n\s*---\*/", re.S)
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
SYMBOL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LENGTH_KEY_RE = re.compile(r"(hd\d+(?:/causal)?)/seqlen_q<=(\d+)")   # an override for calls of at most L rows
# window: window_size or attention_chunk (a local mask); chunk: attention_chunk itself, which a kernel may lack
# beside a window (fa3_bwd's one-register window test has no chunks).
FEATURES = ("causal", "block_sparse", "fp8", "backward", "lse", "gqa", "window", "chunk", "softcap", "alibi", "kv_cache",
            "varlen", "score_mod", "mask_mod",   # score_mod / mask_mod: builds a drop-in functor in (functor.cuh)
            "head_dim_v")   # v / o of a head dim below q / k's, of the variant's head dims (FLASHKIT_HEAD_DIM_V)
# Launch parameters that are switches (0 or 1) rather than positive sizes; like the others they reach the
# kernel as FLASHKIT_<NAME> defines. persistent: the `tiles` grid runs one CTA an SM over every tile;
# defer_pv_wait: a Hopper consumer waits for its P V at the top of its next visit (hopper/ws_mainloop.cuh);
# heaviest_first: a causal backward's CTAs take key blocks heaviest first in groups the host sizes per call
# (Params.bwd.order_pairs: hopper/bwd_launch_order.cuh, runtime/bwd_order.py); mask_warps: a Hopper backward's
# mask_mod element mask is evaluated by the producer warpgroup's other warps, not by the consumers (hopper/bwd_keep.cuh);
# pass_unseen: a Hopper forward consumer passes by the first causal key tiles none of its rows sees; free_issue: the
# 16-bit Hopper forward's consumers issue their products without ping-pong turns; serial_pv: a Hopper forward consumer
# waits for each P V before its next S (no overlap within the warpgroup); max_first: a Hopper forward consumer takes
# an unmasked visit's row maxima before the per-element modification where it can (softcap: over the raw scores;
# ALiBi: over its key-linear part left of the diagonal; all four hopper/ws_mainloop.cuh);
# timeline: clock64 stamps of CTA (0, 0, 0)'s visits, forward and backward (hopper/timeline.cuh; scripts/timeline.py,
# never a manifest's).
LAUNCH_FLAGS = ("persistent", "defer_pv_wait", "heaviest_first", "mask_warps", "pass_unseen", "free_issue",
                "serial_pv", "max_first", "timeline")
GRID_KINDS = ("q_blocks", "tiles", "heads", "score_tiles", "row_groups", "kv_tiles", "kv_splits", "split_combine")
WORKSPACE_KINDS = ("none", "scores", "running_state", "v_transposed", "dq_accum", "split_partials")
REQUIRED = ("name", "summary", "entry", "arch", "dtypes", "head_dims", "features", "launch")
KNOWN = set(REQUIRED) | {"priority", "overrides", "workspace", "requires", "tensor_maps", "limits"}
# limits: upper bounds of a request where a variant is the right choice (a decode kernel: short queries).
LIMIT_KEYS = ("seqlen_q", "packed_rows")   # packed_rows: seqlen_q * heads / kv_heads
# Kernel arguments after Params, in this order (dout: the backward's; vt: V transposed in the workspace, fp8 on wgmma).
TENSOR_MAP_NAMES = ("q", "k", "v", "o", "dout", "vt")
MAP_ROWS_HEAD_DIM = "head_dim"   # box rows of a map whose rows are the head dim (vt)


def launch_value_ok(name: str, value) -> bool:
    """A launch parameter's value: 0 or 1 for a switch (LAUNCH_FLAGS), else a positive integer."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value in (0, 1) if name in LAUNCH_FLAGS else value > 0


def parse_cc(text: Any, where: str) -> tuple[int, int]:
    """'8.0' -> (8, 0)."""
    m = re.fullmatch(r"(\d+)\.(\d+)", str(text).strip())
    if not m:
        raise ManifestError(f"{where}: expected a compute capability like \"8.0\", got {text!r}")
    return int(m.group(1)), int(m.group(2))


def nearest_arch(archs, cc: tuple[int, int]):
    """Of compute capabilities `archs`, the one that applies to cc: the highest of cc's major version at most cc
    (a key "8.6" holds for 8.6, 8.7 and 8.9 unless a higher one is given), or None."""
    return max((a for a in archs if a[0] == cc[0] and a <= cc), default=None)


@dataclass(frozen=True)
class HeadDims:
    """Supported head dims: an explicit list, or a range with a step, optionally compiled per class.

    classes: the head dims a range variant is compiled for; a call's head dim runs on the smallest class
    at least as large (its columns beyond it zero-filled by the kernel, FLASHKIT_HEAD_DIM_PADDED). Without
    classes every head dim is compiled as itself.
    """

    values: tuple[int, ...] = ()
    low: int = 0
    high: int = 0
    multiple_of: int = 1
    classes: tuple[int, ...] = ()
    # (compute capability, largest head dim) where an architecture takes fewer (an SM's shared memory): the manifest's
    # max_by_arch, e.g. {"8.6": 128}, which holds as the overrides' arch keys do (nearest_arch)
    max_by_arch: tuple[tuple[tuple[int, int], int], ...] = ()

    def max_on(self, cc: tuple[int, int] | None) -> int | None:
        """The largest head dim an architecture takes below the range's own, or None where it takes them all."""
        limits = dict(self.max_by_arch)
        arch = nearest_arch(limits, cc) if cc is not None else None
        return limits[arch] if arch is not None else None

    def on_arch(self, d: int, cc: tuple[int, int] | None) -> bool:
        """Whether head dim d (one of the range's) runs on compute capability cc."""
        limit = self.max_on(cc)
        return limit is None or d <= limit

    def __contains__(self, d: int) -> bool:
        if self.values:
            return d in self.values
        return self.low <= d <= self.high and d % self.multiple_of == 0

    def class_of(self, d: int) -> int:
        """The head dim a call of head dim d is compiled for: its class, or d itself."""
        return next((c for c in self.classes if c >= d), d)

    def describe(self) -> str:
        if self.values:
            return ", ".join(str(v) for v in self.values)
        text = f"multiples of {self.multiple_of} from {self.low} to {self.high}"
        text += f" (compiled as {', '.join(str(c) for c in self.classes)})" if self.classes else ""
        return text + "".join(f"; up to {limit} on sm_{cc[0]}{cc[1]}" for cc, limit in self.max_by_arch)

    def padded_examples(self) -> tuple[int, ...]:
        """One head dim below each class, the furthest from it (the previous class + the step, or the minimum)."""
        out, below = [], self.low
        for c in self.classes:
            if below < c and below in self:
                out.append(below)
            below = c + self.multiple_of
        return tuple(out)

    def examples(self) -> tuple[int, ...]:
        """Head dims to compile and verify: the list; or every class and a padded member of each; or the
        powers of two and the ends of the range."""
        if self.values:
            return self.values
        if self.classes:
            return tuple(sorted({self.low, self.high} | set(self.classes) | set(self.padded_examples())))
        picks = {self.low, self.high} | {d for d in (32, 64, 128, 256) if d in self}
        return tuple(sorted(picks))


@dataclass(frozen=True)
class KernelSpec:
    """One variant: its manifest and where it came from."""

    name: str
    summary: str
    path: Path
    entries: tuple[str, ...]
    grids: tuple[str, ...]
    arch_min: tuple[int, int]
    arch_max: tuple[int, int] | None
    targets: dict[tuple[int, int], str]
    dtypes: tuple[str, ...]
    head_dims: HeadDims
    features: dict[str, bool]
    requires: dict[str, bool]
    priority: int
    launch: dict[str, int]
    overrides: dict[str, dict[str, int]] = field(default_factory=dict)
    workspace: str = "none"
    tensor_maps: dict[str, int | str] = field(default_factory=dict)   # tensor -> box rows (int or launch key)
    limits: dict[str, int] = field(default_factory=dict)   # LIMIT_KEYS -> largest value served

    def tensor_map_rows(self, launch: dict[str, int], head_dim: int = 0) -> dict[str, int]:
        """Box rows of each tensor map the entry takes, in argument order, launch keys (and head_dim) resolved."""
        values = {**launch, MAP_ROWS_HEAD_DIM: head_dim}
        return {t: values[r] if isinstance(r, str) else r
                for t in TENSOR_MAP_NAMES if (r := self.tensor_maps.get(t)) is not None}

    def supports(self, feature: str) -> bool:
        return self.features.get(feature, False)

    def causal_options(self, wanted: tuple[bool, ...] = (False, True)) -> list[bool]:
        """The causal settings among `wanted` this variant runs: it must support causal, and honour `requires`."""
        return [c for c in wanted if (self.supports("causal") or not c)
                and self.requires.get("causal", c) == c]

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether the declared architecture range holds compute capability cc."""
        return self.arch_min <= cc and (self.arch_max is None or cc <= self.arch_max)

    def arch_requirement(self) -> str:
        """The architecture range in words: '>= 8.9', '9.0 exactly' or 'from 8.0 to 9.0'."""
        lo = f"{self.arch_min[0]}.{self.arch_min[1]}"
        if self.arch_max is None:
            return f">= {lo}"
        hi = f"{self.arch_max[0]}.{self.arch_max[1]}"
        return f"{lo} exactly" if self.arch_max == self.arch_min else f"from {lo} to {hi}"

    def launch_config(self, cc: tuple[int, int] | None, head_dim: int, mods: tuple[str, ...] = (),
                      causal: bool = False, seqlen_q: int | None = None) -> dict[str, int]:
        """The launch table with overrides applied: arch key, hd key, 'arch/hd' key, 'hd/causal' for a causal call,
        then 'hd/<mod>' per modification, then each 'hd/<mod>+<mod>..' whose modifications are all among the
        call's, then for a causal call 'hd/causal/<mod>' per modification (hd: the head dim's class).
        'hd/seqlen_q<=L' follows 'hd' and 'hd/causal/seqlen_q<=L' follows 'hd/causal' for a call of at most L query
        rows (the smallest L last); seqlen_q None: no length key."""
        config = dict(self.launch)
        arch_key = None
        if cc is not None:
            archs = {parse_cc(k, self.name): k for k in self.overrides if re.fullmatch(r"\d+\.\d+", k)}
            arch_key = archs.get(nearest_arch(archs, cc))
        hd = self.head_dims.class_of(head_dim)   # keys name the compiled class
        keys = [arch_key, f"hd{hd}", f"{arch_key}/hd{hd}" if arch_key else None] + self._length_keys(f"hd{hd}", seqlen_q)
        if causal:
            keys += [f"hd{hd}/causal"] + self._length_keys(f"hd{hd}/causal", seqlen_q)
        combined = sorted(k for k in self.overrides if k.startswith(f"hd{hd}/") and "+" in k
                          and set(k.split("/", 1)[1].split("+")) <= set(mods))
        causal_mods = [f"hd{hd}/causal/{m}" for m in sorted(mods)] if causal else []
        for key in keys + [f"hd{hd}/{m}" for m in sorted(mods)] + combined + causal_mods:
            if key and key in self.overrides:
                config.update(self.overrides[key])
        return config

    @cached_property
    def _length_overrides(self) -> dict[str, tuple[tuple[int, str], ...]]:
        """The 'prefix/seqlen_q<=L' keys by prefix ('hd<N>' or 'hd<N>/causal'): (L, key), the largest L first."""
        found: dict[str, list[tuple[int, str]]] = {}
        for key in self.overrides:
            if m := LENGTH_KEY_RE.fullmatch(key):
                found.setdefault(m.group(1), []).append((int(m.group(2)), key))
        return {prefix: tuple(sorted(keys, reverse=True)) for prefix, keys in found.items()}

    def _length_keys(self, prefix: str, seqlen_q: int | None) -> list[str]:
        """prefix/seqlen_q<=L keys that hold for seqlen_q, the largest L first (the tightest bound wins)."""
        if seqlen_q is None:
            return []
        return [key for bound, key in self._length_overrides.get(prefix, ()) if seqlen_q <= bound]

    def length_bounds(self, head_dim: int) -> tuple[int, ...]:
        """The L of every 'hd/..seqlen_q<=L' key of head_dim's class: a call of seqlen_q = L builds what every call
        up to L (and above the next smaller bound) builds (the compile matrix compiles each)."""
        hd = self.head_dims.class_of(head_dim)
        return tuple(sorted({bound for prefix in (f"hd{hd}", f"hd{hd}/causal")
                             for bound, _ in self._length_overrides.get(prefix, ())}))

    def target(self, cc: tuple[int, int]) -> str:
        """The NVRTC -arch value for a compute capability: the manifest's target or plain sm_XY."""
        return self.targets.get(cc, f"sm_{cc[0]}{cc[1]}")

    def declared_ccs(self) -> list[tuple[int, int]]:
        """The compute capabilities CI compiles for: the minimum, 8.0 and 9.0 where supported, and each declared
        target's."""
        return sorted({self.arch_min} | {cc for cc in ((8, 0), (9, 0)) if self.runs_on(cc)} | set(self.targets))

    def declared_archs(self) -> list[str]:
        """The targets to compile in CI (declared_ccs' NVRTC -arch values)."""
        return sorted({self.target(cc) for cc in self.declared_ccs()})


def _head_dim_classes(hd: dict, bad) -> tuple[int, ...]:
    """A range's compiled classes: increasing multiples of its step, the last at least its maximum."""
    classes = hd.get("classes", [])
    step = hd.get("multiple_of", 1)
    if not isinstance(classes, list) or not all(isinstance(c, int) and c > 0 and c % step == 0 for c in classes) \
            or classes != sorted(set(classes)) or (classes and classes[-1] < hd["max"]):
        raise bad("head_dims", f"'classes' as increasing multiples of {step}, the last >= max {hd['max']}")
    return tuple(classes)


def _head_dim_arch_limits(hd: dict, bad) -> tuple[tuple[tuple[int, int], int], ...]:
    """A range's max_by_arch: compute capabilities to the largest head dim they take, each within [min, max)."""
    limits = hd.get("max_by_arch", {})
    if not isinstance(limits, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and hd["min"] <= v < hd["max"] for v in limits.values()):
        raise bad("head_dims", f"'max_by_arch' as a mapping of compute capabilities (\"8.6\") to head dims from "
                               f"{hd['min']} to below max {hd['max']}")
    return tuple(sorted((parse_cc(k, "head_dims.max_by_arch"), v) for k, v in limits.items()))


def read_manifest_text(path: Path) -> str:
    """The YAML text of a .cu's leading manifest comment."""
    text = path.read_text(encoding="utf-8")
    m = MANIFEST_RE.match(text)
    if not m:
        raise ManifestError(f"{path}: no manifest: the file must begin with a /*--- ... ---*/ YAML comment")
    return m.group(1)


def parse_manifest(path: Path) -> KernelSpec:
    """Parse and check a variant's manifest; ManifestError names the file and the field."""
    path = Path(path)
    return spec_from(path, load_manifest(path))


def load_manifest(path: Path) -> dict:
    """The YAML mapping of a .cu's manifest (a variant's or a drop-in functor's); ManifestError if it is none."""
    try:
        data = yaml.safe_load(read_manifest_text(path))
    except yaml.YAMLError as e:
        raise ManifestError(f"{path}: manifest is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: manifest must be a YAML mapping")
    return data


def check_identity(path: Path, data: dict, required: tuple[str, ...], known: set[str]) -> None:
    """The fields every manifest shares: the required ones present, no unknown one, name and summary."""
    for fld in required:
        if fld not in data:
            raise ManifestError(f"{path}: field '{fld}' is missing")
    unknown = set(data) - known
    if unknown:
        raise ManifestError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    if not isinstance(data["name"], str) or not NAME_RE.match(data["name"]):
        raise ManifestError(f"{path}: field 'name': expected a lower-case identifier, got {data['name']!r}")
    if not isinstance(data["summary"], str):
        raise ManifestError(f"{path}: field 'summary': expected a string, got {data['summary']!r}")


def spec_from(path: Path, data: dict) -> KernelSpec:
    """A variant's KernelSpec from its loaded manifest, checked field by field."""
    def bad(fld: str, expected: str) -> ManifestError:
        return ManifestError(f"{path}: field '{fld}': expected {expected}, got {data.get(fld)!r}")

    check_identity(path, data, REQUIRED, KNOWN)
    name = data["name"]
    entries = data["entry"] if isinstance(data["entry"], list) else [data["entry"]]
    if not entries or not all(isinstance(e, str) and SYMBOL_RE.match(e) for e in entries):
        raise bad("entry", "a C symbol or a list of them")

    arch = data["arch"]
    if not isinstance(arch, dict) or "min" not in arch:
        raise bad("arch", "a mapping with 'min', e.g. {min: \"8.0\"}")
    if set(arch) - {"min", "max", "targets"}:
        raise bad("arch", "keys among min, max, targets")
    arch_min = parse_cc(arch["min"], f"{path}: field 'arch.min'")
    arch_max = parse_cc(arch["max"], f"{path}: field 'arch.max'") if "max" in arch else None
    if arch_max is not None and arch_max < arch_min:
        raise bad("arch", "max >= min")
    raw_targets = arch.get("targets") or {}
    if not isinstance(raw_targets, dict) or not all(isinstance(v, str) for v in raw_targets.values()):
        raise bad("arch", "'targets' as a mapping of compute capability to target, e.g. {\"9.0\": sm_90a}")
    targets = {parse_cc(k, f"{path}: field 'arch.targets'"): v for k, v in raw_targets.items()}

    dtypes = data["dtypes"]
    if not isinstance(dtypes, list) or not dtypes or any(not isinstance(d, str) or d not in BY_NAME for d in dtypes):
        raise bad("dtypes", f"a list from {', '.join(BY_NAME)}")

    hd = data["head_dims"]
    if isinstance(hd, list) and hd and all(isinstance(x, int) and x > 0 for x in hd):
        head_dims = HeadDims(values=tuple(hd))
    elif (isinstance(hd, dict) and {"min", "max"} <= set(hd) <= {"min", "max", "multiple_of", "classes", "max_by_arch"}
          and all(isinstance(v, int) and v > 0 for k, v in hd.items() if k not in ("classes", "max_by_arch"))
          and hd["min"] <= hd["max"]):
        head_dims = HeadDims(low=hd["min"], high=hd["max"], multiple_of=hd.get("multiple_of", 1),
                             classes=_head_dim_classes(hd, bad), max_by_arch=_head_dim_arch_limits(hd, bad))
    else:
        raise bad("head_dims", "a list of positive ints or {min, max, multiple_of, classes, max_by_arch}")

    features = data["features"]
    if not isinstance(features, dict) or any(k not in FEATURES or not isinstance(v, bool) for k, v in features.items()):
        raise bad("features", f"a mapping of {', '.join(FEATURES)} to true/false")
    requires = data.get("requires") or {}
    if not isinstance(requires, dict) or any(k not in FEATURES or not isinstance(v, bool) for k, v in requires.items()):
        raise bad("requires", f"a mapping of {', '.join(FEATURES)} to true/false")

    launch = data["launch"]
    if not isinstance(launch, dict) or "grid" not in launch:
        raise bad("launch", "a mapping with 'grid' and integer tile parameters")
    grids = launch["grid"] if isinstance(launch["grid"], list) else [launch["grid"]] * len(entries)
    if len(grids) != len(entries) or any(g not in GRID_KINDS for g in grids):
        raise bad("launch", f"grid kinds from {', '.join(GRID_KINDS)}, one per entry")
    ints = {k: v for k, v in launch.items() if k != "grid"}
    if "warps" not in ints or not all(launch_value_ok(k, v) for k, v in ints.items()):
        raise bad("launch", f"positive integer parameters including 'warps' ({', '.join(LAUNCH_FLAGS)}: 0 or 1)")
    overrides = data.get("overrides") or {}
    if not isinstance(overrides, dict) or any(
            not isinstance(v, dict) or not all(launch_value_ok(k, x) for k, x in v.items())
            for v in overrides.values()):
        raise bad("overrides", "a mapping of keys (\"9.0\", \"hd256\", \"9.0/hd256\") to integer launch parameters")
    workspace = data.get("workspace", "none")
    if workspace not in WORKSPACE_KINDS:
        raise bad("workspace", f"one of {', '.join(WORKSPACE_KINDS)}")
    tensor_maps = data.get("tensor_maps") or {}
    if not isinstance(tensor_maps, dict) or any(
            t not in TENSOR_MAP_NAMES or not ((isinstance(r, int) and r > 0) or r in ints or r == MAP_ROWS_HEAD_DIM)
            for t, r in tensor_maps.items()):
        raise bad("tensor_maps", f"a mapping of tensors ({', '.join(TENSOR_MAP_NAMES)}) to box rows "
                                 f"(a positive int, a launch key such as block_m, or {MAP_ROWS_HEAD_DIM})")
    limits = data.get("limits") or {}
    if not isinstance(limits, dict) or any(k not in LIMIT_KEYS or not isinstance(v, int) or isinstance(v, bool)
                                           or v <= 0 for k, v in limits.items()):
        raise bad("limits", f"a mapping of {', '.join(LIMIT_KEYS)} to positive ints")
    priority = data.get("priority", 0)
    if not isinstance(priority, int):
        raise bad("priority", "an integer")
    return KernelSpec(
        name=name, summary=data["summary"], path=path, entries=tuple(entries), grids=tuple(grids),
        arch_min=arch_min, arch_max=arch_max, targets=targets, dtypes=tuple(dtypes), head_dims=head_dims,
        features={f: bool(features.get(f, False)) for f in FEATURES}, requires=dict(requires),
        priority=priority, launch=ints, overrides={str(k): dict(v) for k, v in overrides.items()},
        workspace=workspace, tensor_maps=dict(tensor_maps), limits=dict(limits))
