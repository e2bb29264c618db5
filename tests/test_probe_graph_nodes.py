"""Node-relabelling equivariance: the probe graph layers hold (issue 32, s40-graphprobe).

A graph layer has no batch axis; what it promises is that node ids are labels and edges a
set. Where structure shows a graph (an edge list whose values pick node rows, or an
adjacency over a floating input's axis), relabelling the nodes must permute the
node-indexed outputs alike, and reordering the edges change nothing. It holds on
torch_geometric's GATConv, GATv2Conv and TransformerConv and on the domain zoo's dense and
sparse GATs at the three size settings, and fails on layers that mix nodes by position.
"""

import domain_zoo_graphs as graphs
import pytest
import torch
from domain_zoo_sizes import COINCIDENT, DISTINCT, REALISTIC
from test_probe_graph_rows import GraphAttention, RolledRows
from torch import nn

from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

NAME = "node-relabelling equivariance"
ZOO_SIZES = [DISTINCT, COINCIDENT, REALISTIC]
# nodes, heads, d_k: pairwise distinct; coincident; realistic.
SIZES = {"distinct": (7, 3, 5), "coincident": (4, 4, 4), "realistic": (64, 8, 64)}


def probe(model, *inputs):
    report = check(model, *inputs)
    result = next(r for r in report.results if r.name == NAME)
    return report, result


def random_graph(nodes: int, features: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=g)
    return x, torch.randint(0, nodes, (2, 3 * nodes), generator=g)


@pytest.mark.parametrize("s", ZOO_SIZES, ids=lambda s: s.name)
def test_the_zoo_gats_hold_at_every_size(s):
    torch.manual_seed(0)
    report, got = probe(graphs.SparseGAT(s), *graphs.sparse_inputs(s))
    assert got.status == "passed", report.render(width=200)
    assert got.message.startswith(
        f"relabelling the nodes (nodes along x [{s.seq}, {s.in_channels}] (axis 0); edge_index "
    ), got.message
    assert "permuted the node-indexed outputs alike" in got.message
    assert "and reordering the edges left them unchanged" in got.message
    report, got = probe(graphs.DenseGAT(s), *graphs.dense_inputs(s))
    assert got.status == "passed", report.render(width=200)
    assert got.message.startswith(
        f"relabelling the nodes (nodes along x [{s.seq}, {s.in_channels}] (axis 0), "
        f"adj [{s.seq}, {s.seq}] (axis 0, 1); adj is an adjacency) permuted the node-indexed "
        "outputs alike (deviation "
    ), got.message
    assert report.passed


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("layer", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_torch_geometric_attention_layers_hold(layer, size):
    pyg = pytest.importorskip("torch_geometric.nn")
    nodes, heads, d_k = SIZES[size]
    torch.manual_seed(0)
    model = getattr(pyg, layer)(12, d_k, heads=heads)
    report, got = probe(model, *random_graph(nodes, 12))
    assert got.status == "passed", report.render(width=200)
    assert f"edge_index [2, {3 * nodes}] holds node ids)" in got.message, got.message
    assert report.passed and not report.findings


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("style", ["index_select", "subscript"])
def test_a_hand_written_graph_attention_holds(size, style):
    nodes, heads, d_k = SIZES[size]
    torch.manual_seed(0)
    _, got = probe(GraphAttention(heads, d_k, style), *random_graph(nodes, heads * d_k))
    assert got.status == "passed", got.message


class NeighbourByPosition(GraphAttention):
    """Adds each node's predecessor in index order: a neighbour read by position, not
    through the edge list (the kind of layer that only works on a chain numbered in order)."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        out = super().forward(x, edge_index)
        return out + out.roll(1, dims=0)


class PairsSwapped(GraphAttention):
    """A view across the node axis: node rows regrouped in pairs and swapped, as a wrong
    `view` that moves data between nodes does."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        out = super().forward(x, edge_index)
        n = out.shape[0]
        return out.view(n // 2, 2, -1).flip(1).reshape(n, -1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bug", [NeighbourByPosition, PairsSwapped])
def test_a_layer_that_mixes_nodes_by_position_fails(bug, size):
    nodes, heads, d_k = SIZES[size]
    nodes += nodes % 2
    torch.manual_seed(0)
    report, got = probe(bug(heads, d_k, "index_select"), *random_graph(nodes, heads * d_k))
    assert got.status == "failed", report.render(width=200)
    lines = got.message.splitlines()
    assert lines[0].startswith(
        f"relabelling the nodes (nodes along x [{nodes}, {heads * d_k}] (axis 0); edge_index "
        f"[2, {3 * nodes}] holds node ids) moved the node-indexed outputs (permuted back) by "
    ), got.message
    assert lines[-1] == (
        "  hint: a graph layer treats node ids as labels: a view or reshape across the node "
        "axis, a node's neighbours read by their position rather than through the edge list, "
        "or a node count read from the edge list's largest value, breaks that"
    )
    assert not report.passed


class EdgeOrderSoftmax(GraphAttention):
    """Normalises each edge's score over a running window of the edge list (a cumulative
    sum where a per-target sum belongs): the edges' order leaks into the output."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        src, dst = edge_index[0], edge_index[1]
        v = self.v(x)
        score = (self.q(x)[dst] * self.k(x)[src]).sum(-1).exp()
        weight = score / score.cumsum(0)
        out = v.new_zeros(n, v.shape[-1]).index_add_(0, dst, v[src] * weight[:, None])
        return out + self.skip(x)


def test_an_aggregation_that_depends_on_the_edge_order_fails():
    torch.manual_seed(0)
    report, got = probe(EdgeOrderSoftmax(3, 5, "subscript"), *random_graph(7, 15))
    assert got.status == "failed", report.render(width=200)
    lines = got.message.splitlines()
    assert lines[0].startswith(
        "relabelling the nodes (nodes along x [7, 15] (axis 0); edge_index [2, 21] holds node "
        "ids), then reordering the edges (edge_index columns permuted) moved the outputs by "
    ), got.message
    assert lines[-1].startswith("  hint: the edges are a set: an aggregation that depends on")


def test_edge_attributes_move_with_their_edges():
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    model = pyg.TransformerConv(12, 5, heads=3, edge_dim=4)
    x, edge_index = random_graph(9, 12)
    report, got = probe(model, x, edge_index, torch.randn(edge_index.shape[1], 4))
    assert got.status == "passed", report.render(width=200)
    assert "and reordering the edges left them unchanged" in got.message


class TableRows(nn.Module):
    """A language model's ids, [batch=2, seq], picking rows of its embedding table: an
    integer input with an axis of 2 whose values pick rows, but of no input's."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, 12))
        self.attn = nn.MultiheadAttention(12, 3, batch_first=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.table[ids]
        return self.attn(h, h, h)[0]


def test_ids_picking_table_rows_are_no_edge_list():
    torch.manual_seed(0)
    _, got = probe(TableRows(), torch.randint(0, 50, (2, 5)))
    assert got.status == "skipped", got.message
    assert got.message.startswith("no input is a graph: no [2, edges] integer input"), got.message


class MeanReadout(nn.Module):
    """Graph attention, then the mean over the nodes: a graph-level vector."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = GraphAttention(3, 5, "index_select")
        self.head = nn.Linear(15, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x, edge_index).mean(0))


def test_a_graph_level_output_is_invariant():
    torch.manual_seed(0)
    _, got = probe(MeanReadout(), *random_graph(7, 15))
    assert got.status == "passed", got.message
    assert "left the graph-level outputs unchanged (deviation " in got.message


def test_not_applicable_without_a_graph_names_what_it_saw():
    torch.manual_seed(0)
    _, got = probe(RolledRows(3, 5), torch.randn(7, 15))
    assert got.status == "skipped" and not got.applicable
    assert got.message == (
        "no input is a graph: no [2, edges] integer input whose values pick rows, and no "
        "adjacency (an input with two axes that are one axis of a floating input)"
    )
    attn = nn.MultiheadAttention(12, 3, batch_first=True)
    x = torch.randn(2, 5, 12)
    _, got = probe(attn, x, x, x)
    assert got.status == "skipped", got.message


class NodeTable(GraphAttention):
    """A learned embedding per node index (a transductive layer): nodes have identities."""

    def __init__(self, nodes: int) -> None:
        super().__init__(3, 5, "index_select")
        self.table = nn.Embedding(nodes, 15)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(x.shape[0])
        return super().forward(x + self.table(ids), edge_index)


def test_nodes_with_identities_are_not_applicable():
    torch.manual_seed(0)
    _, got = probe(NodeTable(7), *random_graph(7, 15))
    assert got.status == "skipped", got.message
    assert got.message.startswith("edge_index [2, 21] picks rows (index_select at "), got.message
    assert got.message.endswith(
        "of an axis the trace takes for a sequence's tokens (positions are made along it), "
        "not a graph's nodes"
    )


class NodeBias(GraphAttention):
    """A learned bias per node (a transductive layer), gathered by an index it makes."""

    def __init__(self, nodes: int) -> None:
        super().__init__(3, 5, "index_select")
        self.bias = nn.Parameter(torch.randn(nodes, 15))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return super().forward(x, edge_index) + self.bias


def test_a_parameter_along_the_nodes_is_not_applicable():
    torch.manual_seed(0)
    _, got = probe(NodeBias(7), *random_graph(7, 15))
    assert got.status == "skipped", got.message
    assert got.message == "the parameter or buffer bias [7, 15] runs along the nodes"


class MaskedSelfAttention(nn.Module):
    """Attention over one sequence's tokens with a given [seq, seq] mask: its two axes are
    the tokens' one dim, as an adjacency's are the nodes'. With sinusoidal positions the
    tokens are no graph's nodes; without, the mask is an adjacency and relabelling holds."""

    def __init__(self, positions: bool) -> None:
        super().__init__()
        self.positions = positions
        self.q, self.k, self.v = (nn.Linear(12, 12) for _ in range(3))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.positions:
            x = x + torch.sin(torch.arange(x.shape[0], dtype=x.dtype))[:, None]
        scores = (self.q(x) @ self.k(x).T).masked_fill(mask, float("-inf"))
        return scores.softmax(-1) @ self.v(x)


def test_a_sequence_mask_with_positions_is_no_adjacency():
    torch.manual_seed(0)
    mask = torch.rand(5, 5) > 0.5
    mask.fill_diagonal_(False)
    _, got = probe(MaskedSelfAttention(positions=True), torch.randn(5, 12), mask)
    assert got.status == "skipped", got.message
    assert got.message.startswith(
        "mask has two axes that are one axis of the inputs (an adjacency), but the module has "
        "positional terms (arange at "
    ), got.message
    _, got = probe(MaskedSelfAttention(positions=False), torch.randn(5, 12), mask)
    assert got.status == "passed", got.message
    assert "mask is an adjacency) permuted the node-indexed outputs alike" in got.message


class TwoNodeSets(nn.Module):
    """Messages from source nodes to a different set of target nodes (bipartite)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x_src, x_dst, edge_index):
        out = torch.zeros_like(x_dst).index_add_(0, edge_index[1], self.proj(x_src)[edge_index[0]])
        return out + x_dst


def test_two_node_sets_are_not_applicable():
    g = torch.Generator().manual_seed(0)
    x_src, x_dst = torch.randn(7, 6, generator=g), torch.randn(5, 6, generator=g)
    edge_index = torch.stack([torch.randint(0, 7, (12,)), torch.randint(0, 5, (12,))])
    _, got = probe(TwoNodeSets(), x_src, x_dst, edge_index)
    assert got.status == "skipped", got.message
    assert "two node sets (a bipartite graph)" in got.message, got.message


def test_the_caller_module_and_rng_are_left_alone():
    torch.manual_seed(0)
    model = GraphAttention(3, 5, "index_select")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, edge_index = random_graph(7, 15)
    before = (x.clone(), edge_index.clone(), torch.get_rng_state())
    probe(model, x, edge_index)
    assert torch.equal(x, before[0]) and torch.equal(edge_index, before[1])
    assert torch.equal(torch.get_rng_state(), before[2])
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
