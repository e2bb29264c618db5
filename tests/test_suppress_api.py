"""`# shapeguard: ignore[kind]` in the Python API: the session itself honours it, in raise
mode too, for that kind on that line only."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeError

pytestmark = pytest.mark.no_shapeguard


class QueriesSoftmax(nn.Module):
    """softmax over the queries (dim=-2) of self-attention (the queries are the keys): a
    softmax_axis warning at distinct sizes."""

    def __init__(self, silence: bool):
        super().__init__()
        self.silence = silence

    def forward(self, x):
        scores = x @ x.transpose(-2, -1)
        if self.silence:
            return scores.softmax(dim=-2)  # shapeguard: ignore[softmax_axis]
        return scores.softmax(dim=-2)


class WrongInner(nn.Module):
    def forward(self, q, k, silence: bool):
        if silence:
            return q @ k  # shapeguard: ignore[softmax_axis]
        return q @ k


def _qk():
    return torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)


def test_a_silenced_warning_is_listed_not_warned():
    q, _ = _qk()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = shapeguard.trace(QueriesSoftmax(silence=True), q, strict=True)
    assert trace.findings == []
    assert [f.kind for f in trace.suppressed] == ["softmax_axis"]
    assert "softmax" in trace.suppressed[0].message
    assert not [w for w in caught if issubclass(w.category, shapeguard.ShapeWarning)]


def test_the_same_line_without_the_comment_still_warns():
    q, _ = _qk()
    with pytest.warns(shapeguard.ShapeWarning, match="softmax"):
        trace = shapeguard.trace(QueriesSoftmax(silence=False), q)
    assert [f.kind for f in trace.findings] == ["softmax_axis"]
    assert trace.suppressed == []


def test_a_comment_for_another_kind_silences_nothing():
    q = torch.randn(2, 5, 8)
    k = torch.randn(2, 7, 8)
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(WrongInner(), q, k, True)
    assert info.value.kind == "matmul_inner"


class MismatchedValues(nn.Module):
    """k and v of different lengths: torch's CPU kernel runs it; shapeguard raises."""

    def forward(self, q, k, v, silence: bool):
        if silence:
            return F.scaled_dot_product_attention(q, k, v)  # shapeguard: ignore[sdpa_kv_seq]
        return F.scaled_dot_product_attention(q, k, v)


def test_a_silenced_error_does_not_stop_the_forward_in_raise_mode():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 6, 8)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    except RuntimeError:
        pytest.skip("this torch build refuses mismatched k/v lengths itself")
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(MismatchedValues(), q, k, v, False)
    assert info.value.kind == "sdpa_kv_seq"
    trace = shapeguard.trace(MismatchedValues(), q, k, v, True)
    assert trace.findings == []
    assert [f.kind for f in trace.suppressed] == ["sdpa_kv_seq"]
