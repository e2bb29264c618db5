"""Fixes a contract message suggests: a transpose, an unsqueeze, a conversion."""

import itertools

from .. import _axes
from .spec import Spec, eval_symbolic, names_for


def fixed_hint(label: str, axis: int, size: int, fixed: int) -> str:
    """How to give a dim the size its contract fixes."""
    if fixed == 1:
        return (
            f"the contract wants 1 on dim {axis} (one slice shared across that axis); take "
            f"{label}.narrow({axis}, 0, 1) if every slice is the same, or name the axis in the "
            "contract if it may carry its own size"
        )
    return f"{label} needs {fixed} on dim {axis}"


def dtype_hint(label: str, spec: Spec) -> str:
    """How to give a tensor a dtype its contract accepts."""
    conversions = {"Bool": ".bool()", "Float": ".float()", "Int": ".long()", "Integer": ".long()"}
    fix = conversions.get(spec.dtype_label)
    if fix:
        return (
            f"convert it with {label}{fix}, or use Shaped[...] in the contract to accept any dtype"
        )
    return f"give {label} one of the dtypes {', '.join(spec.dtypes or ())}"


def _expected_sizes(spec: Spec, single: dict) -> list:
    """Per dim of a non-variadic spec: (size or None, accepts 1)."""
    out: list[tuple[int | None, bool]] = []
    for d in spec.dims:
        if d.kind == "fixed":
            out.append((d.size, d.broadcastable))
        elif d.kind == "named":
            out.append((single.get(d.name), d.broadcastable))
        elif d.kind == "symbolic":
            out.append((eval_symbolic(d.expr, single), d.broadcastable))
        else:
            out.append((None, True))
    return out


def _fits(size: int, expected) -> bool:
    want, broadcastable = expected
    return want is None or want == size or (broadcastable and size == 1)


def position_hint(spec: Spec, shape: tuple, label: str, single: dict) -> str:
    """A transpose or permute that makes the shape fit, when one does."""
    if spec.variadic is not None or len(shape) > 6:
        return ""
    expected = _expected_sizes(spec, single)
    if sum(1 for want, _ in expected if want is not None) < 2:
        return ""
    rank = len(shape)
    found = []
    for order in itertools.permutations(range(rank)):
        if list(order) == list(range(rank)):
            continue
        if all(_fits(shape[order[k]], expected[k]) for k in range(rank)):
            found.append(order)
    if not found:
        return ""
    swaps = [o for o in found if sum(1 for k, v in enumerate(o) if k != v) == 2]
    if swaps:
        a, b = [k for k, v in enumerate(swaps[0]) if k != v]
        return f"{label}.transpose({a}, {b}) gives {_render_plain([shape[k] for k in swaps[0]])}"
    order = found[0]
    return f"{label}.permute{tuple(order)} gives {_render_plain([shape[k] for k in order])}"


def _render_plain(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def rank_hint(spec: Spec, shape: tuple, label: str, single: dict) -> str:
    """The squeeze or unsqueeze (and expand) that gives the shape the contract's rank."""
    if spec.variadic is not None:
        return f'{label} needs the axes "{spec.dim_str}"'
    expected = _expected_sizes(spec, single)
    n, m = len(expected), len(shape)
    if m < n:
        slots = _embed(shape, expected)
        if slots is None:
            return f'{label} needs the axes "{spec.dim_str}"'
        missing = [k for k in range(n) if k not in slots]
        result = [1] * n
        for k, pos in enumerate(slots):
            result[pos] = shape[k]
        chain = label + "".join(f".unsqueeze({k})" for k in missing)
        names = tuple(None if k in missing else x for k, x in enumerate(names_for(spec, result)))
        text = f"{chain} makes it {_axes.format_shape(result, names)}"
        short = [k for k in missing if expected[k][0] not in (None, 1) and not expected[k][1]]
        if not short:
            return text
        expand = ", ".join(str(expected[k][0]) if k in short else "-1" for k in range(n))
        where = ", ".join(map(str, short))
        marks = ", ".join(f'"#{spec.dims[k].name}"' for k in short if spec.dims[k].kind == "named")
        mark = f"write {marks} for dim {where} in the contract, or " if marks else ""
        return f"{text}, which broadcasts over dim {where}; to accept that, {mark}add .expand({expand})"
    extra = [k for k in range(m) if shape[k] == 1]
    for drop in itertools.combinations(extra, m - n):
        rest = [shape[k] for k in range(m) if k not in drop]
        if all(_fits(s, e) for s, e in zip(rest, expected, strict=True)):
            chain = label + "".join(f".squeeze({k})" for k in sorted(drop, reverse=True))
            return f"{chain} makes it {_axes.format_shape(rest, names_for(spec, rest))}"
    return f'{label} needs the axes "{spec.dim_str}"'


def _embed(shape: tuple, expected: list) -> list[int] | None:
    """Positions in `expected` for each axis of the shorter `shape`, rightmost first."""
    slots: list[int] = []
    pos = len(expected) - 1
    for k in range(len(shape) - 1, -1, -1):
        while pos >= 0 and not (expected[pos][0] is not None and _fits(shape[k], expected[pos])):
            pos -= 1
        if pos < 0:
            return None
        slots.append(pos)
        pos -= 1
    return slots[::-1]
