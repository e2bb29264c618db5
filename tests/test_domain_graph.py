"""Graph attention over an edge index (issue 32): a softmax grouped by one row of
`edge_index`, the messages summed into the nodes of the other (`edge_weights_other_side`).

The bugs and their fixes in two styles at the three size settings are
tests/rule_cases.py's `GraphAttention` (tests/test_rule_registry.py runs them); here:
the message, torch_geometric's own layers and helpers (silent where correct, found where
written wrong), and the cases where structure gives no claim.
"""

import warnings

import bug_zoo as zoo
import domain_zoo_graphs as zoo_graphs
import domain_zoo_sizes as zoo_sizes
import pytest
import rule_cases
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

KIND = "edge_weights_other_side"


def findings(model, *args) -> list:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return list(shapeguard.trace(model, *args).findings)


def kinds(model, *args) -> list[str]:
    return [f.kind for f in findings(model, *args)]


def gat(style="index_add", bug=None, sizes=zoo.DISTINCT):
    torch.manual_seed(0)
    return rule_cases.GraphAttention(sizes.d_model, sizes.heads, style, bug)


@pytest.mark.parametrize("style", ["index_add", "scatter_add"])
def test_the_message_names_both_rows_the_operands_and_the_fix(style):
    x, edge_index = rule_cases.graph_inputs(zoo.DISTINCT)
    (finding,) = findings(gat(style, "edge_softmax"), x, edge_index)
    assert finding.kind == KIND and finding.severity == "warning"
    over, into = ("1", "0") if style == "index_add" else ("0", "1")
    assert finding.relation == (
        f"msg carries weights normalised over the edges that share edge_index[{over}], "
        f"summed into the nodes of edge_index[{into}]: the weights each node receives do "
        "not sum to 1"
    )
    edges = edge_index.shape[1]
    assert [o.name for o in finding.operands] == ["msg", f"edge_index[{into}]"]
    assert finding.operands[0].shape.startswith("[") and f"{edges}" in finding.operands[0].shape
    assert finding.hint == (
        f"group the softmax by the index the aggregation scatters to (edge_index[{into}]), "
        f"or scatter the messages by the index the softmax was grouped by "
        f"(edge_index[{over}])"
    )
    assert "tensor(" not in str(finding)  # shapes, never values


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("style", ["index_add", "scatter_add"])
def test_the_correct_layer_is_silent_and_a_rerun_finds_the_bug_again(style, sizes):
    x, edge_index = rule_cases.graph_inputs(sizes)
    assert findings(gat(style, sizes=sizes), x, edge_index) == []
    buggy = gat(style, "edge_softmax", sizes)
    # The second run records, the third replays: the finding holds on each.
    assert [kinds(buggy, x, edge_index) for _ in range(3)] == [[KIND]] * 3


class Separate(nn.Module):
    """A softmax grouped by one index and a sum by another, the indices given apart: no
    tensor of which both are rows, so no claim."""

    def forward(self, e, msg, group, into):
        nodes = int(group.max()) + 1
        w = e.exp()
        alpha = w / w.new_zeros(nodes).index_add_(0, group, w).index_select(0, group)
        return msg.new_zeros(nodes, msg.shape[1]).index_add_(0, into, msg * alpha[:, None])


def test_indices_of_no_common_tensor_and_one_row_twice_give_no_claim():
    x, edge_index = rule_cases.graph_inputs(zoo.DISTINCT)
    edges = edge_index.shape[1]
    e, msg = torch.randn(edges), torch.randn(edges, 3)
    src, dst = edge_index[0].clone(), edge_index[1].clone()
    assert kinds(Separate(), e, msg, src, dst) == []
    assert kinds(Separate(), e, msg, dst, dst) == []


class RandomWalk(nn.Module):
    """`D^-1 A` propagation: edge weights divided by the out-degree of their source and
    summed into the targets, by design (each source's mass is conserved). Not a softmax:
    no claim."""

    def forward(self, x, edge_index, edge_weight):
        row, col = edge_index
        deg = edge_weight.new_zeros(x.shape[0]).index_add_(0, row, edge_weight)
        norm = edge_weight / deg.index_select(0, row)
        msg = x.index_select(0, row) * norm[:, None]
        return x.new_zeros(x.shape).index_add_(0, col, msg)


def test_a_normalisation_that_is_no_softmax_gives_no_claim():
    x, edge_index = rule_cases.graph_inputs(zoo.DISTINCT)
    weight = torch.rand(edge_index.shape[1]) + 0.5
    assert kinds(RandomWalk(), x, edge_index, weight) == []


class Spelled2(nn.Module):
    """A GAT softmax written without torch_geometric as the domain zoo's SparseGAT writes it
    (a max by `scatter_reduce`, the denominators by an out-of-place `index_add`, read back by
    `total[group]` (or `total[group, :]`), the weights widened by `alpha[..., None]`), in other spellings of the
    same effect: the sums by `index_add_`, `scatter_add(_)` over an index widened by
    `group[:, None]`, or `scatter_reduce(..., "sum")`; read back by `index_select` or
    `gather`; guarded by an epsilon or a clamp. The softmax groups by `group`, the messages
    are summed into the targets."""

    def __init__(self, sums="index_add", read="getitem", guard="", heads=2):
        super().__init__()
        self.sums, self.read, self.guard, self.heads = sums, read, guard, heads

    def _total(self, alpha, group, nodes):
        wide = group[:, None].expand(-1, self.heads)
        zeros = torch.zeros(nodes, self.heads)
        if self.sums == "index_add":
            return zeros.index_add(0, group, alpha)
        if self.sums == "index_add_":
            return zeros.index_add_(0, group, alpha)
        if self.sums == "scatter_add":
            return zeros.scatter_add(0, wide, alpha)
        if self.sums == "scatter_add_":
            return zeros.scatter_add_(0, wide, alpha)
        return zeros.scatter_reduce(0, wide, alpha, "sum")

    def forward(self, x, edge_index, group_row):
        nodes = x.shape[0]
        src, dst = edge_index
        group = edge_index[group_row]
        scores = (x[src] * x[dst]).sum(-1)[:, None].expand(-1, self.heads)  # [edges, heads]
        top = torch.full((nodes, self.heads), float("-inf")).scatter_reduce(
            0, group[:, None].expand(-1, self.heads), scores, "amax"
        )
        alpha = (scores - top[group]).exp()
        total = self._total(alpha, group, nodes)
        if self.guard == "clamp":
            total = total.clamp(min=1e-16)
        if self.read == "getitem":
            denominators = total[group]
        elif self.read == "getitem_slices":
            denominators = total[group, :]
        elif self.read == "index_select":
            denominators = total.index_select(0, group)
        else:
            denominators = total.gather(0, group[:, None].expand(-1, self.heads))
        if self.guard == "eps":
            denominators = denominators + 1e-16
        alpha = alpha / denominators
        messages = alpha[..., None] * x[src][:, None, :]  # [edges, heads, features]
        return torch.zeros(nodes, self.heads, x.shape[1]).index_add(0, dst, messages)


SPELLINGS = [
    ("index_add", "getitem", ""),
    ("index_add_", "index_select", "eps"),
    ("scatter_add", "gather", ""),
    ("scatter_add_", "getitem", "clamp"),
    ("scatter_reduce", "getitem_slices", "eps"),
]


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("spelling", SPELLINGS, ids="-".join)
def test_a_softmax_spelled_without_torch_geometric_is_followed(spelling, sizes):
    x, edge_index = rule_cases.graph_inputs(sizes)
    model = Spelled2(*spelling, heads=sizes.heads)
    assert findings(model, x, edge_index, 1) == []
    (finding,) = findings(model, x, edge_index, 0)
    assert finding.kind == KIND
    assert finding.relation == (
        "messages carries weights normalised over the edges that share edge_index[0], "
        "summed into the nodes of edge_index[1]: the weights each node receives do not "
        "sum to 1"
    )
    assert "index_add(0, dst, messages)" in finding.source
    assert [o.name for o in finding.operands] == ["messages", "edge_index[1]"]
    assert finding.hint.startswith("group the softmax by the index the aggregation scatters ")
    # The next runs replay the recorded steps: the finding holds on each.
    assert [kinds(model, x, edge_index, 0) for _ in range(2)] == [[KIND]] * 2


# -- a graph's node axis is shown as nodes ------------------------------------------------
# Node features [N, F] read as [batch, features] by the batch-first convention; where
# structure shows the first axis holds the nodes, tables and messages call it `nodes`,
# while every rule keeps the conventional reading (`record.axes`).


def traced(model, *args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args)


@pytest.mark.parametrize("sizes", zoo_sizes.SETTINGS, ids=lambda s: s.name)
def test_a_dense_gat_shows_its_nodes_in_the_table_and_the_messages(sizes):
    """The adjacency-masked [heads, N, N] weights contract Wh's first axis: nodes. The
    decisions are the conventional reading's: the same finding, `axes` still batch."""
    torch.manual_seed(0)
    n, h, d = sizes.seq, sizes.heads, sizes.d_k
    trace = traced(zoo_graphs.DenseGAT(sizes), *zoo_graphs.dense_inputs(sizes))
    (wh, *_) = trace.records("Wh")
    assert wh.named_shape == f"[nodes={n}, {h * d}]"
    assert wh.axes[0] == "batch"  # what the rules read
    assert trace.records("attention")[0].named_shape == f"[heads={h}, nodes={n}, nodes={n}]"
    assert f"nodes={n}" in trace.table(all_ops=True, width=200)
    assert f"batch={n}" not in trace.table(all_ops=True, width=200)
    assert trace.findings == []

    buggy = zoo_graphs.DenseGAT(sizes, "gat_softmax_side")
    for _ in range(3):  # recorded, then replayed: the same message each time
        (finding,) = traced(buggy, *zoo_graphs.dense_inputs(sizes)).findings
        assert finding.kind == "aggregation_axis"
        assert finding.relation.startswith(
            f"attention @ Wh sums attention over dim -1 (nodes={n}), but its softmax made "
            f"it sum to 1 over dim -2 (nodes={n})"
        )
        assert [o.shape for o in finding.operands] == [
            f"[heads={h}, nodes={n}, nodes={n}] float32",
            f"[heads={h}, nodes={n}, d_k={d}] float32",
        ]


class EinsumGAT(nn.Module):
    """A dense GAT aggregating by einsum: the [heads, N, N] weights contract the nodes."""

    def __init__(self, sizes):
        super().__init__()
        self.heads, self.d_k = sizes.heads, sizes.d_k
        self.W = nn.Linear(sizes.in_channels, sizes.heads * sizes.d_k, bias=False)

    def forward(self, x, adj):
        N = x.shape[0]
        Wh = self.W(x).view(N, self.heads, self.d_k)  # [N, heads, d_k]
        a = Wh.sum(-1).transpose(0, 1)  # [heads, N]: additive scores, as GAT's
        e = (a[:, :, None] + a[:, None, :]).masked_fill(adj[None] == 0, float("-inf"))
        attention = torch.softmax(e, dim=-1)
        return torch.einsum("hij,jhd->ihd", attention, Wh).reshape(N, -1)


@pytest.mark.parametrize("sizes", zoo_sizes.SETTINGS, ids=lambda s: s.name)
def test_an_einsum_over_the_nodes_shows_them(sizes):
    torch.manual_seed(0)
    n, h, d = sizes.seq, sizes.heads, sizes.d_k
    trace = traced(EinsumGAT(sizes), *zoo_graphs.dense_inputs(sizes))
    assert trace.records("Wh")[-1].named_shape == f"[nodes={n}, heads={h}, d_k={d}]"
    assert trace.findings == []


def test_a_heads_merge_across_the_nodes_says_nodes():
    sizes = zoo_sizes.DISTINCT
    n, h, d = sizes.seq, sizes.heads, sizes.d_k
    model = zoo_graphs.DenseGAT(sizes, "gat_heads_merge")
    (finding,) = traced(model, *zoo_graphs.dense_inputs(sizes)).findings
    assert finding.relation == (
        f"out.reshape({n}, {h * d}): regroups [heads={h}, nodes={n}, d_k={d}] as "
        f"[{n}, {h * d}], moving data across the nodes axis"
    )
    assert finding.operands[0].shape == f"[heads={h}, nodes={n}, d_k={d}] float32"


@pytest.mark.parametrize("sizes", zoo_sizes.SETTINGS, ids=lambda s: s.name)
def test_a_sparse_gat_shows_the_nodes_its_edge_index_addresses(sizes):
    torch.manual_seed(0)
    n, h, d = sizes.seq, sizes.heads, sizes.d_k
    trace = traced(zoo_graphs.SparseGAT(sizes), *zoo_graphs.sparse_inputs(sizes))
    assert trace.records("Wh")[1].named_shape == f"[nodes={n}, heads={h}, d_k={d}]"
    assert trace.findings == []


class NoGraph(nn.Module):
    """A batch [B, F] picked by a permutation (mixup), and its Gram matrix over the
    features and over the batch: no edge index, no [N, N] weights over one axis."""

    def forward(self, x):
        mixed = 0.5 * (x + x[torch.randperm(x.shape[0])])
        gram = x.transpose(0, 1) @ x  # [F, F]: the batch contracted with itself
        return mixed @ gram


@pytest.mark.parametrize("sizes", zoo_sizes.SETTINGS, ids=lambda s: s.name)
def test_a_batch_without_graph_structure_keeps_its_conventional_name(sizes):
    x = torch.randn(sizes.batch, sizes.d_model)
    table = traced(NoGraph(), x).table(all_ops=True, width=200)
    assert f"batch={sizes.batch}" in table and "nodes" not in table


# -- torch_geometric ---------------------------------------------------------------------
pyg = pytest.importorskip("torch_geometric")


class PygStyle(nn.Module):
    """Edge attention written with torch_geometric's helpers: `softmax(src, index)` and
    `scatter(..., reduce="sum")`; `grouped` and `into` pick the rows."""

    def __init__(self, d_model, grouped=1, into=1):
        super().__init__()
        self.grouped, self.into = grouped, into
        self.lin = nn.Linear(d_model, d_model)
        self.att = nn.Linear(2 * d_model, 1)

    def forward(self, x, edge_index):
        from torch_geometric.utils import scatter, softmax

        N = x.shape[0]
        h = self.lin(x)
        x_j, x_i = h.index_select(0, edge_index[0]), h.index_select(0, edge_index[1])
        e = F.leaky_relu(self.att(torch.cat([x_i, x_j], dim=-1)), 0.2)  # [edges, 1]
        alpha = softmax(e, edge_index[self.grouped], num_nodes=N)
        return scatter(x_j * alpha, edge_index[self.into], dim=0, dim_size=N, reduce="sum")


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
def test_torch_geometric_softmax_and_scatter(sizes):
    x, edge_index = rule_cases.graph_inputs(sizes)
    torch.manual_seed(0)
    assert kinds(PygStyle(sizes.d_model), x, edge_index) == []
    assert kinds(PygStyle(sizes.d_model, grouped=0, into=0), x, edge_index) == []
    (finding,) = findings(PygStyle(sizes.d_model, grouped=0, into=1), x, edge_index)
    assert finding.kind == KIND
    assert "share edge_index[0], summed into the nodes of edge_index[1]" in finding.relation


def _layers(sizes):
    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    d, h = sizes.d_model, sizes.heads
    yield "GATConv", GATConv(d, sizes.d_k, heads=h), False
    yield "GATConv no loops", GATConv(d, sizes.d_k, heads=h, add_self_loops=False), False
    yield "GATConv edge_attr", GATConv(d, sizes.d_k, heads=h, edge_dim=3), True
    yield "GATv2Conv", GATv2Conv(d, sizes.d_k, heads=h), False
    yield "GATv2Conv edge_attr", GATv2Conv(d, sizes.d_k, heads=h, edge_dim=3), True
    yield "TransformerConv", TransformerConv(d, sizes.d_k, heads=h), False
    yield "TransformerConv edge_attr", TransformerConv(d, sizes.d_k, heads=h, edge_dim=3), True


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
def test_torch_geometric_attention_layers_are_silent(sizes):
    x, edge_index = rule_cases.graph_inputs(sizes)
    edge_attr = torch.randn(edge_index.shape[1], 3)
    torch.manual_seed(0)
    for name, layer, with_attr in _layers(sizes):
        args = (x, edge_index, edge_attr) if with_attr else (x, edge_index)
        assert findings(layer.eval(), *args) == [], name


def test_torch_geometric_gatconv_silence_is_measured_not_blind(monkeypatch):
    """GATConv is silent because the trace saw its softmax reach its aggregation by the
    same row, not because it saw nothing."""
    from torch_geometric.nn import GATConv

    from shapeguard._trace import grouping

    seen = []
    carried = grouping.carried

    def recording(call, in_metas, count):
        made = carried(call, in_metas, count)
        seen.append((call.spec.name, [m.grouped[:1] for m in in_metas if m is not None]))
        return made

    monkeypatch.setattr(grouping, "carried", recording)
    x, edge_index = rule_cases.graph_inputs(zoo.DISTINCT)
    torch.manual_seed(0)
    assert findings(GATConv(zoo.DISTINCT.d_model, 4, heads=2).eval(), x, edge_index) == []
    scatters = [states for op, states in seen if op == "scatter_add"]
    assert [("row",), ("normalised",)] in [states[1:] for states in scatters]


class Spelled(nn.Module):
    """Softmax by the sources, sum into the targets, the rows spelled `spelling`."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling

    def forward(self, x, edge_index):
        if self.spelling == "select":
            src, dst = edge_index.select(0, 0), edge_index.select(0, -1)
        elif self.spelling == "slices":
            src, dst = edge_index[0, :], edge_index[-1, :]
        else:
            src, dst = edge_index.unbind(0)
        w = (x.index_select(0, src) * x.index_select(0, dst)).sum(-1).exp()
        alpha = w / w.new_zeros(x.shape[0]).index_add_(0, src, w).index_select(0, src)
        msg = x.index_select(0, src) * alpha.unsqueeze(-1)
        return x.new_zeros(x.shape).index_add_(0, dst, msg)


@pytest.mark.parametrize("spelling", ["select", "slices", "unbind"])
def test_each_way_of_taking_a_row_is_one_row(spelling):
    x, edge_index = rule_cases.graph_inputs(zoo.DISTINCT)
    (finding,) = findings(Spelled(spelling), x, edge_index)
    assert finding.kind == KIND
    assert "share edge_index[0], summed into the nodes of edge_index[1]" in finding.relation
