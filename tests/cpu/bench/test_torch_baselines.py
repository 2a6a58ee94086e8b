"""flashkit.bench without a GPU: the PyTorch baselines without torch (bench/torch_baselines.py)."""

from __future__ import annotations

import sys

from flashkit.bench import torch_baselines


def test_torch_missing_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    ok, reason = torch_baselines.available()
    assert not ok and "torch" in reason
