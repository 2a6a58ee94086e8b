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
