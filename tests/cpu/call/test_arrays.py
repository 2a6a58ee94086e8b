"""call/arrays.py: what to_cupy refuses before any array is touched."""

import pytest

from flashkit.call.arrays import to_cupy
from flashkit.errors import InputError


class GradTensor:
    """A stand-in for a torch tensor that requires grad: torch refuses DLPack and the interface of these."""

    requires_grad = True

    def __dlpack__(self, *args, **kwargs):
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")


def test_a_tensor_that_requires_grad_gets_one_line_naming_the_argument_and_the_way_out():
    with pytest.raises(InputError) as e:
        to_cupy(GradTensor(), "k")
    msg = str(e.value)
    assert msg.startswith("k: a tensor that requires grad") and "flashkit.torch.attention" in msg
    assert "k.detach()" in msg and "\n" not in msg


def test_an_object_without_either_protocol_is_refused_by_name():
    with pytest.raises(InputError, match="^v: could not view it as a CUDA array"):
        to_cupy(object(), "v")


class CudaInterface:
    """A __cuda_array_interface__ exporter of a given shape and byte strides (no memory behind it)."""

    def __init__(self, shape, strides):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "<f2", "data": (0, False),
                                         "version": 3}


def test_an_empty_array_is_described_as_contiguous_whatever_its_strides():
    """An empty slice of a strided view reports strides of 0 (NumPy and CuPy alike); verify --fuzz found the
    backward refusing such a dout of an empty varlen batch."""
    from flashkit.call.arrays import contiguous_strides, describe
    meta = describe(CudaInterface((0, 3, 104), (0, 0, 0)), "dout")
    assert meta.strides == (3 * 104, 104, 1) == contiguous_strides((0, 3, 104))
    full = describe(CudaInterface((2, 3, 104), (3 * 112 * 2, 112 * 2, 2)), "dout")
    assert full.strides == (3 * 112, 112, 1)   # a non-empty array keeps its own
