"""The verification harness: every variant against the float64 reference under DESIGN.md's rule.

The harness knows no feature family: each family module registers its checks (register_family), and
checks_for hands a variant to the family its manifest requires, or to the dense family.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from ..call.dtypes import BY_NAME
from ..errors import FlashkitError
from ..registry import discover_kernels
from ..registry.manifest import KernelSpec
from ..runtime.device import cupy_module, device_info
from .reference import accumulation_atol

ERROR_FACTOR = 2.0   # the kernel may be at most twice as far from the reference as a plain implementation


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.heads}{kv}"

    def within(self, spec: KernelSpec) -> bool:
        """Whether a variant serves the shape under its manifest's limits (a decode kernel: short queries)."""
        from ..registry.select import Request, limit_reasons
        req = Request(dtype=spec.dtypes[0], head_dim=64, seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k,
                      heads=self.heads, kv_heads=self.kv_heads, batch=self.batch)
        return not limit_reasons(spec, req)


# The shape matrix: batch 1 and >1; seqlens 1, 17, 127, 128, 1000, 4097; seqlen_q != seqlen_k both ways;
# one and many heads; GQA 8:1 and MQA.
SHAPES = (
    Shape(1, 1, 1, 1, 1), Shape(2, 17, 17, 4, 4), Shape(1, 127, 127, 2, 2), Shape(3, 128, 128, 8, 1),
    Shape(1, 1000, 1000, 16, 2), Shape(1, 4097, 4097, 2, 2), Shape(2, 127, 1000, 4, 4),
    Shape(2, 1000, 127, 8, 8), Shape(1, 17, 4097, 8, 1), Shape(1, 300, 1, 2, 1),
)
QUICK_SHAPES = SHAPES[:4] + (Shape(2, 127, 1000, 4, 4), Shape(2, 1000, 127, 8, 8))


@dataclass
class CheckResult:
    variant: str
    label: str
    max_error: float
    bound: float
    lse_error: float | None
    lse_bound: float | None
    passed: bool
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    """One verification: a label and a function of the seed that returns its result."""

    variant: str
    label: str
    run: Callable[[int], CheckResult]


def max_abs(x) -> float:
    """max |x| as a float; 0 for an empty array (a call with no rows has nothing to get wrong)."""
    return float(abs(x).max()) if x.size else 0.0


def judge(variant: str, label: str, out, ref, plain, atol: float, lse=None, lse_ref=None, lse_plain=None,
          note: str = "", head_dim: int = 1) -> CheckResult:
    """Apply the rule: max|out-ref| <= 2 max|plain-ref| + atol, no NaN/Inf (every element written).

    The LSE's atol is fp32's rounding of a head_dim-long dot product at the LSE's scale.
    """
    xp = cupy_module()
    out64 = out.astype(xp.float64)
    finite = bool(xp.isfinite(out64).all())
    err = max_abs(out64 - ref) if finite else float("nan")
    bound = ERROR_FACTOR * max_abs(plain.astype(xp.float64) - ref) + atol
    passed = finite and err <= bound
    lse_err = lse_bound = None
    if lse is not None:
        lse64 = lse.astype(xp.float64)
        same_inf = bool(((lse64 == -xp.inf) == (lse_ref == -xp.inf)).all()) and not bool(xp.isnan(lse64).any())
        fin = xp.isfinite(lse_ref)
        lse_err = max_abs(xp.where(fin, lse64 - lse_ref, 0)) if same_inf else float("nan")
        lse_atol = 4 * BY_NAME["float32"].eps * max(1.0, max_abs(xp.where(fin, lse_ref, 0)))
        lse_atol += accumulation_atol(lse_ref, head_dim)
        lse_bound = ERROR_FACTOR * max_abs(xp.where(fin, lse_plain - lse_ref, 0)) + lse_atol
        passed = passed and same_inf and lse_err <= lse_bound
        if not same_inf:
            note = (note + " lse NaN or -inf mismatch").strip()
    if not finite:
        note = (note + " output has NaN/Inf or unwritten elements").strip()
    return CheckResult(variant, label, err, bound, lse_err, lse_bound, passed, note)


def random_qkv(shape: Shape, head_dim: int, dtype: str, seed: int, head_dim_v: int | None = None):
    """Fresh N(0, 1) inputs in the given dtype (never zeros); v of head_dim_v columns where given."""
    xp = cupy_module()
    rng = xp.random.default_rng(seed)
    storage = BY_NAME[dtype].storage
    q = rng.standard_normal((shape.batch, shape.seqlen_q, shape.heads, head_dim), dtype=xp.float32)
    k = rng.standard_normal((shape.batch, shape.seqlen_k, shape.kv_heads, head_dim), dtype=xp.float32)
    v = rng.standard_normal((shape.batch, shape.seqlen_k, shape.kv_heads, head_dim_v or head_dim), dtype=xp.float32)
    return q.astype(storage), k.astype(storage), v.astype(storage)


def head_dims_label(head_dim: int, head_dim_v: int | None = None) -> str:
    """'d128', or 'd192/v128' where v's head dim differs."""
    return f"d{head_dim}" + (f"/v{head_dim_v}" if head_dim_v not in (None, head_dim) else "")


# (spec, dtypes, head_dims, causal options, quick) -> the family's checks of one variant
FamilyChecks = Callable[[KernelSpec, list, list, tuple, bool], list[Check]]
DENSE = "dense"
_FAMILIES: dict[str, FamilyChecks] = {}
_EXTENSIONS: dict[str, FamilyChecks] = {}   # checks added to a variant's family's (e.g. modifications)


_BY_SUPPORT: set[str] = set()   # families that take every variant supporting their feature (kv_cache)


def register_family(feature: str, checks: FamilyChecks, by_support: bool = False) -> None:
    """Verify variants whose manifest requires `feature` (by_support: declares it) with `checks` (DENSE: the rest)."""
    _FAMILIES[feature] = checks
    if by_support:
        _BY_SUPPORT.add(feature)


def register_extension(name: str, checks: FamilyChecks) -> None:
    """Add `checks` to every variant's family checks; the function returns [] for variants it does not cover."""
    _EXTENSIONS[name] = checks


def family_of(spec: KernelSpec) -> str:
    """The registered family that verifies a variant: the first one its manifest requires, else dense."""
    return next((f for f in _FAMILIES if f != DENSE and (spec.requires.get(f) or (f in _BY_SUPPORT
                                                                              and spec.supports(f)))), DENSE)


def checks_for(spec: KernelSpec, dtypes: Iterable[str] | None = None, head_dims: Iterable[int] | None = None,
               causal: Iterable[bool] | None = None, quick: bool = False) -> list[Check]:
    """The checks that verify a variant: the dense shape matrix, or the variant family's own set."""
    dtypes = [d for d in (dtypes or spec.dtypes) if d in spec.dtypes]
    head_dims = [d for d in (head_dims or spec.head_dims.examples()) if d in spec.head_dims]
    causal_opts = spec.causal_options(tuple(causal) if causal is not None else (False, True))
    out = family_checks(spec, dtypes, head_dims, causal_opts, quick)
    for extension in _EXTENSIONS.values():
        out += extension(spec, dtypes, head_dims, causal_opts, quick)
    return out


def runnable_variants(names: Iterable[str] | None = None) -> tuple[list[KernelSpec], dict[str, str]]:
    """The variants to verify on this device, and why each other one is skipped."""
    catalogue = discover_kernels()
    cc = device_info().cc
    chosen, skipped = [], {}
    for name in names or sorted(catalogue.specs):
        spec = catalogue.get(name)
        if not spec.runs_on(cc):
            skipped[name] = f"needs compute capability {spec.arch_requirement()}"
        else:
            chosen.append(spec)
    return chosen, skipped


def check_seed(seed: int, i: int) -> int:
    """The seed run_checks gives check i of a run seeded `seed` (a test that reruns one check gets its data)."""
    return seed * 100003 + i


def run_checks(checks: list[Check], seed: int = 0, progress: Callable[[CheckResult], None] | None = None,
               ) -> list[CheckResult]:
    """Run each check with its own fresh seed; a crash is a failed check, not a crashed harness."""
    results = []
    for i, check in enumerate(checks):
        try:
            res = check.run(check_seed(seed, i))
        except FlashkitError as e:
            res = CheckResult(check.variant, check.label, float("nan"), float("nan"), None, None, False,
                              f"{type(e).__name__}: {e}")
        results.append(res)
        if progress:
            progress(res)
    return results


def family_checks(spec: KernelSpec, dtypes: list, head_dims: list, causal_opts: tuple, quick: bool) -> list[Check]:
    """The checks of the variant's family alone (checks_for without the extensions)."""
    return _FAMILIES[family_of(spec)](spec, dtypes, head_dims, causal_opts, quick)
