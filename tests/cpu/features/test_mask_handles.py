"""features/mask_handles.py: every BlockMask and ModMask takes its own handle, a handle names its mask while the mask
lives, and a handle whose mask is gone is refused by name (what flashkit.torch's masked ops look masks up by)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from flashkit.errors import InputError
from flashkit.features import mask_handles
from flashkit.features.block_mask import BlockMask
from flashkit.features.mod_mask import ModMask


def test_every_mask_takes_its_own_handle_and_is_found_by_it():
    masks = [BlockMask(np.ones((2, 2), dtype=bool)), BlockMask(np.ones((1, 1), dtype=bool)),
             ModMask("prefix_lm", {"prefix": 3})]
    handles = [mask_handles.handle_of(m) for m in masks]
    assert len(set(handles)) == len(masks) and mask_handles.NO_MASK not in handles
    for mask, handle in zip(masks, handles):
        assert mask_handles.lookup(handle, "block_mask") is mask


def test_no_mask_has_the_absent_handle():
    assert mask_handles.handle_of(None) == mask_handles.NO_MASK
    assert mask_handles.lookup(mask_handles.NO_MASK, "block_mask") is None


def test_a_handle_whose_mask_is_gone_is_refused_by_name():
    handle = BlockMask(np.ones((2, 2), dtype=bool)).handle
    gc.collect()
    with pytest.raises(InputError, match=r"^mod: the mask of handle \d+ no longer exists"):
        mask_handles.lookup(handle, "mod")
