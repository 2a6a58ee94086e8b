"""runtime/launch.py without a GPU: the tensor maps a manifest names, q/k/v/o by argument index and others
(the backward's dout) from LaunchInputs.map_arrays with their address."""

from __future__ import annotations

import numpy as np
import pytest

from flashkit.call.validate import Problem
from flashkit.registry import discover_kernels
from flashkit.runtime.launch import LaunchInputs, tensor_map_layouts

pytest.importorskip("cupy")

from .fake_device import fake  # noqa: E402  (needs CuPy)

P = Problem(batch=2, seqlen_q=100, seqlen_k=70, heads=4, kv_heads=2, head_dim=64, dtype="bfloat16",
            softmax_scale=0.125)


def inputs(**map_arrays):
    q, out = fake((2, 100, 4, 64)), fake((2, 100, 4, 64))
    return LaunchInputs(q, fake((2, 70, 2, 64)), fake((2, 70, 2, 64)), out, fake((2, 4, 100), np.float32),
                        map_arrays=map_arrays)


def test_backward_maps_put_dout_after_q_k_v_with_its_address():
    spec = discover_kernels().specs["fa3_bwd"]
    dout = fake((2, 100, 4, 64))
    layouts = tensor_map_layouts(spec, spec.launch_config((9, 0), 64, ()), P, inputs(dout=dout))
    assert [i for i, _ in layouts] == [0, 1, 2, None]
    assert [g.box[1] for _, g in layouts] == [64, 192, 192, 64]   # hd64: key blocks of 192 (three consumers)
    assert all(g.address == 0 for i, g in layouts if i is not None)   # filled in per call
    assert layouts[3][1].address == dout.data.ptr and layouts[3][1].dims == (64, 100, 4, 2)


def test_a_map_without_its_array_is_refused():
    spec = discover_kernels().specs["fa3_bwd"]
    with pytest.raises(ValueError, match="dout"):
        tensor_map_layouts(spec, spec.launch_config((9, 0), 64, ()), P, inputs())


def test_forward_maps_unchanged():
    spec = discover_kernels().specs["fa3"]
    layouts = tensor_map_layouts(spec, spec.launch_config((9, 0), 64, ()), P, inputs())
    assert [i for i, _ in layouts] == [0, 1, 2, 3]


def test_dq_accum_rows_are_as_wide_as_the_compiled_class():
    """A padded backward call (head dim 40 compiled as 64): dq_accum rows of 64 floats, lse2 and dsum after them."""
    from dataclasses import replace

    from flashkit.runtime.launch import workspace_bytes
    p = replace(P, head_dim=40, head_dim_v=40)
    cfg = {"block_m": 64}
    rows = 2 * 4 * 2 * 64   # batch x heads x two query blocks of 64
    semaphores = 2 * 4 * 2
    assert workspace_bytes("dq_accum", p, cfg, 64) == (rows * (64 + 2) + semaphores) * 4
    assert workspace_bytes("dq_accum", p, cfg) == (rows * (40 + 2) + semaphores) * 4   # unpadded: the call's own
