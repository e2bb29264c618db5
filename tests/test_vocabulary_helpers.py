"""The small helpers every layer shares (`_values`, `_errors.first_line`): one test each,
where the copies they replaced disagreed."""

import numpy as np
import pytest
import torch

from shapeguard._errors import first_line
from shapeguard._values import dtype_name, is_tensor


def test_is_tensor_takes_subclasses_and_never_duck_types():
    assert is_tensor(torch.zeros(2))
    assert is_tensor(torch.nn.Parameter(torch.zeros(2)))
    # A NumPy array has a shape and a dtype too: it is not a tensor.
    assert not is_tensor(np.zeros(2))
    assert not is_tensor(np.float32(1.0))
    assert not is_tensor([2, 3])


def test_dtype_name_is_the_name_without_torch():
    assert dtype_name(torch.float32) == "float32"
    assert dtype_name(torch.bool) == "bool"
    assert dtype_name(np.dtype("float64")) == "float64"
    assert dtype_name("bfloat16") == "bfloat16"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (ValueError("first\nsecond"), "first"),
        (RuntimeError("\n  indented first\nsecond"), "indented first"),
        (KeyError(), ""),  # no message: the caller says what stands in for it
        (AssertionError(""), ""),
    ],
)
def test_first_line_of_an_error(error, line):
    assert first_line(error) == line
