"""A slice of a joined axis whose bound is one part's length but whose positions are not it.

`torch.cat` along an axis records the parts it joined, in order (`Dim.joined`): SD3 and
Flux join the text tokens, then the image tokens, run one attention over both, and split
the output back. Where the code splits the joined axis at one bound (`out[:, :N]` and
`out[:, N:]`, or `[-N:]` and `[:-N]`) read from one part's own shape (`N` of
`N = x.shape[1]`, x the image tokens), the piece of that length means that part: `[:N]`
the first, `[-N:]` the last. Where that part is not there, the piece takes other tokens:
across the boundary where the lengths differ, or exactly the other part where they
coincide, handed on as this one. A ShapeWarning: it runs, and is wrong. One piece alone
is no split: a shift, a rolling state (Mamba's conv cache keeps its last `state_len`) or
the new keys after a cache keep a part's length by design.

Claims stand on structure and on the user's own reads: the parts are those torch.cat
joined (the sliced axis is that concatenation whole), and the bound is a plain shape read
of a tensor holding one part's axis. A constant bound (`x[:, 1:]` past a class token), a
declared one (`self.window`) or a sum (`[S:S + N]`) says nothing, and nothing is claimed:
a cache cut to its last `max_len` keys or a chunked sequence crosses parts by design.
"""

import ast
from collections.abc import Iterator

from .. import _ops, _source
from .._errors import Violation
from .._names import dims as D
from .._names.intent import size_read
from .._values import is_tensor
from . import WARNING, rule
from ._view import CallView

_ORDINALS = ("first", "second", "third", "fourth", "fifth")


@rule(_ops.by_name("__getitem__"), kinds={"segment_slice": WARNING}, order=1)
def joined_slice(call: CallView) -> Iterator[Violation]:
    """x[..., a:b] on an axis torch.cat joined: a bound read from one part's length takes
    that part's positions."""
    args, site = call.args, call.site
    if len(args) != 2 or not is_tensor(args[0]) or site is None or len(site.args) != 1:
        return
    if not call.site_matches():
        return  # the line's expression is another call: its text is not this index
    x, index = args
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > x.dim() or not all(isinstance(i, slice) for i in index):
        return
    cut = [i for i, s in enumerate(index) if s != slice(None)]
    if len(cut) != 1 or index[cut[0]].step not in (None, 1):
        return
    axis = cut[0]
    parts = _parts(call.dims(x)[axis], int(x.shape[axis]))
    written = _written_slice(site.args[0], len(index), axis)
    if parts is None or written is None:
        return
    sizes = [D.size_of(p) for p in parts]
    total = sum(sizes)
    bound = index[axis]
    for node, end in ((written.lower, "lower"), (written.upper, "upper")):
        if node is None:
            continue
        text = ast.unparse(node)
        negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
        if isinstance(node, ast.UnaryOp) and negative:
            node = node.operand
        read = size_read(call, node, text.lstrip("-"))
        if read is None or read.axis is None:
            continue
        meant = [k for k, part in enumerate(parts) if D.normalize(part) == D.normalize(read.axis)]
        value = bound.start if end == "lower" else bound.stop
        if not meant or not isinstance(value, int) or abs(value) != sizes[meant[0]]:
            continue
        other = written.upper if end == "lower" else written.lower
        if other is not None:
            return  # both bounds written: [S:S + N] is read no further
        # A split: the piece of the bound's length, and the rest taken too by the same
        # bound (one piece alone is a window, a shift or a cache kept: by design).
        if (end == "lower") != negative or not _rest_taken(site, len(index), axis, end, text):
            return
        # The part the split assumes at its end: [:N] the first, [-N:] the last.
        k = len(parts) - 1 if negative else 0
        if k in meant:
            return
        start, stop, _ = bound.indices(total)
        yield _violation(call, x, axis, parts, sizes, meant[0], k, text, start, stop)
        return


def _parts(axis, size: int) -> list | None:
    """The parts torch.cat joined into this axis, when the axis is that concatenation
    whole."""
    atoms = D.normalize(axis)
    if len(atoms) != 1 or not D.is_whole(atoms[0]):
        return None
    joined = atoms[0][0].find().joined
    if not joined or len(joined) < 2 or sum(D.size_of(p) for p in joined) != size:
        return None
    return list(joined)


def _written_slice(text: str, count: int, axis: int) -> ast.Slice | None:
    """The slice the user wrote at position `axis` of the index `text` ("(:, :N)")."""
    try:
        node = _source.parse(f"_[{_unparenthesized(text)}]", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Subscript):
        return None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    item = items[axis] if len(items) == count else None
    return item if isinstance(item, ast.Slice) else None


def _rest_taken(site, count: int, axis: int, end: str, text: str) -> bool:
    """Whether the site's function also slices the same name at the same bound from the
    other side (`out[:, N:]` beside `out[:, :N]`): the code splits it there."""
    func = _source.function_node(site.filename, site.scope)
    if func is None or not site.receiver.isidentifier():
        return False
    for node in ast.walk(func):
        if not (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == site.receiver
        ):
            continue
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        item = items[axis] if len(items) == count else None
        if not isinstance(item, ast.Slice) or item.step is not None:
            continue
        # The piece [:N] (or [-N:]) wrote `end`'s bound; the rest writes the other one.
        kept, other = (item.lower, item.upper) if end == "upper" else (item.upper, item.lower)
        if other is None and kept is not None and ast.unparse(kept) == text:
            return True
    return False


def _unparenthesized(text: str) -> str:
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def _violation(call, x, axis, parts, sizes, meant, assumed, text, start, stop) -> Violation:
    label = call.label(0, "input")
    names = _part_names(parts)
    ordinal = _ORDINALS[meant] if meant < len(_ORDINALS) else f"part {meant + 1}"
    assumed_name = _ORDINALS[assumed] if assumed < len(_ORDINALS) else f"part {assumed + 1}"
    joined = ", ".join(f"{n}={s}" for n, s in zip(names, sizes, strict=True))
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    held = _held(names, sizes, start, stop)
    axis_name = call.axes(x)[axis] if call.axes(x) else None
    shown = f"{axis_name}={x.shape[axis]}" if axis_name else f"size {x.shape[axis]}"
    return Violation(
        "segment_slice",
        f"{label}[{_unparenthesized(call.site.args[0])}] takes positions {start}:{stop} of dim "
        f"{axis - x.dim()} ({shown}), which torch.cat joined from [{joined}] in that order; "
        f"{text} is the length of the {ordinal} part ({names[meant]}={sizes[meant]}), as if "
        f"it were the {assumed_name}, but those positions hold {held}",
        (call.operand(label, x),),
        f"the {ordinal} part ({names[meant]}) is positions {starts[meant]}:"
        f"{starts[meant] + sizes[meant]} and the {assumed_name} ({names[assumed]}) "
        f"{starts[assumed]}:{starts[assumed] + sizes[assumed]}: slice by the part you mean, "
        "or torch.cat the parts in the order this slice assumes",
        severity="warning",
    )


def _part_names(parts: list) -> list[str]:
    """Each part's name, without the side a query-key product gave it (a joined sequence
    is both), and where it came from when two parts would read the same."""
    names = [D.known_name(p) or "tokens" for p in parts]
    names = [n[:-2] if n in ("seq_q", "seq_k") else n for n in names]
    if len(set(names)) == len(names):
        return names
    origins = [next((r.origin for r in D.roots_of(D.normalize(p))), "") for p in parts]
    return [_owned(n, o) for n, o in zip(names, origins, strict=True)]


def _owned(name: str, origin: str) -> str:
    """`txt's seq` for a dim made as "axis 1 of txt" (a model input)."""
    if origin.startswith("axis ") and " of " in origin:
        return f"{origin.split(' of ', 1)[1]}'s {name}"
    return f"{name} ({origin})" if origin else name


def _held(names, sizes, start: int, stop: int) -> str:
    """What positions start:stop of the joined axis hold, part by part."""
    held, offset = [], 0
    for name, size in zip(names, sizes, strict=True):
        a, b = max(start, offset), min(stop, offset + size)
        if a < b:
            held.append(f"all of {name}={size}" if b - a == size else f"{b - a} of {name}={size}")
        offset += size
    return " and ".join(held) if held else "nothing"
