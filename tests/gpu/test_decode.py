"""The split-KV decode variant on a GPU: the decode matrix (DESIGN's rule against the float64 reference),
paged caches with shuffled block tables, the k_new / v_new append, automatic selection and the split plan."""

from __future__ import annotations

import pytest

import flashkit
from flashkit.registry import discover_kernels
from flashkit.verify.decode import CASES, MOD_CASES, QUICK_CASES, DecodeCase, decode_check, decode_checks

pytestmark = pytest.mark.gpu

SPEC = discover_kernels().get("decode")
QUICK = decode_checks(SPEC, SPEC.dtypes, [64, 128], (False, True), quick=True)
# The full decode matrix on bf16 / hd128 (every seqlen_k, both seqlen_q, every group and page size).
FULL = [decode_check(SPEC, c, 128, "bfloat16", causal) for c in CASES if c not in QUICK_CASES
        for causal in (False, True)]
# Every other head-dim class and a head dim padded below each (the manifest's examples: 8, 32, 40, ..., 200, 256), on
# the quick cases in bf16 (the dtypes share every line of the kernel but the mma's type).
CLASSES = decode_checks(SPEC, ("bfloat16",), [d for d in SPEC.head_dims.examples() if d not in (64, 128)],
                        (False, True), quick=True)


def _run(check, seed=0):
    res = check.run(seed)
    assert res.passed, f"{res.label}: err {res.max_error:.3g} > bound {res.bound:.3g}; lse err {res.lse_error} " \
                       f"> {res.lse_bound}; {res.note}"


@pytest.mark.parametrize("check", QUICK, ids=[c.label for c in QUICK])
def test_quick_matrix(check):
    _run(check)


@pytest.mark.parametrize("check", FULL, ids=[c.label for c in FULL])
def test_full_matrix_bf16_hd128(check):
    _run(check, seed=1)


# window_size and softcap (Mistral's and Gemma 2's serving calls) at hd64, hd128, hd256 and hd80 (padded), both dtypes.
MODS = [decode_check(SPEC, c, d, t, causal) for c in MOD_CASES for d in (64, 128, 256, 80)
        for t in ("float16", "bfloat16") for causal in (False, True)]


@pytest.mark.parametrize("check", MODS, ids=[c.label for c in MODS])
def test_window_and_softcap(check):
    _run(check, seed=3)


@pytest.mark.parametrize("check", CLASSES, ids=[c.label for c in CLASSES])
def test_head_dim_classes(check):
    _run(check, seed=2)


EDGES = [(DecodeCase(1, 1, 131072, 8, 1), 128)] + [(c, d) for c in (DecodeCase(1, 1, 40000, 8, 1),
                                                                  DecodeCase(2, 16, 5000, 4, 1),
                                                                  DecodeCase(1, 3, 2, 16, 2)) for d in (128, 256, 40)]


@pytest.fixture(autouse=True)
def _release_the_pool():
    """The float64 references of long caches take gigabytes: hand them back after each test, so that the GPU tier's
    parallel processes keep to their share of the memory."""
    yield
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("case, head_dim", EDGES, ids=[f"{c.label()} d{d}" for c, d in EDGES])
def test_edge_shapes(case, head_dim):
    """Many splits (128k and 40k keys), 16 query rows of MQA in four row blocks, fewer keys than query rows; at hd128,
    at hd256 (Q read from shared memory at each k-step, two-stage rings) and at hd40 (padded: zero-filled columns)."""
    for causal in (False, True):
        _run(decode_check(SPEC, case, head_dim, "float16", causal))


def test_decode_is_selected_for_decode_shapes():
    sel = flashkit.explain(seqlen_q=1, seqlen_k=8192, heads=32, kv_heads=4, batch=8)
    assert sel.chosen.name == "decode" and any("split" in n for n in sel.notes)
    assert flashkit.explain(seqlen_q=512, seqlen_k=8192, heads=32, kv_heads=4).chosen.name != "decode"


def test_cache_seqlens_beyond_capacity_raise_before_launch():
    import cupy
    q = cupy.zeros((2, 1, 4, 64), dtype=cupy.float16)
    kc = cupy.zeros((2, 32, 4, 64), dtype=cupy.float16)
    with pytest.raises(flashkit.InputError, match="cache_seqlens"):
        flashkit.attention_with_kvcache(q, kc, kc, cache_seqlens=cupy.array([3, 33], dtype=cupy.int32))
    table = cupy.array([[0, 1], [2, 9]], dtype=cupy.int32)
    pages = cupy.zeros((4, 16, 4, 64), dtype=cupy.float16)
    with pytest.raises(flashkit.InputError, match=r"block_table: entry \[1, 1\]"):
        flashkit.attention_with_kvcache(q, pages, pages, cache_seqlens=cupy.array([20, 20], dtype=cupy.int32),
                                        block_table=table)
