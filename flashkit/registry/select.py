"""Match a request against every spec; record every reason each one was rejected."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError, UnsupportedError
from ..runtime.tma import binding_missing
from .manifest import FEATURES, KernelSpec


@dataclass(frozen=True)
class Request:
    """What a call needs from a kernel; cc is None where no device is known."""

    dtype: str
    head_dim: int
    seqlen_q: int = 1
    seqlen_k: int = 1
    heads: int = 1
    kv_heads: int = 1
    batch: int = 1
    causal: bool = False
    block_sparse: bool = False
    fp8: bool = False
    backward: bool = False
    lse: bool = False
    cc: tuple[int, int] | None = None
    window: bool = False     # window_size or attention_chunk (a local mask)
    chunk: bool = False      # attention_chunk
    softcap: bool = False
    alibi: bool = False
    kv_cache: bool = False   # attention_with_kvcache: per-sequence lengths, a paged cache
    varlen: bool = False     # attention_varlen: packed sequences of different lengths (cu_seqlens)
    score_mod: bool = False  # a drop-in functor's score_mod / mask_mod (attention(..., mod=...))
    mask_mod: bool = False
    head_dim_v: int | None = None   # v's and the output's head dim; None (head_dim given too: stored as None): head_dim

    def __post_init__(self):
        if self.head_dim_v == self.head_dim:   # one spelling of "v's head dim is q's": equal requests compare equal
            object.__setattr__(self, "head_dim_v", None)

    @property
    def build_mods(self) -> tuple[str, ...]:
        """The modifications a build of this call carries (BuildConfig.mods; they key the manifest's overrides)."""
        return tuple(f for f in ("window", "softcap", "alibi", "varlen", "score_mod", "mask_mod") if getattr(self, f))

    @property
    def split_head_dim(self) -> bool:
        """v's head dim differs from q's and k's (the manifest feature head_dim_v)."""
        return self.head_dim_v not in (None, self.head_dim)

    def summary(self) -> str:
        flags = [f for f in ("causal", "block_sparse", "fp8", "backward", "lse", "window", "chunk", "softcap", "alibi",
                             "varlen", "score_mod", "mask_mod")
                 if getattr(self, f)]
        arch = f"sm_{self.cc[0]}{self.cc[1]}" if self.cc else "no device"
        gqa = f" kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        dv = f" head_dim_v={self.head_dim_v}" if self.split_head_dim else ""
        return (f"dtype={self.dtype} head_dim={self.head_dim}{dv} batch={self.batch} heads={self.heads}{gqa} "
                f"seqlen_q={self.seqlen_q} seqlen_k={self.seqlen_k}"
                + (" " + " ".join(flags) if flags else "") + f" on {arch}")


FEATURE_WORDS = {
    "causal": "causal masks", "block_sparse": "block masks", "fp8": "fp8 inputs",
    "backward": "the backward pass", "lse": "return_lse", "gqa": "GQA/MQA (kv_heads < heads)",
    "window": "local attention (window_size, attention_chunk)", "chunk": "attention_chunk",
    "softcap": "softcap", "alibi": "ALiBi slopes",
    "kv_cache": "KV caches (cache_seqlens, block_table)",
    "varlen": "variable-length batches (cu_seqlens)",
    "score_mod": "drop-in score_mod functors", "mask_mod": "drop-in mask_mod functors",
    "head_dim_v": "head_dim_v != head_dim (v's head dim differing from q's and k's)",
}


def asked_features(req: Request) -> dict[str, bool]:
    """Every manifest feature (FEATURES), on or off in this request."""
    derived = {"gqa": req.kv_heads != req.heads, "head_dim_v": req.split_head_dim}
    return {f: derived[f] if f in derived else getattr(req, f) for f in FEATURES}


def reasons(spec: KernelSpec, req: Request) -> list[str]:
    """Every reason spec cannot serve req, each with exact bounds; empty when it fits."""
    out = []
    if req.cc is not None and req.cc < spec.arch_min:
        out.append(f"needs compute capability >= {spec.arch_min[0]}.{spec.arch_min[1]}; "
                   f"device has {req.cc[0]}.{req.cc[1]}")
    if req.cc is not None and spec.arch_max is not None and req.cc > spec.arch_max:
        out.append(f"needs compute capability <= {spec.arch_max[0]}.{spec.arch_max[1]} (architecture-specific "
                   f"instructions); device has {req.cc[0]}.{req.cc[1]}")
    if req.dtype not in spec.dtypes:
        out.append(f"dtype={req.dtype} not supported: supported {', '.join(spec.dtypes)}")
    if req.head_dim not in spec.head_dims:
        out.append(f"head_dim={req.head_dim} not supported: supported {spec.head_dims.describe()}")
    elif not spec.head_dims.on_arch(req.head_dim, req.cc):
        out.append(f"head_dim={req.head_dim} not supported on sm_{req.cc[0]}{req.cc[1]}: up to "
                   f"{spec.head_dims.max_on(req.cc)} there (an SM's shared memory)")
    asked = asked_features(req)
    for feat, wanted in asked.items():
        if wanted and not spec.supports(feat):
            out.append(f"{FEATURE_WORDS[feat]} not supported")
    if asked["head_dim_v"] and spec.supports("head_dim_v"):
        out += head_dim_v_reasons(spec, req)
    if spec.supports("backward") and not req.backward and "backward" not in spec.requires:
        out.append("a backward kernel: serves attention_backward only")
    out += limit_reasons(spec, req)
    if spec.tensor_maps and (missing := binding_missing()):
        out.append(missing)
    for feat, needed in spec.requires.items():
        if asked[feat] != needed:
            state = "with" if needed else "without"
            out.append(f"only runs {state} {FEATURE_WORDS[feat]} ({feat}={needed})")
    return out


def head_dim_v_reasons(spec: KernelSpec, req: Request) -> list[str]:
    """A variant declaring head_dim_v takes v head dims among its head dims, at most head_dim (O is staged where Q
    was; include/flashkit/traits.cuh)."""
    dv, d = req.head_dim_v, req.head_dim
    if dv in spec.head_dims and dv <= d:
        return []
    return [f"head_dim_v={dv} not supported with head_dim={d}: supported head_dim_v <= head_dim, "
            f"{spec.head_dims.describe()}"]


def check_head_dim_v(head_dim: int, head_dim_v: int, specs: dict[str, KernelSpec], backward: bool = False) -> None:
    """InputError (before any device is asked) when no variant takes v of head_dim_v under q / k of head_dim (of the
    forward variants, or of the backward ones)."""
    if head_dim_v == head_dim:
        return
    takers = [s for _, s in sorted(specs.items())
              if s.supports("head_dim_v") and s.supports("backward") == backward]
    if any(head_dim in s.head_dims and not head_dim_v_reasons(s, Request(s.dtypes[0], head_dim, head_dim_v=head_dim_v))
           for s in takers):
        return
    rule = "; ".join(f"{s.name} takes head_dim_v <= head_dim, {s.head_dims.describe()}" for s in takers)
    raise InputError(f"v: head_dim_v={head_dim_v} (v's last dim) with head_dim={head_dim} is not supported by any "
                     f"kernel ({rule or 'no variant declares head_dim_v'})")


def limit_reasons(spec: KernelSpec, req: Request) -> list[str]:
    """The manifest's `limits`, exact bounds; a KV-cache call (which only such kernels serve) ignores them."""
    if req.kv_cache:
        return []
    values = {"seqlen_q": req.seqlen_q, "packed_rows": req.seqlen_q * (req.heads // max(req.kv_heads, 1))}
    words = {"seqlen_q": "seqlen_q", "packed_rows": "seqlen_q * heads / kv_heads"}
    return [f"{words[k]}={values[k]} above {limit}: serves {words[k]} <= {limit} (longer queries run faster on "
            "the prefill kernels)" for k, limit in spec.limits.items() if values[k] > limit]


@dataclass
class Selection:
    """The chosen spec (or None) and why every other candidate was rejected."""

    request: Request
    chosen: KernelSpec | None
    rejected: dict[str, list[str]] = field(default_factory=dict)
    outranked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # how the chosen kernel runs the call (e.g. its split count)
    warning: str | None = None   # set when an unforced call falls back to the baseline (fallback_warning)

    def report(self) -> str:
        lines = [f"request: {self.request.summary()}"]
        if self.chosen:
            lines.append(f"selected: {self.chosen.name} (priority {self.chosen.priority})")
            lines += [f"  {note}" for note in self.notes]
            if self.warning:
                lines.append(f"  warning: {self.warning}")
        for name in self.outranked:
            lines.append(f"  {name}: fits, lower priority")
        for name, why in self.rejected.items():
            lines.append(f"  {name}: " + "; ".join(why))
        return "\n".join(lines)


def select_kernel(req: Request, specs: dict[str, KernelSpec], variant: str | None = None) -> Selection:
    """Highest-priority spec with no reasons, or the forced variant; UnsupportedError when none fits."""
    if variant is not None and variant not in specs:
        raise UnsupportedError(f"variant={variant!r} is not a known variant; known: {', '.join(sorted(specs))}")
    rejected = {name: why for name, spec in specs.items() if (why := reasons(spec, req))}
    fitting = sorted((s for n, s in specs.items() if n not in rejected), key=lambda s: (-s.priority, s.name))
    if variant is not None:
        if variant in rejected:
            raise UnsupportedError(f"variant {variant!r} cannot run {req.summary()}: "
                                   + "; ".join(rejected[variant]), {variant: rejected[variant]})
        chosen = specs[variant]
    elif fitting:
        chosen = fitting[0]
    else:
        detail = " | ".join(f"{n}: {'; '.join(w)}" for n, w in rejected.items())
        raise UnsupportedError(f"no kernel supports {req.summary()} -- {detail}"
                               + _hint(req), rejected)
    sel = Selection(req, chosen, rejected, [s.name for s in fitting if s is not chosen])
    if variant is None:
        sel.warning = fallback_warning(chosen, specs, rejected, req)
    return sel


# Priority of the baseline kernels (`standard`): selected only when no flash kernel fits.
BASELINE_PRIORITY = 0


def fallback_warning(chosen: KernelSpec, specs: dict[str, KernelSpec], rejected: dict[str, list[str]],
                     req: Request) -> str | None:
    """Why a call fell back to a baseline kernel although faster kernels take its dtype (None: it did not, or no
    faster kernel takes the dtype, as for float32): the reasons of each faster kernel of this kind of call (forward
    or backward, its `requires` met) that runs on the device, or the architecture they need."""
    if chosen.priority > BASELINE_PRIORITY:
        return None
    faster = {n: s for n, s in sorted(specs.items()) if n in rejected and s.priority > BASELINE_PRIORITY
              and req.dtype in s.dtypes and serves_kind(s, req)}
    if not faster:
        return None
    head = f"{req.summary()} runs on the baseline kernel {chosen.name!r} (unfused, O(seqlen^2) memory)"
    runnable = [n for n, s in faster.items() if req.cc is None or s.runs_on(req.cc)]
    if not runnable:
        need = min(s.arch_min for s in faster.values())
        return f"{head}: the faster kernels need compute capability >= {need[0]}.{need[1]}"
    return f"{head}: no faster kernel fits -- " + " | ".join(f"{n}: {'; '.join(rejected[n])}" for n in runnable)


def serves_kind(spec: KernelSpec, req: Request) -> bool:
    """Whether a spec serves this kind of call at all: forward or backward as asked, its `requires` met."""
    asked = asked_features(req)
    return spec.supports("backward") == req.backward and all(asked[f] == v for f, v in spec.requires.items())


def _hint(req: Request) -> str:
    if req.cc is not None and req.cc < (8, 0):
        return " (hint: the flash variants need an Ampere or newer GPU)"
    if req.dtype == "float32":
        return " (hint: the flash variants take float16 or bfloat16; cast the inputs)"
    return ""
