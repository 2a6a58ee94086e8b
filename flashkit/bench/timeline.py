"""Where a visit's cycles go in the warp-specialized Hopper kernels: a variant rebuilt with the `timeline` launch
flag (hopper/timeline.cuh) stamps SM clocks at the points of each main-loop visit of CTA (0, 0, 0)'s last tile, for
every consumer warpgroup (and, in the forward, the producer's loads); this module builds that copy, runs it once
and summarizes the stamps. Forward: fa3, fa3_fp8, block_sparse_hopper; backward: fa3_bwd where its consumers split
the key block by keys (hd64 to hd128; the column-split consumers of hd192 / hd256 stamp nothing). For kernel
development (scripts/timeline.py); it found, for example, fa3_fp8's consumers stalled ~400 of a 2550-cycle visit on
their scale loads (BENCHMARKS.md).

The copy is a drop-in file (the variant's source, renamed `<variant>_timeline`, the flag added to its launch table)
in a temporary directory on FLASHKIT_KERNEL_PATH, so that it builds and launches through the public API. Stamps
come from one tile, so a call whose tiles differ in length (causal) mixes tiles: time full attention.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import FlashkitError

SUFFIX = "_timeline"
SYMBOL = "flashkit_timeline"
ROLES, VISITS, POINTS = 4, 64, 8   # hopper/timeline.cuh: kTimelineProducer + 1, kTimelineVisits, kTimelinePoints
PRODUCER = ROLES - 1
# The intervals between a consumer visit's points (timeline.cuh's TimelinePoint, BwdTimelinePoint), then "rest":
# to the next visit's start.
PHASES = ("settle", "operands", "issue", "wait S", "softmax")
BWD_PHASES = ("issue", "wait S", "P, dV", "wait dP", "dS", "dS barrier", "dQ, dK")
PHASE_HELP = {"settle": "the P V waited for, O rescaled, P packed", "operands": "waiting for the K and V stages",
              "issue": "the products issued (after their stages' waits; forward: with the turns)",
              "wait S": "until S (S^T) landed", "softmax": "P and the row statistics",
              "P, dV": "P^T formed, dV += P^T dO issued", "wait dP": "until dP^T landed",
              "dS": "dS^T formed and stored", "dS barrier": "until every consumer's dS^T rows are stored",
              "dQ, dK": "dQ and dK issued and waited for, dQ handed on", "rest": "to the next visit's start"}
K_ISSUED, V_ISSUED = 1, 2   # the forward producer's points
SETTLED = 1                 # the forward consumer's point after which it waits for the visit's K


def timeline_source(source: str, name: str) -> str:
    """The variant's source as a drop-in `<name>_timeline` with the timeline flag in its launch table."""
    out, renamed = re.subn(rf"^name:\s*{re.escape(name)}\s*$", f"name: {name}{SUFFIX}", source, count=1, flags=re.M)
    out, flagged = re.subn(r"^launch:\s*\{", "launch: {timeline: 1, ", out, count=1, flags=re.M)
    if not (renamed and flagged):
        raise FlashkitError(f"variant {name!r}: its manifest has no 'name: {name}' or 'launch: {{...}}' line to rewrite")
    return out


def write_copy(spec, directory: Path) -> str:
    """Write the variant's timeline copy into `directory`; returns its name."""
    text = Path(spec.path).read_text()
    if not any(core in text for core in ("ws_forward", "ws_mainloop", "ws_backward")):
        raise FlashkitError(f"variant {spec.name!r}: no timeline points (only the warp-specialized Hopper kernels "
                            "stamp them: fa3, fa3_fp8, block_sparse_hopper, fa3_bwd)")
    (directory / f"{spec.name}{SUFFIX}.cu").write_text(timeline_source(text, spec.name))
    return spec.name + SUFFIX


@dataclass
class Summary:
    period: float                  # median cycles from one visit's start to the next (consumer 0)
    phases: list[dict[str, float]]  # per consumer: median cycles of each phase and "rest"
    k_lead: float | None           # forward: median cycles from the producer issuing a visit's K to consumer 0 needing it
    visits: int                    # visits summarized

    def render(self) -> str:
        lines = [f"visit period {self.period:.0f} cycles (median over {self.visits} visits of CTA (0, 0, 0)'s last tile)"]
        for c, ph in enumerate(self.phases):
            lines.append(f"  consumer {c}: " + "  ".join(f"{k} {v:.0f}" for k, v in ph.items()))
        if self.k_lead is not None:
            lines.append(f"  producer: a visit's K issued {self.k_lead:.0f} cycles before consumer 0 waits for it")
        names = list(self.phases[0]) if self.phases else []
        lines.append("  (" + "; ".join(f"{k}: {PHASE_HELP[k]}" for k in names) + ")")
        return "\n".join(lines)


def summarize(stamps, skip: int = 4, phases: tuple[str, ...] = PHASES) -> Summary:
    """Medians over the visits every consumer stamped (stamps: ROLES x VISITS x POINTS clock values, 0 = none),
    the first `skip` visits left out (the pipeline filling); `phases`: the intervals between a visit's points
    (PHASES for the forward, BWD_PHASES for the backward)."""
    points = len(phases) + 1
    rows = [[[int(x) for x in visit] for visit in role] for role in stamps]
    consumers = [r for r in rows[:PRODUCER] if any(r[v][0] for v in range(VISITS))]
    if not consumers:
        raise FlashkitError("no timeline stamps: the call ran no stamped visit (a tile of fewer than two K/V tiles?)")

    def complete(v):
        return all(all(c[v][p] for p in range(points)) for c in consumers)
    stamped = [v for v in range(VISITS) if complete(v)]
    paired = [v for v in stamped if v + 1 in stamped]   # a visit and the next: its rest and the period
    visits = [v for v in paired if v >= paired[0] + skip] or paired if paired else []
    if not visits:
        raise FlashkitError("too few stamped visits to summarize: time a longer sequence")
    medians = []
    for c in consumers:
        ph = {name: statistics.median(c[v][i + 1] - c[v][i] for v in visits) for i, name in enumerate(phases)}
        ph["rest"] = statistics.median(c[v + 1][0] - c[v][points - 1] for v in visits)
        medians.append(ph)
    period = statistics.median(consumers[0][v + 1][0] - consumers[0][v][0] for v in visits)
    prod = rows[PRODUCER]
    leads = [consumers[0][v][SETTLED] - prod[v][K_ISSUED] for v in visits if prod[v][K_ISSUED]]
    return Summary(period, medians, statistics.median(leads) if leads else None, len(visits))


def read_stamps(loaded):
    """The stamps of a loaded timeline build (runtime.build's LoadedKernel), as nested lists."""
    import numpy as np
    from ..runtime.device import cupy_module
    cp = cupy_module()
    ptr = loaded.module.get_global(SYMBOL)
    host = np.zeros((ROLES, VISITS, POINTS), dtype=np.uint64)
    cp.cuda.runtime.memcpy(host.ctypes.data, ptr.ptr, host.nbytes, cp.cuda.runtime.memcpyDeviceToHost)
    return host.tolist()


def run_timeline(variant: str, head_dim: int, seqlen: int, batch: int = 1, heads: int = 16, dtype: str = "bfloat16",
                 repeats: int = 3) -> Summary:
    """Build the variant's timeline copy, call it `repeats` times on fresh N(0, 1) inputs (fp8 variants: quantized
    from them; a backward: on the default forward's output and LSE) and summarize the last call's stamps."""
    from .. import attention, attention_backward
    from ..call.dtypes import BY_NAME
    from ..registry import discover_kernels
    from ..runtime import build
    from ..runtime.device import cupy_module
    cp = cupy_module()
    spec = discover_kernels().get(variant)
    with tempfile.TemporaryDirectory(prefix="flashkit-timeline-") as tmp:
        name = write_copy(spec, Path(tmp))
        path = Path(tmp) / f"{name}.cu"
        old = os.environ.get("FLASHKIT_KERNEL_PATH")
        os.environ["FLASHKIT_KERNEL_PATH"] = os.pathsep.join([tmp] + ([old] if old else []))
        try:
            rng = cp.random.default_rng(0)
            shape = (batch, seqlen, heads, head_dim)
            q, k, v = (rng.standard_normal(shape, dtype=cp.float32).astype(BY_NAME[dtype].storage) for _ in range(3))
            backward = bool(spec.features.get("backward"))
            if backward:
                out, lse = attention(q, k, v, return_lse=True)
                dout = rng.standard_normal(shape, dtype=cp.float32).astype(BY_NAME[dtype].storage)
                call = lambda: attention_backward(dout, q, k, v, out, lse, variant=name)  # noqa: E731
            elif spec.features.get("fp8"):
                from ..features.fp8 import quantize_qkv
                (qd, qs), (kd, ks), (vd, vs) = quantize_qkv(q, k, v)
                call = lambda: attention(qd, kd, vd, q_scale=qs, k_scale=ks, v_scale=vs, variant=name,  # noqa: E731
                                         out_dtype=dtype)
            else:
                call = lambda: attention(q, k, v, variant=name)  # noqa: E731
            for _ in range(repeats):
                call()
            cp.cuda.runtime.deviceSynchronize()
            loaded = build.loaded_from(path)
            if not loaded:
                raise FlashkitError(f"the timeline build of {variant!r} was not loaded")
            return summarize(read_stamps(loaded[-1]), phases=BWD_PHASES if backward else PHASES)
        finally:
            if old is None:
                os.environ.pop("FLASHKIT_KERNEL_PATH", None)
            else:
                os.environ["FLASHKIT_KERNEL_PATH"] = old
