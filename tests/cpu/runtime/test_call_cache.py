"""runtime/call_cache.py: a repeated call's signature skips validation and selection, and only a call that
validated is ever cached; every metadata difference that changes selection or launch changes the key.

No GPU: CuPy arrays over fake device addresses, a fake H100, and kernels that record their launches.
"""

from __future__ import annotations

import numpy as np
import pytest

import flashkit
import flashkit.api as api
import flashkit.kvcache as kvcache
from flashkit.errors import InputError
from flashkit.registry import discover_kernels
from flashkit.runtime import build, call_cache
from flashkit.runtime.call_cache import CallCache
from flashkit.runtime.params import PARAMS_DTYPE, ParamTemplate, make_params, pointer_runs

cupy = pytest.importorskip("cupy")

from .fake_device import BF16, Recorder, counting, fake, installed  # noqa: E402  (needs CuPy)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A fake H100 under the whole path (tests/cpu/runtime/fake_device.py)."""
    with installed(monkeypatch.setattr):
        yield


@pytest.fixture
def counted(monkeypatch):
    """How often validation and selection ran."""
    counts = {"validate": 0, "select": 0}
    monkeypatch.setattr(api, "validate_inputs", counting(counts, "validate", api.validate_inputs))
    monkeypatch.setattr(api, "select_kernel", counting(counts, "select", api.select_kernel))
    monkeypatch.setattr(kvcache, "validate_kvcache", counting(counts, "validate", kvcache.validate_kvcache))
    monkeypatch.setattr(kvcache, "select_kernel", counting(counts, "select", kvcache.select_kernel))
    return counts


def qkv(shape=(1, 128, 2, 64), kv_shape=None, dtype=BF16):
    kv_shape = kv_shape or shape
    return fake(shape, dtype), fake(kv_shape, dtype), fake(kv_shape, dtype)


def key_of(q, k, v, out=None, **kw):
    args = dict(causal=False, softmax_scale=None, variant=None, return_lse=False, block_mask=None, out_dtype=None,
                window_size=None, softcap=0.0, attention_chunk=0)
    args.update(kw)
    return api._forward_key(q, k, v, out, **args)


# ---- the key -------------------------------------------------------------------------------------

def test_key_distinguishes_every_metadata_difference(fake_gpu):
    q, k, v = qkv()
    base = key_of(q, k, v)
    assert base == key_of(q, k, v) == key_of(*qkv())       # same metadata, other addresses: one signature
    padded = fake((1, 128, 2, 128))[..., :64]                # same shape, other strides
    variants = {
        "shape": key_of(*qkv((1, 129, 2, 64))),
        "kv shape": key_of(*qkv(kv_shape=(1, 128, 1, 64))),
        "dtype": key_of(*qkv(dtype=np.float16)),
        "strides": key_of(padded, k, v),
        "alignment": key_of(fake((1, 128, 2, 64), offset=2), k, v),
        "causal": key_of(q, k, v, causal=True),
        "lse": key_of(q, k, v, return_lse=True),
        "scale": key_of(q, k, v, softmax_scale=0.5),
        "scale type": key_of(q, k, v, softmax_scale=np.float32(0.125)),
        "variant": key_of(q, k, v, variant="fa2"),
        "window": key_of(q, k, v, window_size=(4, 0)),
        "softcap": key_of(q, k, v, softcap=30.0),
        "chunk": key_of(q, k, v, attention_chunk=64),
        "out": key_of(q, k, v, out=fake((1, 128, 2, 64))),
        "out_dtype": key_of(q, k, v, out_dtype="bfloat16"),
        "block mask": key_of(q, k, v, block_mask=object()),
    }
    keys = [base] + list(variants.values())
    assert len(set(keys)) == len(keys), [n for n, kk in variants.items() if kk == base]
    m1, m2 = object(), object()
    assert key_of(q, k, v, block_mask=m1) != key_of(q, k, v, block_mask=m2)
    assert key_of(q, k, v, softmax_scale=1) != key_of(q, k, v, softmax_scale=1.0) != key_of(q, k, v, softmax_scale=True)
    assert key_of(q, k, v, window_size=(1, 0)) != key_of(q, k, v, window_size=(True, 0))


def test_key_follows_the_device_and_the_kernel_path(fake_gpu, monkeypatch):
    q, k, v = qkv()
    base = key_of(q, k, v)
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", "/somewhere")
    assert key_of(q, k, v) != base
    monkeypatch.delenv("FLASHKIT_KERNEL_PATH")
    monkeypatch.setattr(call_cache, "current_device", lambda: 1)
    assert key_of(q, k, v) != base
    monkeypatch.setattr(call_cache, "current_device", lambda: None)   # no device: the full path says why
    assert key_of(q, k, v) is None


def test_only_cupy_arrays_and_hashable_arguments_have_a_key(fake_gpu, counted):
    q, k, v = qkv()
    assert key_of(np.zeros((1, 128, 2, 64)), k, v) is None
    assert key_of(q, k, v, window_size=3) is None
    assert key_of(q, k, v, out=np.zeros(3)) is None
    unhashable = key_of(q, k, v, softcap=[1.0])           # looked up and kept as nothing: always the full path
    call_cache.CALLS.put(unhashable, "entry")
    assert call_cache.CALLS.get(unhashable) is None and len(call_cache.CALLS) == 0
    for _ in range(2):
        with pytest.raises(InputError, match="softcap"):
            flashkit.attention(q, k, v, softcap=[1.0])
    assert counted["validate"] == 2


# ---- the cached path -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,kw", [((1, 128, 2, 64), {}),                       # fa3: tensor maps
                                      ((1, 1, 1, 64), {}),                         # decode: two entries
                                      ((2, 300, 4, 128), {"causal": True, "return_lse": True}),
                                      ((1, 256, 2, 64), {"window_size": (32, 0), "softcap": 20.0})])
def test_second_call_takes_the_cached_path_and_launches_the_same(fake_gpu, counted, shape, kw):
    q, k, v = qkv(shape)
    out = fake(shape)
    first = flashkit.attention(q, k, v, out=out, **kw)
    launched = list(Recorder.launches)
    assert counted == {"validate": 1, "select": 1} and launched
    Recorder.launches = []
    second = flashkit.attention(q, k, v, out=out, **kw)
    assert counted == {"validate": 1, "select": 1}                  # a dictionary look-up, no validation
    assert type(first) is type(second)
    if kw.get("return_lse"):
        assert first[0] is second[0] is out and first[1] is not second[1]
        assert first[1].shape == second[1].shape == (shape[0], shape[2], shape[1])
    # The same launches, bit for bit, but for the fresh lse and workspace pointers (words 4 and 5).
    unfresh = lambda p: p[:32] + p[48:]  # noqa: E731
    assert [(n, g, b, unfresh(p), m) for n, g, b, p, m in Recorder.launches] == \
        [(n, g, b, unfresh(p), m) for n, g, b, p, m in launched]


def test_alibi_calls_are_cached_and_put_each_calls_slopes_in(fake_gpu, counted):
    """ALiBi's slopes are keyed by their signature; a later call with other slopes of that signature takes the
    cached path and launches the block the full path builds for those slopes, bit for bit."""
    q, k, v = qkv((1, 256, 2, 64))
    out = fake(q.shape)
    slopes = [fake((2,), np.float32) for _ in range(3)]
    flashkit.attention(q, k, v, out=out, causal=True, alibi_slopes=slopes[0])
    Recorder.launches = []
    flashkit.attention(q, k, v, out=out, causal=True, alibi_slopes=slopes[1])
    assert counted == {"validate": 1, "select": 1}
    cached = list(Recorder.launches)
    call_cache.CALLS.clear()
    call_cache.CALLS.max_entries = 0     # the full path for the same slopes
    try:
        Recorder.launches = []
        flashkit.attention(q, k, v, out=out, causal=True, alibi_slopes=slopes[1])
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    unfresh = lambda p: p[:32] + p[48:]  # noqa: E731   (the lse and workspace words)
    assert [(n, g, b, unfresh(p), m) for n, g, b, p, m in cached] == \
        [(n, g, b, unfresh(p), m) for n, g, b, p, m in Recorder.launches]
    assert counted == {"validate": 2, "select": 2}
    # Another signature of slopes (batch, heads): keyed apart, validated again.
    flashkit.attention(q, k, v, out=out, causal=True, alibi_slopes=fake((1, 2), np.float32))
    assert counted == {"validate": 3, "select": 3}


def test_prequantized_fp8_calls_are_cached_and_put_each_calls_scales_in(fake_gpu, counted):
    """Pre-quantized fp8 (fa3_fp8 on the fake H100): the scales are keyed by their signature; a later call with other
    scales of that signature takes the cached path and launches what the full path builds for them, bit for bit
    (but the workspace's address: the cached path reuses one per stream, which the V^T map points at)."""
    q, k, v = qkv((1, 256, 2, 128), dtype=np.uint8)
    out = fake(q.shape)
    scales = [tuple(fake((1, 2, 2), np.float32) for _ in range(3)) for _ in range(2)]
    call = lambda s: flashkit.attention(q, k, v, out=out, causal=True, q_scale=s[0], k_scale=s[1], v_scale=s[2])  # noqa: E731
    call(scales[0])
    Recorder.launches = []
    call(scales[1])
    assert counted == {"validate": 1, "select": 1}
    cached = list(Recorder.launches)
    assert [n for n, *_ in cached] == ["flashkit_fa3_fp8_vt", "flashkit_fa3_fp8_fwd"]
    call_cache.CALLS.clear()
    call_cache.CALLS.max_entries = 0     # the full path for the same scales
    try:
        Recorder.launches = []
        call(scales[1])
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    unfresh = lambda p: p[:32] + p[48:]  # noqa: E731   (the lse and workspace words)
    assert [(n, g, b, unfresh(p), m[:3]) for n, g, b, p, m in cached] == \
        [(n, g, b, unfresh(p), m[:3]) for n, g, b, p, m in Recorder.launches]   # q, k, o maps; vt: the workspace's
    assert counted == {"validate": 2, "select": 2}
    # Other scale blocks (64 rows): keyed apart, validated again; a float64 scale never reaches the cache.
    call(tuple(fake((1, 2, 4), np.float32) for _ in range(3)))
    assert counted == {"validate": 3, "select": 3}
    with pytest.raises(InputError, match="q_scale"):
        call((fake((1, 2, 2), np.float64),) + scales[0][1:])


def test_an_alibi_key_holds_the_slopes_signature(fake_gpu):
    q, k, v = qkv((1, 256, 2, 64))
    per_head, per_batch = fake((2,), np.float32), fake((1, 2), np.float32)
    assert key_of(q, k, v, alibi_slopes=per_head) == key_of(q, k, v, alibi_slopes=fake((2,), np.float32))
    assert len({key_of(q, k, v), key_of(q, k, v, alibi_slopes=per_head), key_of(q, k, v, alibi_slopes=per_batch),
                key_of(q, k, v, alibi_slopes=fake((2,), np.float64))}) == 4
    assert key_of(q, k, v, alibi_slopes=np.ones(2, np.float32)) is None    # not a CuPy array: the full path


def test_an_explicit_out_keeps_its_pointer(fake_gpu, counted):
    q, k, v = qkv()
    out = fake(q.shape)
    assert flashkit.attention(q, k, v, out=out) is out
    assert flashkit.attention(q, k, v, out=out) is out
    assert counted["select"] == 1
    o_ptr = int(np.frombuffer(Recorder.launches[-1][3][24:32], dtype=np.uint64)[0])
    assert o_ptr == out.data.ptr


@pytest.mark.parametrize("bad,message", [
    (dict(k=fake((1, 128, 2, 128)), v=fake((1, 128, 2, 128))), "k: head_dim must match q's (64), got 128"),
    (dict(k=fake((1, 128, 3, 64)), v=fake((1, 128, 3, 64))), "k: kv heads (3) must divide q's heads (2)"),
    (dict(v=fake((1, 127, 2, 64))), "v: expected the shape of k"),
    (dict(causal=1), "causal: expected True or False, got 1"),
    (dict(softmax_scale=True), "softmax_scale: expected a float, got bool"),
    (dict(softmax_scale=float("nan")), "softmax_scale: expected a finite non-zero float"),
    (dict(window_size=(True, 0)), "window_size: expected (left, right)"),
    (dict(out=fake((1, 128, 2, 32))), "out: expected shape (1, 128, 2, 64)"),
])
def test_bad_input_next_to_a_cached_signature_still_raises(fake_gpu, counted, bad, message):
    q, k, v = qkv()
    for kw in ({}, {"softmax_scale": 1}, {"softmax_scale": 1.0}, {"window_size": (1, 0)}, {"causal": True}):
        flashkit.attention(q, k, v, **kw)
    launches = len(Recorder.launches)
    args = {"k": k, "v": v, **bad}
    kw = {n: a for n, a in args.items() if n not in ("k", "v")}
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        flashkit.attention(q, args["k"], args["v"], **kw)
    assert len(Recorder.launches) == launches                      # nothing launched
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):   # and again
        flashkit.attention(q, args["k"], args["v"], **kw)


def test_misaligned_and_negative_scale_calls_are_not_cached(fake_gpu, counted, monkeypatch):
    from dataclasses import replace
    monkeypatch.setattr(api, "_negate_scale", lambda q, p, cp: (fake(q.shape), replace(p, softmax_scale=-p.softmax_scale)))
    monkeypatch.setattr(api, "_aligned", lambda a: fake(a.shape) if a.data.ptr % 16 else a)   # a copy
    k, v = fake((1, 128, 2, 64)), fake((1, 128, 2, 64))
    q = fake((1, 128, 2, 64))
    flashkit.attention(q, k, v, softmax_scale=-0.5)    # runs as -q with |scale|: a per-call negation
    flashkit.attention(q, k, v, softmax_scale=-0.5)
    assert counted["select"] == 2 and len(call_cache.CALLS) == 0
    odd = fake((1, 128, 2, 64), offset=2)                    # copied to an aligned array per call
    flashkit.attention(odd, k, v)
    flashkit.attention(odd, k, v)
    assert counted["select"] == 4 and len(call_cache.CALLS) == 0


def test_block_mask_is_keyed_by_identity_and_held(fake_gpu, counted):
    from flashkit.features.block_mask import BlockMask
    q, k, v = qkv((1, 256, 2, 64))
    m1 = BlockMask.from_blocks(np.ones((1, 1, 2, 2), dtype=bool))
    m2 = BlockMask.from_blocks(np.array([[[[True, False], [True, True]]]]))
    arrays = {}
    for m in (m1, m2):   # device copies of the compressed mask, on fake addresses
        arrays[id(m)] = (fake((1, 1, 2), np.int32), fake((1, 1, 2, 2), np.int32))
        m.device_arrays = (lambda a: lambda: a)(arrays[id(m)])
    for m in (m1, m2, m1, m2):
        flashkit.attention(q, k, v, block_mask=m)
    assert counted["select"] == 2
    held = [e.block_mask for e in call_cache.CALLS._entries.values()]
    assert m1 in held and m2 in held
    counts = {int(np.frombuffer(p[48:56], dtype=np.uint64)[0]) for _, _, _, p, _ in Recorder.launches}
    assert counts == {arrays[id(m)][0].data.ptr for m in (m1, m2)}


def test_the_cache_is_emptied_by_rediscovery_and_unloading(fake_gpu, counted):
    q, k, v = qkv()
    flashkit.attention(q, k, v)
    assert len(call_cache.CALLS) == 1
    discover_kernels(refresh=True)
    assert len(call_cache.CALLS) == 0
    flashkit.attention(q, k, v)
    build.clear_loaded()
    assert len(call_cache.CALLS) == 0
    flashkit.attention(q, k, v)
    assert counted["select"] == 3


def test_a_new_kernel_path_selects_again(fake_gpu, counted, monkeypatch, variant_dir):
    q, k, v = qkv()
    flashkit.attention(q, k, v)
    variant_dir.write("mine", priority=1000, head_dims=[64])
    monkeypatch.setenv("FLASHKIT_KERNEL_PATH", str(variant_dir.path))
    flashkit.attention(q, k, v)
    assert counted["select"] == 2
    assert Recorder.launches[-1][0] == "flashkit_mine_fwd"


# ---- the cache itself ----------------------------------------------------------------------------

def test_the_cache_is_a_bounded_lru():
    cache = CallCache(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1          # a is now the most recent
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2
    assert call_cache.CALLS.max_entries == call_cache.MAX_ENTRIES


def test_many_signatures_stay_bounded(fake_gpu, monkeypatch):
    monkeypatch.setattr(call_cache.CALLS, "max_entries", 3)
    for n in range(1, 7):
        flashkit.attention(*qkv((1, 128 + n, 2, 64)))
    assert len(call_cache.CALLS) == 3


def test_param_template_fills_only_the_pointers():
    fields = dict(q=1, k=2, v=3, o=4, lse=5, workspace=6, batch=3, heads=8, softmax_scale=0.5,
                  cache={"seqlens": 7, "block_table": 8, "page_size": 16, "splits": 4})
    template = ParamTemplate(make_params(**{**fields, "q": 99, "cache": {**fields["cache"], "seqlens": 98}}),
                             ("q", "k", "v", "o", "lse", "workspace", "cache.seqlens", "cache.block_table"))
    block = template.fill(1, 2, 3, 4, 5, 6, 7, 8)
    assert block.dtype == PARAMS_DTYPE and bytes(block) == bytes(make_params(**fields)[()])
    words = template.block()                                   # written in place: the launch path
    template.write(words, (1, 2, 3, 4, 5, 6, 7, 8))
    assert words.tobytes() == bytes(block)
    template.write(words, (11, 12, 13, 14, 15, 16))             # fewer values: the rest keep the block's own
    assert words.tobytes() == bytes(make_params(**{**fields, "q": 11, "k": 12, "v": 13, "o": 14, "lse": 15,
                                                   "workspace": 16, "cache": {**fields["cache"], "seqlens": 98}})[()])
    with pytest.raises(KeyError, match="nope"):
        ParamTemplate(make_params(), ("nope",))


def test_pointer_runs_group_adjacent_fields():
    runs = pointer_runs((0, 8, 16, 40, 48, 200))
    assert [(r[0].format, r[1], r[2], r[3]) for r in runs] == [("<3Q", 0, 0, 3), ("<2Q", 40, 3, 5), ("<1Q", 200, 5, 6)]


def test_prepared_launch_passes_its_block_by_address_and_maps_per_address(fake_gpu):
    """fa3 (tensor maps): each call's parameter bytes are the template's with this call's pointers, read by the
    kernel at its launch; the maps carry this call's addresses, also when an address tuple repeats."""
    shape = (1, 128, 2, 64)
    calls = [(*qkv(shape), fake(shape)) for _ in range(3)]
    for q, k, v, out in calls + calls[:1]:
        flashkit.attention(q, k, v, out=out)
    (entry,) = call_cache.CALLS._entries.values()
    prepared = entry.prepared
    assert prepared.maps and len(Recorder.launches) == 4
    for (q, k, v, out), (_, _, _, params, maps) in zip(calls + calls[:1], Recorder.launches):
        assert params == bytes(prepared.params.fill(q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, 0, 0))
        assert [int(np.frombuffer(m[:8], dtype=np.uint64)[0]) for m in maps] == \
            [a.data.ptr for a in (q, k, v, out)][:len(maps)]
    assert len(prepared._maps_at) == 3


def test_the_map_memo_stays_bounded(fake_gpu, monkeypatch):
    from flashkit.runtime import launch as launch_mod
    monkeypatch.setattr(launch_mod, "MAX_MAP_ADDRESSES", 2)
    shape = (1, 128, 2, 64)
    k, v = fake(shape), fake(shape)
    for _ in range(5):
        flashkit.attention(fake(shape), k, v)
    (entry,) = call_cache.CALLS._entries.values()
    assert 1 <= len(entry.prepared._maps_at) <= 2


def test_one_signature_from_many_threads_launches_each_call_its_own_pointers(fake_gpu):
    """The shared parameter block is rewritten and launched under a lock: with threads switching as often as
    the interpreter allows, every launch still carries the pointers of the call that made it."""
    import sys
    import threading
    q0, k, v = qkv()
    flashkit.attention(q0, k, v)
    Recorder.launches = []
    seen: dict[int, set] = {}

    class ThreadRecorder(Recorder):
        def __call__(self, grid, block, args, shared_mem=0, stream=None):
            super().__call__(grid, block, args, shared_mem, stream)
            seen.setdefault(threading.get_ident(), set()).add(Recorder.launches[-1][3][:8])

    (entry,) = call_cache.CALLS._entries.values()
    entry.prepared.grids = [(ThreadRecorder(fn.name), grid, smem) for fn, grid, smem in entry.prepared.grids]
    mine: dict[int, bytes] = {}
    n_threads = 4
    # Every thread alive from the first launch to the last: a thread ident is reused once its thread has ended, and
    # a loaded machine could end one before the next starts (two threads' pointers under one ident).
    started, finished = threading.Barrier(n_threads), threading.Barrier(n_threads)

    def work():
        q = fake(q0.shape)
        mine[threading.get_ident()] = int(q.data.ptr).to_bytes(8, "little")
        started.wait()
        for _ in range(200):
            flashkit.attention(q, k, v)
        finished.wait()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert seen == {ident: {ptr} for ident, ptr in mine.items()}


def test_workspace_is_reused_per_stream_and_size(monkeypatch):
    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

    class FakeCupy:
        uint8 = np.uint8
        stream = Stream(1)

        class cuda:   # noqa: N801
            @staticmethod
            def get_current_stream():
                return FakeCupy.stream

        @staticmethod
        def empty(n, dtype):
            return np.empty(n, dtype)
    monkeypatch.setattr(call_cache, "_cupy", lambda: FakeCupy)
    monkeypatch.setattr(call_cache, "current_device", lambda: 0)
    call_cache.invalidate()
    a = call_cache.workspace(64)
    assert call_cache.workspace(64) is a                 # same stream, same size: reused
    assert call_cache.workspace(128) is not a
    FakeCupy.stream = Stream(2)
    assert call_cache.workspace(64) is not a             # another stream: never shared
    call_cache.invalidate()


# ---- attention_with_kvcache ----------------------------------------------------------------------

def test_kvcache_second_call_is_cached_and_puts_the_new_lengths_in(fake_gpu, counted):
    q = fake((1, 1, 8, 128))
    kc, vc = fake((1, 1024, 8, 128)), fake((1, 1024, 8, 128))
    lens = [fake((1,), np.int32) for _ in range(2)]
    for sl in lens:
        flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, check_indices=False)
    assert counted == {"validate": 1, "select": 1}
    from flashkit.runtime.params import flat_fields
    off = {n: o for n, _, o in flat_fields()}["cache.seqlens"]
    decode = [p for name, _, _, p, _ in Recorder.launches if name == "flashkit_decode_fwd"]
    assert [int(np.frombuffer(p[off:off + 8], dtype=np.uint64)[0]) for p in decode] == [s.data.ptr for s in lens]
    strip = lambda p: p[:24] + p[48:off] + p[off + 8:]  # noqa: E731   (out, lse, workspace, seqlens differ)
    assert strip(decode[0]) == strip(decode[1])


def test_kvcache_key_distinguishes_paging_and_seqlens_kind(fake_gpu):
    q = fake((2, 1, 8, 128))
    kc, vc = fake((2, 1024, 8, 128)), fake((2, 1024, 8, 128))
    sl = fake((2,), np.int32)
    key = lambda **kw: kvcache._kvcache_key(**{**dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=sl,   # noqa: E731
                                                   block_table=None, k_new=None, v_new=None, out=None,
                                                   causal=False, return_lse=False, softmax_scale=None,
                                                   variant=None, window_size=None, softcap=0.0), **kw})
    pages = fake((16, 128, 8, 128))
    keys = [key(), key(cache_seqlens=5), key(causal=True), key(return_lse=True), key(softmax_scale=0.1),
            key(k_cache=pages, v_cache=pages, block_table=fake((2, 8), np.int32)),
            key(k_new=fake((2, 1, 8, 128)), v_new=fake((2, 1, 8, 128))), key(window_size=(64, 0)),
            key(window_size=(64, 1)), key(softcap=30.0), key(softcap=20.0)]
    assert len(set(keys)) == len(keys)
    assert key(window_size="wide") is None                         # the full path names it
    assert key(cache_seqlens=5) == key(cache_seqlens=700)          # the value is checked per call
    assert key(cache_seqlens=True) is None or key(cache_seqlens=True) != key(cache_seqlens=1)


def test_kvcache_bad_input_next_to_a_cached_signature_still_raises(fake_gpu):
    q = fake((1, 1, 8, 128))
    kc, vc = fake((1, 1024, 8, 128)), fake((1, 1024, 8, 128))
    sl = fake((1,), np.int32)
    flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, check_indices=False)
    with pytest.raises(InputError, match="cache_seqlens: expected dtype int32"):
        flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=fake((1,), np.int64), check_indices=False)
    with pytest.raises(InputError, match="k_cache: head_dim must match q's"):
        flashkit.attention_with_kvcache(q, fake((1, 1024, 8, 64)), fake((1, 1024, 8, 64)), cache_seqlens=sl,
                                        check_indices=False)
    with pytest.raises(InputError, match="check_indices: expected True or False"):
        flashkit.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, check_indices=1)


@pytest.fixture
def pooled_gpu(monkeypatch):
    """The fake H100 with CuPy's allocations on one address per size (a memory pool in a loop): the tile buffers a
    cached functor call allocates land where the full path's did, so the two launch the same bytes."""
    with installed(monkeypatch.setattr, pooled=True):
        yield


FUNCTOR_ENTRIES = ["flashkit_functor_classify", "flashkit_functor_compact", "flashkit_fa3_fwd"]


@pytest.mark.parametrize("mod,make_args,entries", [
    ("relative_bias", lambda: {"slopes": fake((2,), np.float32)}, ["flashkit_fa3_fwd"]),    # score_mod, an array
    ("document", lambda: {"doc_ids": fake((1, 256), np.int32)}, FUNCTOR_ENTRIES),           # mask_mod, an array
    ("prefix_lm", lambda: {"prefix": 40}, ["flashkit_fa3_fwd"]),   # mask_mod, an int: its tiles kept by signature
])
def test_functor_calls_are_cached_and_put_each_calls_arguments_in(pooled_gpu, counted, mod, make_args, entries):
    """A functor call's signature (features/functors.functor_signature) is cached like any other: a later call
    with other arrays of the same signature takes the cached path (no validation, no selection), classifies a
    mask_mod's tiles again (unless its arguments are all scalars: kept under the signature), and launches what the
    full path builds for those arguments, bit for bit."""
    q, k, v = qkv((1, 256, 2, 64))
    out = fake(q.shape)
    call = lambda args: flashkit.attention(q, k, v, out=out, causal=True, mod=mod, mod_args=args)  # noqa: E731
    call(make_args())
    Recorder.launches = []
    args = make_args()
    call(args)
    assert counted == {"validate": 1, "select": 1}
    cached = list(Recorder.launches)
    assert [n for n, *_ in cached] == entries
    call_cache.CALLS.clear()
    call_cache.CALLS.max_entries = 0     # the full path for the same arguments
    try:
        Recorder.launches = []
        call(args)
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    assert cached == Recorder.launches
    assert counted == {"validate": 2, "select": 2}


def test_a_functor_key_holds_its_scalars_and_array_signatures(fake_gpu, counted):
    q, k, v = qkv((1, 256, 2, 64))
    for args in ({"prefix": 40}, {"prefix": 40}, {"prefix": 41}, {"prefix": 41}):
        flashkit.attention(q, k, v, mod="prefix_lm", mod_args=args)
    assert counted == {"validate": 2, "select": 2}       # a scalar is baked into the block: each value its key
    for ids in (fake((1, 256), np.int32), fake((1, 256), np.int32), fake((1, 256), np.int32, offset=4)):
        flashkit.attention(q, k, v, mod="document", mod_args={"doc_ids": ids})
    assert counted == {"validate": 4, "select": 4}       # the same signature once, another alignment apart
    with pytest.raises(InputError, match="doc_ids"):      # a bad argument beside a cached signature still raises
        flashkit.attention(q, k, v, mod="document", mod_args={"doc_ids": fake((1, 255), np.int32)})


# ---- attention_varlen ----------------------------------------------------------------------------

@pytest.fixture
def counted_varlen(monkeypatch):
    """How often attention_varlen's validation and selection ran."""
    import flashkit.varlen as varlen
    counts = {"validate": 0, "select": 0}
    monkeypatch.setattr(varlen, "validate_varlen", counting(counts, "validate", varlen.validate_varlen))
    monkeypatch.setattr(varlen, "select_kernel", counting(counts, "select", varlen.select_kernel))
    return counts


def varlen_inputs(total=600, batch=3, heads=4, kv_heads=2, d=128):
    return (fake((total, heads, d)), fake((total, kv_heads, d)), fake((total, kv_heads, d)),
            fake((batch + 1,), np.int32), fake((batch + 1,), np.int32))


@pytest.mark.parametrize("kw", [{}, {"causal": True, "return_lse": True}, {"alibi_slopes": True},
                                {"window_size": (64, 0), "softcap": 10.0}])
def test_varlen_calls_are_cached_and_put_each_calls_offsets_in(fake_gpu, counted_varlen, kw):
    """A packed call's signature is cached like attention()'s: a later call with other offsets (and slopes) of the
    same signature takes the cached path (no validation, no selection) and launches what the full path builds for
    them, bit for bit but for the fresh LSE and workspace."""
    q, k, v, *_ = varlen_inputs()
    out = fake(q.shape)
    if kw.get("alibi_slopes"):
        kw = dict(kw, alibi_slopes=None)
    calls = [varlen_inputs()[3:] + ((fake((4,), np.float32),) if "alibi_slopes" in kw else (None,))
             for _ in range(2)]

    def call(cu_q, cu_k, slopes):
        return flashkit.attention_varlen(q, k, v, cu_q, cu_k, 300, 320, out=out, check_indices=False,
                                         **dict(kw, **({"alibi_slopes": slopes} if slopes is not None else {})))
    call(*calls[0])
    Recorder.launches = []
    second = call(*calls[1])
    assert counted_varlen == {"validate": 1, "select": 1}
    assert (second[0] if kw.get("return_lse") else second) is out
    cached = list(Recorder.launches)
    call_cache.CALLS.clear()
    call_cache.CALLS.max_entries = 0     # the full path for the same offsets
    try:
        Recorder.launches = []
        call(*calls[1])
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    assert counted_varlen == {"validate": 2, "select": 2}
    unfresh = lambda p: p[:32] + p[48:]  # noqa: E731   (the lse and workspace words)
    assert [(n, g, b, unfresh(p), m) for n, g, b, p, m in cached] == \
        [(n, g, b, unfresh(p), m) for n, g, b, p, m in Recorder.launches]


def test_a_varlen_key_holds_every_argument_that_selects_or_shapes_the_launch(fake_gpu):
    import flashkit.varlen as varlen
    q, k, v, cu_q, cu_k = varlen_inputs()
    args = dict(q=q, k=k, v=v, out=None, cu_q=cu_q, cu_k=cu_k, max_seqlen_q=300, max_seqlen_k=320, causal=False,
                softmax_scale=None, return_lse=False, window_size=None, softcap=0.0, alibi_slopes=None,
                attention_chunk=0, variant=None)
    key = lambda **kw: varlen._varlen_key(**dict(args, **kw))  # noqa: E731
    keys = [key(), key(max_seqlen_q=301), key(max_seqlen_k=321), key(causal=True), key(return_lse=True),
            key(softmax_scale=0.1), key(window_size=(8, 0)), key(softcap=5.0), key(attention_chunk=64),
            key(alibi_slopes=fake((4,), np.float32)), key(variant="fa2"), key(cu_q=fake((5,), np.int32),
                                                                             cu_k=fake((5,), np.int32)),
            key(out=fake(q.shape)), key(q=fake((601, 4, 128)))]
    assert len(set(keys)) == len(keys)
    assert key(cu_q=fake((4,), np.int32)) == key()               # the offsets' values are checked per call
    assert key(max_seqlen_q=True) != key(max_seqlen_q=1)
    assert key(cu_q=np.zeros(4, np.int32)) is None               # only CuPy arrays are keyed


def test_varlen_bad_input_next_to_a_cached_signature_still_raises(fake_gpu, counted_varlen):
    q, k, v, cu_q, cu_k = varlen_inputs()
    flashkit.attention_varlen(q, k, v, cu_q, cu_k, 300, 320, check_indices=False)
    with pytest.raises(InputError, match="cu_seqlens_k: expected dtype int32"):
        flashkit.attention_varlen(q, k, v, cu_q, fake((4,), np.int64), 300, 320, check_indices=False)
    with pytest.raises(InputError, match="max_seqlen_q: expected an int >= 0"):
        flashkit.attention_varlen(q, k, v, cu_q, cu_k, -1, 320, check_indices=False)
    with pytest.raises(InputError, match="check_indices: expected True or False"):
        flashkit.attention_varlen(q, k, v, cu_q, cu_k, 300, 320, check_indices=1)


@pytest.mark.parametrize("kw", [{}, {"causal": True, "deterministic": True}, {"alibi_slopes": True}])
def test_varlen_backward_calls_are_cached_and_put_each_calls_offsets_in(fake_gpu, monkeypatch, kw):
    """attention_varlen_backward's signature likewise: a later call with other offsets (and slopes) launches what
    the full path builds for them, bit for bit."""
    from flashkit import backward as bwd
    counts = {"validate": 0}
    monkeypatch.setattr(bwd, "validate_varlen", counting(counts, "validate", bwd.validate_varlen))
    q, k, v, *_ = varlen_inputs()
    dout, out, lse = fake(q.shape), fake(q.shape), fake((4, 600), np.float32)
    slopes = [fake((4,), np.float32) if kw.get("alibi_slopes") else None for _ in range(2)]
    kw = {n: x for n, x in kw.items() if n != "alibi_slopes"}
    offsets = [varlen_inputs()[3:] for _ in range(2)]

    def call(i):
        return flashkit.attention_varlen_backward(dout, q, k, v, out, lse, *offsets[i], 300, 320, check_indices=False,
                                                  alibi_slopes=slopes[i], **kw)
    call(0)
    Recorder.launches = []
    grads = call(1)
    assert counts == {"validate": 1} and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    cached = list(Recorder.launches)
    call_cache.CALLS.clear()
    call_cache.CALLS.max_entries = 0
    try:
        Recorder.launches = []
        full = call(1)
    finally:
        call_cache.CALLS.max_entries = call_cache.MAX_ENTRIES
    assert counts == {"validate": 2}
    # the same launches but for the fresh gradients' and workspace's addresses
    from flashkit.runtime.params import flat_fields
    offs = {n: o for n, _, o in flat_fields()}
    fresh = sorted([offs["workspace"]] + [offs[f"bwd.{g}"] for g in ("dq", "dk", "dv")])
    strip = lambda p: b"".join(p[a + 8:b] for a, b in zip([-8] + fresh, fresh + [len(p)]))  # noqa: E731
    assert [(n, g, b, strip(p), m) for n, g, b, p, m in cached] == \
        [(n, g, b, strip(p), m) for n, g, b, p, m in Recorder.launches]
    assert len(full) == 3
