"""Graph attention: edge weights normalised over one side of the edges, summed into the other.

A GAT layer normalises its edge scores within the edges that share a node (a softmax whose
sums are scattered by one row of `edge_index` and read back by the same row) and sums the
weighted messages into nodes by a row of its own. When the two rows differ (softmax over
the edges that share a source, aggregation into the targets, or the other way round) each
node receives weights that do not sum to 1: nothing fails, the model trains on it. Found at
the aggregation (`index_add`, `scatter_add`, `scatter_reduce(sum)`), from what the trace
carried (`_trace/grouping.py`); silent where either index is not a row of a tensor the
trace saw, or where both are the same row.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from . import WARNING, rule
from ._view import CallView


def _row_name(row: tuple) -> str:
    _, _, position, label = row
    return f"{label or 'the edge index'}[{position}]"


@rule(
    _ops.by_name("index_add"),
    _ops.by_name("scatter_add"),
    _ops.by_name("scatter_reduce"),
    kinds={"edge_weights_other_side": WARNING},
    order=1,
)
def summed_into_other_side(call: CallView) -> Iterator[Violation]:
    bound = call.bound()
    # reduce by keyword or by position (after input, dim, index, src)
    args = call.args
    reduce = call.kwargs.get("reduce", args[4] if len(args) > 4 else None)
    if call.spec.name == "scatter_reduce" and reduce != "sum":
        return
    index = bound.get("index")
    src = bound.get("src", bound.get("source"))
    index_meta, src_meta = call.meta(index), call.meta(src)
    if index_meta is None or src_meta is None:
        return
    into, weights = index_meta.grouped, src_meta.grouped
    if into[:1] != ("row",) or weights[:1] != ("normalised",):
        return
    over = weights[1]
    # Rows of one tensor (its slot), at different positions: a claim; anything else, none.
    if over[1] != into[1] or over[2] == into[2]:
        return
    src_label = call.label_of(src, "messages")
    over_name, into_name = _row_name(over), _row_name(into)
    yield Violation(
        "edge_weights_other_side",
        f"{src_label} carries weights normalised over the edges that share {over_name}, "
        f"summed into the nodes of {into_name}: the weights each node receives do not sum "
        "to 1",
        (call.operand(src_label, src), call.operand(into_name, index)),
        f"group the softmax by the index the aggregation scatters to ({into_name}), or "
        f"scatter the messages by the index the softmax was grouped by ({over_name})",
        severity="warning",
    )
