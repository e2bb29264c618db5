"""How tables and messages show an axis: its name, or, where only the batch-first
convention named it, what structure shows it is. Display only: no rule reads this.

A graph's node features `[N, F]` read as `[batch, features]` by the convention
(`_names/roots.py`). Where structure shows that axis holds a graph's nodes (its rows picked
or summed by a row of an edge index, or a product contracting it with an `[N, N]` over
itself: `_trace/nodes.py`), tables and messages call it `nodes`. Every decision keeps the
conventional reading: rules read `dims.known_name`, which this never changes.
"""

from collections.abc import Sequence

from . import dims as D

NODES = "nodes"


def conventional_batch(root: D.Dim) -> bool:
    """Whether the batch-first convention alone named this root dim the batch."""
    return (
        root.kind == D.BATCH
        and root.kind_rank <= D.CONVENTION
        and root.rank <= D.CONVENTION
        and D.dim_name(root) == "batch"
    )


def shown_name(axis: D.Axis, name: str | None) -> str | None:
    """`name` (the axis' known name), or what structure shows a conventional batch is."""
    if name != "batch" or len(axis) != 1 or not D.is_whole(axis[0]):
        return name
    root = axis[0][0].find()
    return root.shown if root.shown and conventional_batch(root) else name


def shown_names(axes: Sequence[D.Axis], names: Sequence[str | None]) -> tuple[str | None, ...]:
    """The names tables and messages show for `axes`, whose known names are `names`."""
    if "batch" not in names:
        return tuple(names)
    return tuple(shown_name(a, n) for a, n in zip(axes, names, strict=True))
