"""Which axes are a graph's nodes, read from structure: an edge list or an adjacency.

The node-relabelling probe (`graph_nodes`) needs to know, from the trace and never from
sizes or names, which input rows are nodes, which input values are node ids, and which
output axes are indexed by node:

- an edge list: an integer input `[2, edges]` whose values (followed through selections,
  masks and concatenations: `index_flow`) pick or write rows of an axis; every axis so
  addressed is a node axis, and so is every axis provenance lines up with one (x's rows,
  the aggregation's output);
- an adjacency: an input with two axes that are one dim, which is an axis of a floating
  input (`adj [N, N]` beside `x [N, F]`), in a module with no positional term and no
  causal mask (a sequence's mask is shaped so too, and tokens have positions).

Nodes are labels only where nothing in the module holds a node's identity: a parameter
or buffer along the node axis, or rows of a table read by an index the module made. An
output axis is node-indexed when it is a node dim whole; an output with no node axis and
no axis that could be one (as long as the nodes or edges, not features) is graph-level.
"""

from dataclasses import dataclass, field

import torch

from .._names import dims as D
from .layout_records import root_of


@dataclass(slots=True)
class Graph:
    """The nodes and edges of a graph layer's inputs and outputs, by path and axis."""

    nodes: int  # how many
    seen: str  # the structure, in words, for the probe's messages
    node_axes: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # inputs, by path
    edge_list: tuple | None = None  # path of the [2, edges] input
    edge_axis: int = 1  # its edges' axis
    edge_axes: dict[tuple, int] = field(default_factory=dict)  # inputs that follow the edges
    outputs: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # path -> node axes
    left_out: list[str] = field(default_factory=list)  # outputs not compared, and why


def read_graph(found, names: dict, traced, causal: str) -> "Graph | str":
    """The graph `found` (input leaves) holds, or why the probe cannot tell one."""
    dims = {path: _dims(traced.in_metas.get(path), t) for path, t in found}
    watch = traced.watch
    edges = _edge_lists(found, dims, names, watch)
    if isinstance(edges, str):
        return edges
    if edges:
        made = _by_edges(edges[0], found, dims, names, watch)
    else:
        made = _by_adjacency(found, dims, names, watch, causal)
    if isinstance(made, str):
        return made
    graph, nodes, edge_roots, extent = made
    held = _identities(traced, watch, nodes)
    if held:
        return held
    unclear = _unplaced_inputs(found, dims, names, graph, extent)
    if unclear:
        return unclear
    _outputs(traced.out_metas, graph, nodes, edge_roots, extent)
    return graph


def _by_edges(path, found, dims, names, watch):
    """(the graph, its node dims, the edges' dims, the nodes' and edges' counts) an edge
    list makes, or why it makes none."""
    edge_list = dict(found)[path]
    nodes, edge_axis, index_roots = _by_edge_list(path, edge_list, watch)
    graph = _graph_of(nodes, found, dims, names)
    if isinstance(graph, str):
        return graph
    graph.edge_list, graph.edge_axis = path, edge_axis
    bad = _other_index(watch, nodes, path, names) or _not_ids(edge_list, graph.nodes, names[path])
    if bad:
        return bad
    graph.seen = f"{graph.seen}; {names[path]} {list(edge_list.shape)} holds node ids"
    edge_root = root_of(dims[path][edge_axis])
    for other, axes in dims.items():
        for d, axis in enumerate(axes):
            if other != path and edge_root is not None and root_of(axis) is edge_root:
                graph.edge_axes[other] = d
    edge_roots = {id(r) for r in index_roots} | {id(root_of(a)) for a in dims[path]}
    return graph, nodes, edge_roots, (graph.nodes, int(edge_list.shape[edge_axis]))


def _by_adjacency(found, dims, names, watch, causal: str):
    """(the graph, its node dims, no edge dims, the nodes' count twice) an adjacency
    makes, or why there is none."""
    nodes, adjacency = _adjacency(found, dims, names)
    if not nodes:
        return (
            "no input is a graph: no [2, edges] integer input whose values pick rows, and "
            "no adjacency (an input with two axes that are one axis of a floating input)"
        )
    if watch.made_positions or causal:
        made = watch.made_positions
        why = f"positional terms ({made})" if made else f"a causal mask ({causal})"
        return (
            f"{adjacency} has two axes that are one axis of the inputs (an adjacency), but "
            f"the module has {why}: a sequence's tokens, not a graph's nodes"
        )
    graph = _graph_of(nodes, found, dims, names)
    if isinstance(graph, str):
        return graph
    graph.seen = f"{graph.seen}; {adjacency} is an adjacency"
    return graph, nodes, set(), (graph.nodes, graph.nodes)


def _dims(meta, t: torch.Tensor) -> tuple:
    axes = getattr(meta, "dims", None)
    return axes if axes is not None and len(axes) == t.dim() else ((),) * t.dim()


def _edge_lists(found, dims, names, watch) -> "list | str":
    """The paths of the [2, edges] inputs whose values address rows of a floating input
    that are no sequence's tokens (or why not one): an LM's ids picking rows of a table,
    or positions picking tokens, are no edge list."""
    rows: dict[int, bool] = {}  # id of a floating input's axis dim -> it is tokens
    for path, t in found:
        for axis in dims[path] if t.is_floating_point() else ():
            root = root_of(axis)
            if root is not None:
                rows[id(root)] = D.kind_of(axis) == D.TOKEN
    tensors = dict(found)
    edges, tokens = [], ""
    for root, by, where in watch.addressed_by:
        for p in by:
            t = tensors.get(p)
            if t is None or t.dim() != 2 or 2 not in t.shape or p in edges:
                continue
            if rows.get(id(root.find())) is False:
                edges.append(p)
            elif rows.get(id(root.find())):
                tokens = tokens or (
                    f"{names[p]} {list(t.shape)} picks rows ({where}) of an axis the trace "
                    "takes for a sequence's tokens (positions are made along it), not a "
                    "graph's nodes"
                )
    if len(edges) > 1:
        return "two inputs are edge lists: which nodes each numbers cannot be told"
    return tokens if tokens and not edges else edges


def _by_edge_list(path, edge_list, watch):
    """(the node dims the edge list's values address, its edges' axis, the index dims)."""
    nodes: list = []
    index: list = []
    for root, by, _ in watch.addressed_by:
        if path in by and not any(root.find() is n for n in nodes):
            nodes.append(root.find())
    for root, index_roots, _ in watch.addressed:
        if any(root.find() is n for n in nodes):
            index.extend(r.find() for r in index_roots)
    edge_axis = 1 if int(edge_list.shape[0]) == 2 else 0
    return nodes, edge_axis, index


def _graph_of(nodes: list, found, dims, names) -> "Graph | str":
    """The node axes of the inputs, one size for all of them."""
    graph = Graph(0, "")
    sizes = {int(r.size) for r in nodes}
    held = []
    for path, t in found:
        axes = tuple(d for d, a in enumerate(dims[path]) if any(root_of(a) is n for n in nodes))
        if axes:
            graph.node_axes[path] = axes
            held.append(f"{names[path]} {list(t.shape)} (axis {', '.join(map(str, axes))})")
    if not held:
        return "the edge list's values pick rows of tensors made inside, of no input"
    if len(sizes) != 1:
        return (
            f"the edge list's values pick rows of axes of {sorted(sizes)} rows: two node sets "
            "(a bipartite graph), and which row of the edge list numbers which cannot be told"
        )
    graph.nodes = sizes.pop()
    graph.seen = f"nodes along {', '.join(held)}"
    return graph


def _other_index(watch, nodes: list, path, names) -> str:
    """An input besides the edge list whose values pick node rows (its ids would need
    relabelling too, and it is no edge list), in words; or ""."""
    for root, by, where in watch.addressed_by:
        others = sorted(by - {path}, key=str)
        if others and any(root.find() is n for n in nodes):
            return (
                f"{names.get(others[0], 'an input')} picks node rows too ({where}) but is no "
                "[2, edges] edge list: how to relabel its values cannot be told"
            )
    return ""


def _not_ids(edge_list: torch.Tensor, nodes: int, name: str) -> str:
    if edge_list.numel() and (int(edge_list.min()) < 0 or int(edge_list.max()) >= nodes):
        return (
            f"{name} {list(edge_list.shape)} holds values outside 0..{nodes - 1}: not ids of "
            f"the {nodes} nodes it picks rows of"
        )
    return ""


def _adjacency(found, dims, names) -> tuple[list, str]:
    """([the node dim], the adjacency in words) where an input has two axes that are one
    dim, an axis of a floating input; ([], "") where none has."""
    floating = {
        id(r)
        for path, t in found
        if t.is_floating_point()
        for a in dims[path]
        if (r := root_of(a)) is not None
    }
    for path, _t in found:
        roots = [root_of(a) for a in dims[path]]
        for r in roots:
            if r is not None and roots.count(r) >= 2 and id(r) in floating and r.size > 1:
                return [r], names[path]
    return [], ""


def _identities(traced, watch, nodes: list) -> str:
    """Why the module's nodes have identities (a parameter along them, a table read by an
    index of the module's own), or ""."""
    for name, p, meta in traced.state_metas:
        for a in getattr(meta, "dims", None) or ():
            if any(root_of(a) is n for n in nodes):
                return f"the parameter or buffer {name} {list(p.shape)} runs along the nodes"
    if watch.own_rows:
        return (
            f"{watch.own_rows} reads rows of a table by an index the module makes: its rows "
            "(nodes or positions) have identities, and relabelling them is no symmetry"
        )
    return ""


def _unplaced_inputs(found, dims, names, graph: Graph, extent) -> str:
    """An input with an axis as long as the nodes or edges that the trace does not place
    (node, edge or feature): moved or not with them, a relabelling is a guess."""
    for path, t in found:
        if path == graph.edge_list:
            continue
        for d, axis in enumerate(dims[path]):
            placed = d in graph.node_axes.get(path, ()) or graph.edge_axes.get(path) == d
            if placed or int(t.shape[d]) not in extent or D.kind_of(axis) == D.FEATURE:
                continue
            return (
                f"axis {d} of {names[path]} {list(t.shape)} is as long as the nodes or edges, "
                "but the trace does not show it is either: it cannot be moved with them"
            )
    return ""


def _outputs(out_metas, graph: Graph, nodes: list, edge_roots: set, extent) -> None:
    """The outputs compared, with their node axes; the others in `graph.left_out`."""
    for path, t, meta in out_metas:
        axes = _dims(meta, t)
        node_axes, why = [], ""
        for d, axis in enumerate(axes):
            root = root_of(axis)
            if root is not None and any(root is n for n in nodes) and t.shape[d] == graph.nodes:
                node_axes.append(d)
            elif any(a[0].find() is n for a in axis for n in nodes):
                why = f"its axis {d} mixes the nodes with other axes"
            elif any(id(a[0].find()) in edge_roots for a in axis):
                why = f"its axis {d} runs along the edges"
            elif not axis or (
                len(axis) == 1 and int(t.shape[d]) in extent and D.kind_of(axis) != D.FEATURE
            ):
                why = f"its axis {d} is as long as the nodes or edges, but is neither for the trace"
        name = "the output" + ("" if not path else " " + ".".join(map(str, path)))
        if why:
            graph.left_out.append(f"{name} {list(t.shape)}: {why}")
        else:
            graph.outputs[path] = tuple(node_axes)
