"""check's probes on correct modules that mix positions or examples by design (issue 32's
domain zoo): a probe fails only with a counterexample the property really forbids.

A convolution whose kernel runs along the tokens (Informer's circular token embedding) makes
the output depend on the tokens' order: token permutation does not apply, and says which conv.
A view that moves data across the tokens in front of the same conv is still a failure."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard import check

# (batch, seq, channels, d_model, heads)
SIZES = {
    "distinct": (3, 7, 5, 16, 4),
    "coincident": (4, 4, 4, 16, 4),
    "realistic": (4, 64, 7, 64, 8),
}


def result(report, name):
    return next(r for r in report.probes if r.name == name)


class ConvEmbedded(nn.Module):
    """A circular conv token embedding over time, then attention over the steps."""

    def __init__(self, channels, d_model, heads, bug=None, padding_mode="circular"):
        super().__init__()
        self.bug = bug
        self.embed = nn.Conv1d(channels, d_model, 3, padding=1, padding_mode=padding_mode)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)

    def forward(self, x):  # x: [batch, steps, channels]
        B, T, C = x.shape
        # The bug: a view for the permute, which mixes the steps with the channels.
        series = x.reshape(B, C, T) if self.bug == "view" else x.permute(0, 2, 1)
        h = self.embed(series).transpose(1, 2)  # [batch, steps, d_model]
        y, _ = self.attn(h, h, h, need_weights=False)
        return y


def _conv_case(size, bug=None, padding_mode="circular"):
    b, t, c, d, h = SIZES[size]
    torch.manual_seed(0)
    return ConvEmbedded(c, d, h, bug, padding_mode).eval(), torch.randn(b, t, c)


@pytest.mark.parametrize("size", SIZES)
def test_a_conv_along_the_tokens_makes_token_permutation_not_apply(size):
    module, x = _conv_case(size, padding_mode="zeros")
    got = result(check(module, x), "token-permutation equivariance")
    assert got.status == "skipped" and not got.applicable, got.message
    seq = SIZES[size][1]
    assert got.message.startswith("conv1d at ") and "test_probe_false_alarms.py:" in got.message
    assert "(embed)" in got.message
    assert f"has a kernel of 3 along seq (axis 2 of its output, the {seq} tokens)" in got.message
    assert "it mixes neighbouring positions" in got.message


def test_a_circular_conv_along_the_tokens_makes_token_permutation_not_apply():
    """Informer's embedding: F.pad(mode="circular") inside the conv, then the conv itself."""
    module, x = _conv_case("distinct")
    got = result(check(module, x), "token-permutation equivariance")
    assert got.status == "skipped" and not got.applicable, got.message
    assert got.message.startswith("conv1d at ")
    assert "has a kernel of 3 along seq (axis 2 of its output, the 7 tokens)" in got.message


@pytest.mark.parametrize("size", ["coincident", "realistic"])
def test_a_circular_conv_never_fails_token_permutation(size):
    """Where the circular pad's new axis hides which input axis the conv's output holds,
    the probe does not apply for that reason instead: no failure either way."""
    module, x = _conv_case(size)
    got = result(check(module, x), "token-permutation equivariance")
    assert got.status == "skipped" and not got.applicable, got.message
    assert "conv1d at " in got.message or "keep none of the inputs' token axes" in got.message


@pytest.mark.no_shapeguard  # the view warns, on purpose
def test_a_view_across_the_tokens_before_the_conv_still_fails():
    module, x = _conv_case("distinct", bug="view")
    got = result(check(module, x), "token-permutation equivariance")
    assert got.status == "failed", got.message
    assert "permuting the tokens moved the outputs" in got.message


class DenseGraphAttention(nn.Module):
    """A dense GAT layer on node features [nodes, features] and adj[target, source]."""

    def __init__(self, features, heads, d_k, bug=None):
        super().__init__()
        self.heads, self.d_k, self.bug = heads, d_k, bug
        self.W = nn.Linear(features, heads * d_k, bias=False)
        self.a_src = nn.Parameter(torch.randn(heads, d_k) * 0.1)
        self.a_dst = nn.Parameter(torch.randn(heads, d_k) * 0.1)

    def forward(self, x, adj):
        N = x.shape[0]
        Wh = self.W(x).view(N, self.heads, self.d_k).transpose(0, 1)  # [heads, nodes, d_k]
        e_src = (Wh * self.a_src[:, None, :]).sum(-1)  # [heads, nodes]
        e_dst = (Wh * self.a_dst[:, None, :]).sum(-1)
        e = F.leaky_relu(e_dst[:, :, None] + e_src[:, None, :], 0.2)  # [heads, target, source]
        attention = torch.softmax(e.masked_fill(adj[None] == 0, float("-inf")), dim=-1)
        out = attention @ Wh  # sums over the source nodes: nodes see their neighbours
        return out.transpose(0, 1).reshape(N, self.heads * self.d_k)


def _graph_case(size):
    _, n, c, d, h = SIZES[size]
    torch.manual_seed(0)
    adj = (torch.rand(n, n) < 0.5).float()
    adj.fill_diagonal_(1.0)  # every node attends to itself: no empty softmax row
    return DenseGraphAttention(c, h, d // h).eval(), torch.randn(n, c), adj


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("probe", ["batch independence", "sub-batch consistency"])
def test_nodes_a_product_contracts_are_not_a_batch(size, probe):
    module, x, adj = _graph_case(size)
    got = result(check(module, x, adj), probe)
    assert got.status == "skipped" and not got.applicable, got.message
    n, c = SIZES[size][1], SIZES[size][2]
    assert got.message.startswith(f"axis 0 of x [{n}, {c}] is contracted by matmul at ")
    assert "test_probe_false_alarms.py:" in got.message and "(DenseGraphAttention)" in got.message
    assert got.message.endswith(
        ": the examples are not independent along it (the batch-first convention alone named "
        "it the batch)"
    )


class BatchMixing(nn.Module):
    """Attention over [batch, seq, d_model]; the bug: each example adds a softmax-weighted
    sum of the other examples' mean states (a product that contracts the batch)."""

    def __init__(self, d_model, heads, bug=None):
        super().__init__()
        self.heads, self.bug = heads, bug
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        if self.bug == "batch":
            g = y.mean(1)  # [batch, d_model]
            y = y + (torch.softmax(g @ g.T, dim=-1) @ g)[:, None, :]
        return self.out(y)


@pytest.mark.no_shapeguard  # the trace warns on the bug's softmax over the batch too
@pytest.mark.parametrize("bug", [None, "batch"])
@pytest.mark.parametrize("size", SIZES)
def test_a_batch_the_attention_establishes_still_fails_when_a_product_contracts_it(size, bug):
    b, t, _, d, h = SIZES[size]
    torch.manual_seed(0)
    report = check(BatchMixing(d, h, bug).eval(), torch.randn(b, t, d))
    got = result(report, "batch independence")
    assert got.status == ("failed" if bug else "passed"), got.message
    if bug:
        assert "moved the other examples' outputs" in got.message
