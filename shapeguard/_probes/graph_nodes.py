"""Node-relabelling equivariance: a graph layer treats node ids as labels, edges as a set.

Where structure shows a graph (`graph_layout`: an edge list whose values pick node rows,
or an adjacency over a floating input's axis), the probe relabels the nodes: the node
rows of every input are permuted, and the edge list's values mapped through the same
permutation (or the adjacency's rows and columns permuted); every node-indexed output
must come back permuted alike, and a graph-level output unchanged. With an edge list it
then reorders the edges (the edge list's columns, edge attributes alongside), which must
leave every output unchanged. A layer that mixes nodes by their position (a `view` across
the nodes) or reads a node's neighbours by position fails; one whose output axes cannot be
told node-indexed or graph-level is not applicable, and says what it saw.
"""

import torch

from .compare import deviation, scale_of
from .edits import derangement, take
from .graph_layout import Graph
from .result import ProbeResult, not_applicable
from .runs import call
from .subject import Subject
from .tree import leaves, rebuild

NAME = "node-relabelling equivariance"


def node_relabelling(s: Subject) -> ProbeResult:
    """Relabelling the nodes permutes the node-indexed outputs alike; reordering the
    edges changes nothing."""
    graph = s.graph
    if isinstance(graph, Exception):
        raise graph  # shapeguard's own crash while reading the graph: inconclusive
    if not isinstance(graph, Graph):
        return not_applicable(NAME, graph or "the trace shows no graph")
    if graph.nodes < 2:
        return not_applicable(NAME, f"{graph.seen}: a graph of one node has no relabelling")
    if not graph.outputs:
        return not_applicable(
            NAME,
            f"{graph.seen}; but no output is node-indexed or graph-level "
            f"({'; '.join(graph.left_out)})",
        )
    reference = _compared(graph, call(s.model, s.inputs, "the inputs as given"))
    order = derangement(graph.nodes, s.generator)
    relabelled = _relabelled(s, graph, order)
    got = _compared(graph, call(s.model, relabelled, "the nodes relabelled"))
    expected = {path: _permuted(t, graph.outputs[path], order) for path, t in reference.items()}
    dev = _deviation(s, got, expected)
    action = f"relabelling the nodes ({graph.seen})"
    target = _target(graph)
    if dev > s.rtol or graph.edge_list is None:
        result = s.result(
            NAME,
            dev,
            action,
            target,
            "a graph layer treats node ids as labels: a view or reshape across the node axis, "
            "a node's neighbours read by their position rather than through the edge list, "
            "or a node count read from the edge list's largest value, breaks that",
        )
        if result.status == "passed":
            result.message = f"{action} {_held(graph)} (deviation {dev:.1e})"
        return result
    edges = _reordered(s, graph)
    again = _compared(graph, call(s.model, edges, "the edges reordered"))
    moved = _deviation(s, again, reference)
    result = s.result(
        NAME,
        moved,
        f"{action}, then reordering the edges ({_edge_name(s, graph)} columns permuted)",
        "the outputs",
        "the edges are a set: an aggregation that depends on their order (a cumulative sum, "
        "a softmax or normalisation over a run of positions instead of each node's edges, "
        "edge attributes not moved with their edges) breaks that",
    )
    if result.status == "passed":
        result.message = (
            f"{action} {_held(graph)} (deviation {dev:.1e}), and reordering the edges left "
            f"them unchanged (deviation {moved:.1e})"
        )
    return result


def _node_indexed(graph) -> str:
    """Which outputs are node-indexed: "all", "none" or "some"."""
    node = [p for p, axes in graph.outputs.items() if axes]
    if node and len(node) == len(graph.outputs):
        return "all"
    return "some" if node else "none"


def _held(graph) -> str:
    """What a relabelling that passed did to the outputs, in words."""
    return {
        "all": "permuted the node-indexed outputs alike",
        "none": "left the graph-level outputs unchanged",
        "some": "permuted the node-indexed outputs alike and left the graph-level ones unchanged",
    }[_node_indexed(graph)]


def _target(graph) -> str:
    return {
        "all": "the node-indexed outputs (permuted back)",
        "none": "the graph-level outputs",
        "some": "the outputs (node-indexed ones permuted back)",
    }[_node_indexed(graph)]


def _edge_name(s: Subject, graph) -> str:
    leaf = s.layout.leaves.get(graph.edge_list)
    return leaf.name if leaf is not None else "the edge list's"


def _relabelled(s: Subject, graph, order: torch.Tensor):
    """The inputs with node k of the relabelled graph the old node order[k]."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())

    def relabel(path, t):
        if path == graph.edge_list:
            return inverse.to(t.device)[t]
        return _permuted(t, graph.node_axes.get(path, ()), order)

    return rebuild(s.inputs, relabel)


def _reordered(s: Subject, graph):
    """The inputs with the edges (the edge list's columns, edge attributes) reordered."""
    edges = int(dict(leaves(s.inputs))[graph.edge_list].shape[graph.edge_axis])
    order = derangement(edges, s.generator) if edges > 1 else torch.zeros(edges, dtype=torch.long)

    def reorder(path, t):
        if path == graph.edge_list:
            return take(t, graph.edge_axis, order)
        axis = graph.edge_axes.get(path)
        return take(t, axis, order) if axis is not None else t

    return rebuild(s.inputs, reorder)


def _permuted(t: torch.Tensor, axes, order: torch.Tensor) -> torch.Tensor:
    for d in axes:
        t = take(t, d, order)
    return t


def _compared(graph, out) -> dict:
    found = dict(leaves(out))
    return {path: found[path] for path in graph.outputs if path in found}


def _deviation(s: Subject, got: dict, want: dict) -> float:
    """The largest deviation over the compared outputs, on the wanted output's scale."""
    worst = 0.0
    for path, b in want.items():
        a = got.get(path)
        if a is None or a.shape != b.shape:
            shape = list(a.shape) if a is not None else "missing"
            s.mismatch = f"the output {'.'.join(map(str, path))} is {shape} where {list(b.shape)} was expected"
            return float("inf")
        worst = max(worst, deviation(a, b, scale_of(b)))
    return worst
