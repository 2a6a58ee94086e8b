"""fa3, the warp-specialized Hopper forward: lengths at every tile boundary +- 1 (short calls' tiles and, past the
manifest's length bound, long causal calls'), strided views read in place through TMA, and the tensor-map cache. Skips off compute capability 9.0."""

from __future__ import annotations

import pytest

from flashkit.registry import discover_kernels
from flashkit.verify import Shape
from flashkit.verify.dense import dense_check
from flashkit.verify.mods import ModCase, mod_check

from .gpu_checks import boundary_lengths

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fa3():
    from flashkit.runtime.device import device_info
    spec = discover_kernels().get("fa3")
    cc = device_info().cc
    if not spec.runs_on(cc):
        pytest.skip(f"fa3 needs compute capability {spec.arch_requirement()}; this device has {cc[0]}.{cc[1]}")
    return spec


SHORT = 1024   # the tile boundary tests' calls are at most this long (their tiles: launch_config's for this length)


@pytest.mark.parametrize("head_dim", [64, 96])
def test_long_causal_tile_boundaries(fa3, head_dim):
    """Causal calls above a short-call bound of the manifest run the three-consumer tiles (hd64 192 x 128, hd96 192 x
    112; persistent up to 4096 rows at hd64 and 8192 at hd96, one tile a CTA above): lengths at a multiple of both
    tiles +- 1 past each bound where a causal call's tiles change, both ways, GQA."""
    from flashkit.runtime.device import device_info
    cc = device_info().cc
    tiles = lambda n: fa3.launch_config(cc, head_dim, causal=True, seqlen_q=n)   # noqa: E731
    bounds = [b for b in fa3.length_bounds(head_dim) if tiles(b + 1)["block_m"] == 192 and tiles(b + 1) != tiles(b)]
    assert bounds, "no short-call bound below the three-consumer tiles"
    failures = []
    for bound in bounds:
        cfg = tiles(bound + 1)
        base_q = -(-(bound + 1) // cfg["block_m"]) * cfg["block_m"]
        base_k = -(-(bound + 1) // cfg["block_n"]) * cfg["block_n"]
        for i, (dq, dk) in enumerate(((-1, 1), (0, 0), (1, -1))):
            for shape in (Shape(1, base_q + dq, base_k + dk, 4, 2), Shape(1, base_k + dk, base_q + dq, 2, 1)):
                if shape.seqlen_q <= bound:
                    continue
                checks = [dense_check(fa3, shape, head_dim, "bfloat16", True)]
                if (dq, dk) == (0, 0):   # a score modification on these tiles too (softcap keeps them: fa3.cu)
                    checks.append(mod_check(fa3, shape, head_dim, "bfloat16",
                                            ModCase("causal softcap", True, softcap=1.5)))
                for check in checks:
                    result = check.run(3000 + i)
                    if not result.passed:
                        failures.append(f"{result.label}: error {result.max_error:.3g} > {result.bound:.3g} "
                                        f"{result.note}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_boundaries(fa3, head_dim, causal):
    """seqlen_q and seqlen_k at every multiple of block_m / block_n (and 2x) +- 1, both ways (the tiles of these
    short calls: hd96 runs 192 x 112 without causal, 128 x 128 with it)."""
    from flashkit.runtime.device import device_info
    cfg = fa3.launch_config(device_info().cc, head_dim, causal=causal, seqlen_q=SHORT)
    lengths_q, lengths_k = boundary_lengths(cfg["block_m"]), boundary_lengths(cfg["block_n"])
    assert max(lengths_q + lengths_k) <= SHORT
    failures = []
    for i, (sq, sk) in enumerate(zip(lengths_q, lengths_k[::-1])):
        for shape in (Shape(2, sq, sk, 4, 2), Shape(1, sk, sq, 2, 1)):
            result = dense_check(fa3, shape, head_dim, "bfloat16", causal).run(1000 + i)
            if not result.passed:
                failures.append(f"{result.label}: error {result.max_error:.3g} > {result.bound:.3g} {result.note}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def few_sms(monkeypatch):
    """The persistent grid sized for an SM count of n (set(n)): a few CTAs walk many tiles each, odd and even
    rounds of the snake order, on shapes small enough to check against the float64 reference."""
    from dataclasses import replace

    from flashkit.runtime import call_cache, launch
    real = launch.device_info()

    def set_sms(n: int) -> None:
        call_cache.CALLS.clear()   # a cached launch keeps the grid it was prepared with
        monkeypatch.setattr(launch, "device_info", lambda: replace(real, sm_count=n))
        # Persistent whatever the balance (tile_balance.py would give some of these causal shapes one CTA a tile).
        monkeypatch.setattr(launch, "persistent_balances", lambda *args, **kwargs: True)
    yield set_sms
    call_cache.CALLS.clear()


@pytest.mark.parametrize("sms", [1, 3, 7])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192])
def test_persistent_tiles_on_few_ctas(fa3, few_sms, sms, head_dim):
    """Each CTA handles many tiles: Q reloaded under the previous tile's epilogue, the K/V rings' phases carried
    across tiles, causal tiles of every weight (and, with seqlen_k < seqlen_q, tiles that see no key), GQA."""
    from flashkit.runtime.device import device_info
    persistent = [c for c in (False, True)
                  if fa3.launch_config(device_info().cc, head_dim, causal=c, seqlen_q=SHORT).get("persistent")]
    assert persistent, f"hd{head_dim} is expected to run persistent (short causal calls at least)"
    few_sms(sms)
    failures = []
    shapes = (Shape(3, 517, 517, 4, 2), Shape(2, 700, 129, 3, 1), Shape(1, 130, 1000, 6, 3), Shape(5, 64, 64, 2, 2))
    for i, shape in enumerate(shapes):
        for causal in persistent:
            result = dense_check(fa3, shape, head_dim, "bfloat16", causal).run(2000 + 17 * sms + i)
            if not result.passed:
                failures.append(f"{sms} SMs {result.label}: error {result.max_error:.3g} > {result.bound:.3g} "
                                f"{result.note}")
    assert not failures, "\n".join(failures)


def test_persistent_varlen_on_few_ctas(fa3, few_sms):
    """Varlen through the persistent grid: tiles past a sequence's end are skipped by every role alike."""
    from itertools import accumulate

    import cupy as cp
    import ml_dtypes
    from flashkit import attention, attention_varlen
    few_sms(5)
    lengths = [0, 1, 300, 129, 17, 640, 128, 2]
    cu = cp.asarray([0, *accumulate(lengths)], dtype=cp.int32)
    rng = cp.random.default_rng(11)
    total = int(cu[-1])
    q, k, v = (rng.standard_normal((total, 4, 128), dtype=cp.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
    for causal in (False, True):
        out = attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, variant="fa3")
        for b, n in enumerate(lengths):
            if n == 0:
                continue
            s = slice(int(cu[b]), int(cu[b + 1]))
            want = attention(q[None, s], k[None, s], v[None, s], causal=causal, variant="fa3")[0]
            assert cp.array_equal(out[s].view(cp.uint16), want.view(cp.uint16)), f"sequence {b} causal={causal}"


@pytest.mark.parametrize("d,dv", [(80, 80), (200, 136), (40, 8), (160, 160)])
def test_padded_head_dims_store_only_their_columns(fa3, d, dv):
    """fa3 below its head-dim class (80 runs at 96, 200 / 136 at 256 / 192, ...): TMA's out-of-bounds fill gives the
    class's extra columns and its clipped store leaves them unwritten. out is a column slice of a NaN-filled wider
    buffer, through attention_varlen, whose sequences end inside a tile (those rows stored by the threads, not TMA):
    the columns past head_dim_v stay NaN, and each sequence matches fa3 on it alone."""
    from itertools import accumulate

    import cupy as cp
    import ml_dtypes
    from flashkit import attention, attention_varlen
    lengths = [1, 300, 129, 17, 70]
    cu = cp.asarray([0, *accumulate(lengths)], dtype=cp.int32)
    total = int(cu[-1])
    rng = cp.random.default_rng(d + dv)
    draw = lambda *shape: rng.standard_normal(shape, dtype=cp.float32).astype(ml_dtypes.bfloat16)  # noqa: E731
    q, k, v = draw(total, 4, d), draw(total, 2, d), draw(total, 2, dv)
    width = dv + 24
    for causal in (False, True):
        out_buf = cp.full((total, 4, width), cp.nan, dtype=cp.float32).astype(ml_dtypes.bfloat16)
        out = attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, variant="fa3",
                               out=out_buf[..., :dv])
        assert bool(cp.isnan(out_buf[..., dv:].astype(cp.float32)).all()), f"columns past {dv} written"
        for b, n in enumerate(lengths):
            s = slice(int(cu[b]), int(cu[b + 1]))
            want = attention(q[None, s], k[None, s], v[None, s], causal=causal, variant="fa3")[0]
            err = float(cp.abs(out[s].astype(cp.float32) - want.astype(cp.float32)).max())
            assert err < 2e-2, f"sequence {b} causal={causal}: {err}"


def test_strided_views_read_in_place(fa3):
    """q, k, v sliced out of one packed (batch, seqlen, 3, heads, D) tensor: TMA reads them as they are."""
    import cupy as cp
    import ml_dtypes
    from flashkit import attention
    rng = cp.random.default_rng(7)
    qkv = rng.standard_normal((2, 333, 3, 4, 128), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    out = attention(q, k, v, causal=True, variant="fa3")
    want = attention(cp.ascontiguousarray(q), cp.ascontiguousarray(k), cp.ascontiguousarray(v), causal=True,
                     variant="fa3")
    assert cp.array_equal(out.view(cp.uint16), want.view(cp.uint16))


def test_repeated_calls_encode_nothing(fa3):
    """The second call with the same arrays encodes no tensor map (the prepared launch remembers the four maps of
    these addresses, so the encoder's own cache is not even asked); new addresses encode anew."""
    import cupy as cp
    import ml_dtypes
    from flashkit import attention
    from flashkit.runtime.tma import encode
    rng = cp.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 256, 2, 64), dtype=cp.float32).astype(ml_dtypes.bfloat16) for _ in range(3))
    out = cp.empty_like(q)
    attention(q, k, v, out=out, variant="fa3")
    before = encode.cache_info()
    attention(q, k, v, out=out, variant="fa3")
    after = encode.cache_info()
    assert after.misses == before.misses
    attention(q, k, v, out=cp.empty_like(q), variant="fa3")   # a new output address: its map is encoded
    assert encode.cache_info().misses == after.misses + 1
