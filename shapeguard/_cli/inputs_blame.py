"""Which made-up input a finding traces back to, by provenance (issue 30).

After the inputs are made (`inputs_discovery.discover`), one more provisional forward on
them runs to its end with checks off, and follows each input shapeguard chose the shape
of through what keeps it the same input: views, layouts, indexing, casts, dropout, and
elementwise ops with only numbers beside it (`mask == 0`, `~mask`, `trg != pad_idx`).
Through anything that mixes it with another tensor (a Linear, an embedding, a product,
`scores.masked_fill(mask, ...)`) it is not followed: what comes out is the model's own.

It records, for each line of the user's code, the made-up inputs its ops read (`Reads`),
and the op that failed, if one did, with the inputs it read (`Failure`). A finding at a
line that reads a made-up input says so; an error at the line where the forward failed
on a made-up input that no consumer had accepted (`Leaf.settled`: an embedding took its
ids, a Linear its width, the scores its mask) is not the user's bug but shapeguard's
input: "could not make a valid input for X".
"""

from dataclasses import dataclass, field

from .. import _ops, _source
from .inputs_structure import Leaf
from .inputs_uses import flat_args, out_tensors

_PASS_FAMILIES = frozenset({_ops.VIEW, _ops.LAYOUT, _ops.INDEX, _ops.GROW, _ops.PART})
_DROPOUT = _ops.by_name("dropout")


@dataclass(slots=True)
class Failure:
    """The op that failed on a made-up input: where, and which inputs it read."""

    location: str
    names: tuple[str, ...]
    error: str


@dataclass(slots=True)
class Reads:
    """What one provisional forward saw of the made-up inputs."""

    # {"file.py:24": {"src_mask", ...}}: the made-up inputs each line's ops read.
    at: dict = field(default_factory=dict)
    failure: Failure | None = None
    # {input: "[2, 1, 5] bool, True = real token; lengths 5, 3"}: what was made up.
    texts: dict = field(default_factory=dict)

    def made_up(self, names) -> str:
        """`src_mask [2, 1, 5] bool, True = real token; lengths 5, 3`, for each of `names`."""
        return "; ".join(f"{name} {self.texts.get(name, '')}".rstrip() for name in sorted(names))


def reads_of(model, nodes: dict, assemble, maker, notes: dict) -> Reads | None:
    """What a forward on the inputs `maker` makes of `nodes` reads of the made-up ones
    (those whose shape shapeguard chose, not `--input` or an annotation); None when there
    are none."""
    from ..report.text import tensor_text
    from .inputs_discovery import leaves_of, tensors_of

    # Made again, not shared with the trace: a forward may write into its inputs.
    values = {name: maker.value(node) for name, node in nodes.items()}
    tensors, texts = {}, {}
    for name, node in nodes.items():
        for leaf, tensor in zip(leaves_of(node), tensors_of(node, values[name]), strict=True):
            if not leaf.fixed and hasattr(tensor, "shape"):
                tensors[id(tensor)] = (leaf, tensor)
                note = notes.get(leaf.name)
                texts[leaf.name] = tensor_text(tensor) + (f", {note}" if note else "")
    if not tensors:
        return None
    args, kwargs = assemble(values)
    reads = follow(model, args, kwargs, tensors)
    reads.texts = texts
    return reads


def judge(run, reads: Reads) -> None:
    """A UsageFailure when the forward failed where it failed on a made-up input no
    consumer had accepted (`Failure`); else a `made up:` line in each finding at a line
    that reads a made-up input."""
    from .errors import UsageFailure

    failure = reads.failure
    if failure is not None:
        where = {f.location for f in run.trace.errors}
        if run.crash is not None:
            where.add(run.crash.location)
        if run.shape_error is not None:
            where.add(getattr(run.shape_error, "location", ""))
        if failure.location in where:
            names = ", ".join(failure.names)
            raise UsageFailure(
                f"could not make a valid input for {names} (made up: "
                f"{reads.made_up(failure.names)}): the forward fails on it at "
                f"{failure.location} ({failure.error}); pass --input "
                f"{failure.names[0]}=SIZES or use `shapeguard run`"
            )
    for finding in run.trace.findings:
        read = reads.at.get(finding.location)
        if read:
            mark(finding, reads, read)


def mark(finding, reads: Reads, names) -> None:
    """Add `made up: ...` to a finding's message, before its hint."""
    first = sorted(names)[0]
    line = (
        f"  made up: {reads.made_up(names)} (shapeguard made {'them' if len(names) > 1 else 'it'}; "
        f"pass the real one with --input {first}=SIZES, or use `shapeguard run`)"
    )
    lines = finding.message.splitlines()
    at = next((i for i, text in enumerate(lines) if text.startswith("  hint:")), len(lines))
    finding.message = "\n".join([*lines[:at], line, *lines[at:]])


def follow(model, args: tuple, kwargs: dict, tensors: dict) -> Reads:
    """Run `model(*args, **kwargs)` to its end, following `tensors` ({id: (Leaf, tensor)},
    the made-up inputs whose shape shapeguard chose) by provenance."""
    from .inputs_discovery import provisional_forward

    carrier = _Carrier(tensors)
    error = provisional_forward(model, args, kwargs, lambda session: carrier)
    reads = Reads(carrier.at)
    if error is not None and carrier.pending is not None:
        location, leaves = carrier.pending
        unsettled = tuple(leaf.name for leaf in leaves if not leaf.settled)
        if unsettled:
            reads.failure = Failure(location, unsettled, _first_line(error))
    return reads


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class _Carrier:
    """The observer of `follow`: which tensors are still a made-up input."""

    __slots__ = ("at", "pending", "tracked")

    def __init__(self, tensors: dict) -> None:
        self.tracked = dict(tensors)  # id -> (leaf, tensor): the tensor kept, its id unique
        self.at: dict[str, set[str]] = {}
        # The op running now that reads a made-up input: (location, leaves), until it returns.
        self.pending: tuple[str, list[Leaf]] | None = None

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        values = list(flat_args(args, kwargs))
        leaves = []
        for value in values:
            entry = self.tracked.get(id(value))
            if entry is not None and entry[0] not in leaves:
                leaves.append(entry[0])
        if not leaves:
            self.pending = None
            return
        site = _source.user_site()
        location = site.location if site is not None else ""
        self.at.setdefault(location, set()).update(leaf.name for leaf in leaves)
        self.pending = (location, leaves)

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        found = _ops.lookup(op)
        values = list(flat_args(args, kwargs))
        tensors = [v for v in values if hasattr(v, "shape")]
        keeps = (
            found.family in _PASS_FAMILIES
            or found is _DROPOUT
            or (found.family in (_ops.SAME, _ops.BINARY) and len(tensors) == 1)
        )
        if not keeps:
            return
        leaf = (
            self.tracked[id(tensors[0])][0] if tensors and id(tensors[0]) in self.tracked else None
        )
        if leaf is None:
            return
        for tensor in out_tensors(out):
            self.tracked.setdefault(id(tensor), (leaf, tensor))
