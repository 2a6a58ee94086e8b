"""flashkit.torch_direct's keys: everything the full path reads of a call is in them, and an argument the direct
path cannot take (no plain tensor, no CUDA device) gives no key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def direct(monkeypatch):
    from flashkit import torch_direct
    monkeypatch.setattr(torch_direct, "_current_device", lambda: 0)   # no CUDA here: device 0 stands in
    return torch_direct


def _key(direct, q, k, v, causal=True, softmax_scale=None, window=(-1, -1), softcap=0.0, slopes=None, chunk=0):
    return direct.forward_key(q, k, v, causal, softmax_scale, *window, softcap, slopes, chunk)


def _qkv():
    q = torch.zeros(2, 64, 4, 32, dtype=torch.bfloat16)
    k = torch.zeros(2, 48, 2, 32, dtype=torch.bfloat16)
    return q, k, k.clone()


def test_equal_signatures_give_equal_keys(direct):
    q, k, v = _qkv()
    assert _key(direct, q, k, v) == _key(direct, q.clone(), k.clone(), v.clone())


def test_keys_tell_apart_what_the_full_path_reads(direct):
    q, k, v = _qkv()
    base = _key(direct, q, k, v)
    misaligned = torch.zeros(q.numel() + 4, dtype=q.dtype)[4:].view(q.shape)   # 8 bytes past 16
    others = [
        _key(direct, q.transpose(1, 2).contiguous().transpose(1, 2), k, v),   # strides
        _key(direct, misaligned, k, v),                                       # address modulo 16
        _key(direct, q.half(), k.half(), v.half()),                           # dtype
        _key(direct, q[:, :63], k, v),                                        # shape
        _key(direct, q, k, v, causal=1),                                      # a flag's type (1 == True)
        _key(direct, q, k, v, softmax_scale=0.125),
        _key(direct, q, k, v, window=(16, 0)),
        _key(direct, q, k, v, softcap=30.0),
        _key(direct, q, k, v, slopes=torch.ones(4)),
        _key(direct, q, k, v, chunk=32),
    ]
    assert all(key is not None for key in others)
    assert len({base, *others}) == len(others) + 1


def test_backward_keys_carry_dout_and_the_determinism_flag(direct):
    q, k, v = _qkv()
    lse = torch.zeros(2, 4, 64)

    def key(dout, deterministic=False):
        return direct.backward_key(dout, q, k, v, q, lse, True, None, deterministic, -1, -1, 0.0, None, 0)
    assert key(q) == key(q.clone())
    assert len({key(q), key(q, deterministic=True), key(q.transpose(1, 2).contiguous().transpose(1, 2))}) == 3


def test_no_key_for_what_the_direct_path_cannot_take(direct, monkeypatch):
    q, k, v = _qkv()

    class Sub(torch.Tensor):
        pass
    assert _key(direct, q.as_subclass(Sub), k, v) is None
    assert _key(direct, object(), k, v) is None
    assert direct.lookup(None) is None

    def no_device():
        raise RuntimeError("no CUDA device")
    monkeypatch.setattr(direct, "_current_device", no_device)
    assert _key(direct, q, k, v) is None


def test_checked_offsets_count_only_while_the_same_tensors_are_unchanged():
    from flashkit import torch_direct as direct
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32)
    lengths = (4, 5, 7, 9)
    assert not direct.offsets_checked(cu_q, cu_k, lengths)
    direct.remember_checked(cu_q, cu_k, lengths)
    assert direct.offsets_checked(cu_q, cu_k, lengths)
    assert not direct.offsets_checked(cu_q, cu_k, (4, 5, 7, 10))            # checked against other lengths
    assert not direct.offsets_checked(cu_q.clone(), cu_k, lengths)          # another tensor with the same values
    cu_k[1] = 6                                                             # written in place: the version moves
    assert not direct.offsets_checked(cu_q, cu_k, lengths)
    direct.remember_checked([0, 3, 7], cu_k, lengths)                       # no version counter: not recorded
    assert not direct.offsets_checked([0, 3, 7], cu_k, lengths)


def test_checked_offsets_are_bounded():
    from flashkit import torch_direct as direct
    pairs = [(torch.tensor([0, i], dtype=torch.int32), torch.tensor([0, i], dtype=torch.int32))
             for i in range(direct.MAX_CHECKED_OFFSETS + 4)]
    for cu_q, cu_k in pairs:
        direct.remember_checked(cu_q, cu_k, (1, 1, 1, 1))
    assert len(direct._CHECKED) <= direct.MAX_CHECKED_OFFSETS
    assert direct.offsets_checked(*pairs[-1], (1, 1, 1, 1)) and not direct.offsets_checked(*pairs[0], (1, 1, 1, 1))
