"""Rows addressed by an input's values are not a batch (issue 26, world corpus).

torch-geometric's TransformerConv takes `x [nodes, features]` and `edge_index [2, edges]`.
The batch-first convention names axis 0 of `x` the batch, but the module reads each node's
neighbours through the edge index: changing one node moves the others, as it must. With
nothing but the convention to say that the rows are examples, the batch probes are
inconclusive and say why; where the module mixes its rows by an index of its own (not an
input's values), the failure stands. `edge_index`'s leading 2 is no batch axis either: a
sub-batch cut along it crashed the probe.
"""

import pytest
import torch
from torch import nn

from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

# batch (here: nodes per graph scale), heads, seq, d_k: pairwise distinct; coincident; realistic.
SIZES = {
    "distinct": (2, 3, 5, 4),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
STYLES = ["index_select", "subscript"]


def result(report, name):
    return next(r for r in report.results if r.name == name)


class GraphAttention(nn.Module):
    """Attention of each node over its in-neighbours, plus a skip projection (as
    TransformerConv): messages gathered by the edge index, summed back per target."""

    def __init__(self, heads: int, d_k: int, style: str) -> None:
        super().__init__()
        self.h, self.d_k, self.style = heads, d_k, style
        d = heads * d_k
        self.q, self.k, self.v, self.skip = (nn.Linear(d, d) for _ in range(4))

    def rows(self, t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, index) if self.style == "index_select" else t[index]

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        src, dst = edge_index[0], edge_index[1]
        q = self.q(x).view(n, self.h, self.d_k)
        k = self.k(x).view(n, self.h, self.d_k)
        v = self.v(x).view(n, self.h, self.d_k)
        score = (self.rows(q, dst) * self.rows(k, src)).sum(-1) / self.d_k**0.5  # [E, h]
        weight = (score - score.max()).exp()
        total = weight.new_zeros(n, self.h).index_add_(0, dst, weight)
        weight = weight / self.rows(total, dst)
        message = self.rows(v, src) * weight.unsqueeze(-1)
        out = message.new_zeros(n, self.h, self.d_k)
        if self.style == "index_select":
            out = out.index_add_(0, dst, message)
        else:
            out = out.scatter_add_(0, dst.view(-1, 1, 1).expand_as(message), message)
        return out.reshape(n, -1) + self.skip(x)


class RolledRows(nn.Module):
    """Each row adds its neighbour's projection, picked by an index the module makes: the
    rows are the batch by convention, and this mixes them (a real batch-mixing bug)."""

    def __init__(self, heads: int, d_k: int) -> None:
        super().__init__()
        self.proj = nn.Linear(heads * d_k, heads * d_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = torch.arange(x.shape[0]).roll(1)
        return self.proj(x) + self.proj(x).index_select(0, shifted)


def graph(size: str):
    b, h, s, dk = SIZES[size]
    g = torch.Generator().manual_seed(0)
    nodes = b * s
    edges = torch.randint(0, nodes, (2, 3 * nodes), generator=g)
    return torch.randn(nodes, h * dk, generator=g), edges


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("size", list(SIZES))
def test_rows_read_through_an_edge_index_are_not_called_mixed_examples(size, style):
    _, h, _, dk = SIZES[size]
    torch.manual_seed(0)
    x, edges = graph(size)
    report = check(GraphAttention(h, dk, style), x, edges)
    for name in ("batch independence", "sub-batch consistency"):
        got = result(report, name)
        if x.shape[0] == x.shape[1]:
            # [16, 16] out: which axis holds the rows cannot be told, nothing is compared.
            assert got.status == "skipped", report.render(width=200)
            assert got.message == "no output has a batch axis whose examples can be told apart"
            continue
        assert got.status == "inconclusive", report.render(width=200)
        assert got.message.startswith(
            "axis 0 of x is the batch only by the batch-first convention, and "
        ), got.message
        assert "picks its rows by the values of edge_index" in got.message
        assert "not known to be separate examples" in got.message
    assert report.verdict != "failed"


@pytest.mark.parametrize("size", list(SIZES))
def test_rows_mixed_by_the_modules_own_index_still_fail(size):
    _, h, _, dk = SIZES[size]
    torch.manual_seed(0)
    x, _ = graph(size)
    report = check(RolledRows(h, dk), x)
    got = result(report, "batch independence")
    assert got.status == "failed", report.render(width=200)
    assert "moved the other examples' outputs" in got.message
    assert "first seen at add at tests/test_probe_graph_rows.py:" in got.message
