"""Property test: any valid attention configuration gives no finding; each single-axis
mutation of one gives a ShapeError of the expected kind, never a bare torch error."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import shapeguard


class Attention(nn.Module):
    """Multi-head attention whose shapes come from a config; `mutation` breaks one axis."""

    def __init__(self, d_model, n_heads, mutation=None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.mutation = mutation
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        width = d_model + 1 if mutation == "linear_width" else d_model
        self.out = nn.Linear(width, d_model)

    def forward(self, x, mask):
        batch, seq, _ = x.shape
        q = self.W_q(x).view(batch, seq, self.n_heads, self.d_k).transpose(1, 2)
        k = self.W_k(x).view(batch, seq, self.n_heads, self.d_k).transpose(1, 2)
        v = self.W_v(x).view(batch, seq, self.n_heads, self.d_k).transpose(1, 2)
        k_t = k if self.mutation == "no_transpose" else k.transpose(-2, -1)
        scores = q @ k_t / math.sqrt(self.d_k)
        scores = scores.masked_fill(~mask, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        context = (attn @ v).transpose(1, 2).reshape(batch, seq, self.d_model)
        return self.out(context)


@st.composite
def configs(draw):
    """Pairwise-distinct batch, seq, heads and d_k, so no axis matches another by chance."""
    values = draw(st.lists(st.integers(2, 9), min_size=4, max_size=4, unique=True))
    batch, seq, heads, d_k = values
    return batch, seq, heads, d_k


def _inputs(batch, seq, d_model):
    x = torch.randn(batch, seq, d_model, device="meta")
    mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool, device="meta")
    return x, mask


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(configs())
def test_valid_configurations_give_no_finding(config):
    batch, seq, heads, d_k = config
    with torch.device("meta"):
        model = Attention(heads * d_k, heads)
    trace = shapeguard.trace(model, *_inputs(batch, seq, heads * d_k))
    assert trace.findings == []


MUTATIONS = {
    "head_count": "head_divisibility",
    "no_transpose": "matmul_inner",
    "mask_shape": "mask_broadcast",
    "linear_width": "linear_in_features",
}


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@SETTINGS
@given(config=configs())
def test_each_single_axis_mutation_gives_its_kind(mutation, config):
    batch, seq, heads, d_k = config
    d_model = heads * d_k
    x, mask = _inputs(batch, seq, d_model)
    if mutation == "head_count":
        d_model += 1  # heads no longer divide d_model
        x = torch.randn(batch, seq, d_model, device="meta")
    if mutation == "mask_shape":
        mask = torch.ones(batch, seq, dtype=torch.bool, device="meta")  # [batch, seq] not expanded
    with torch.device("meta"):
        model = Attention(
            d_model, heads, mutation=None if mutation in ("head_count", "mask_shape") else mutation
        )
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(model, x, mask)
    assert info.value.kind == MUTATIONS[mutation], str(info.value)
    assert info.value.__cause__ is None  # shapeguard's rule fired, not torch's error
