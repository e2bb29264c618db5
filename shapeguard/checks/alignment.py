"""Axes an op lines up as one that structure says are different axes.

Where sizes differ, lining up the batch with the tokens is torch's broadcast error or an op's
contract; where they coincide (batch == tokens) it runs, and only the axes' identities tell.
So each rule here reads both sides' identity from provenance and stays silent where one side
is not established:

- an elementwise op lines up an axis structure makes the batch (a conv's examples) with one
  it makes positions (a conv's or an attention's tokens): adaLN's `scale.unsqueeze(0)`;
- an einsum letter pairs a parameter's own axis with an axis of the other operand, while the
  parameter's operand holds, under another letter, the copy the user made of it along that
  very axis (`repeat(latents, "n d -> n b d", b=B)` with `B = data.shape[0]`);
- nn.MultiheadAttention reads a parameter's own axis as the batch, against another batch axis
  in the other operands (a parameter's size is fixed when the model is built: it holds no
  examples; a copy of it made by repeat or expand may).
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names import subscripts
from .._names.dims import BATCH, COPY, TOKEN
from .._values import is_tensor
from . import WARNING, rule
from ._einsum import written
from ._view import CallView

_KINDS = {"misaligned_axes": WARNING}
_WHAT = {BATCH: "the examples of the batch", TOKEN: "positions (tokens)"}
# + - * / (reflected too), as `elementwise.arithmetic` checks their shapes.
_ARITHMETIC = tuple(
    op for op in _ops.ALL if op.family == _ops.BINARY and op.symbol in "+-*/" and op.symbol
)


def _ref(label: str) -> str:
    """`x` stays `x`; `1 + s` becomes `(1 + s)`, so `.batch` can follow it."""
    return label if label.replace("_", "").replace(".", "").isalnum() else f"({label})"


def _established(axis) -> str | None:
    """The axis's kind when structure (or a parameter, or a contract) establishes it for
    every one of its atoms and they agree (`dims.established_kind`)."""
    kinds = {D.established_kind(atom) for atom in axis}
    return kinds.pop() if len(kinds) == 1 else None


def _roots(axis) -> set:
    return {atom[0].find() for atom in axis}


# -- einsum: a parameter's axis paired with the axis it was copied along ----------------
@rule(_ops.by_name("einsum"), kinds=_KINDS, order=1)
def letter_pairs_a_parameter(call: CallView) -> Iterator[Violation]:
    """A two-operand einsum whose letter pairs a parameter's own axis in one operand with
    an axis X of the other, while the first holds its copy along X under another letter."""
    args = call.args
    operands = list(args[1:]) if len(args) > 2 else list(args[1]) if len(args) == 2 else []
    if len(operands) != 2 or not all(is_tensor(t) for t in operands):
        return
    equation = subscripts.parse(args[0], [t.dim() for t in operands])
    if equation is None:
        return
    dims = [call.dims(t) for t in operands]
    for side in (0, 1):
        found = _paired_parameter(equation.specs, dims, side)
        if found is not None:
            yield _letter_violation(call, equation, operands, side, *found)
            return


def _paired_parameter(specs, dims, side: int):
    """(letter pairing the parameter's axis, the copy's letter) or None."""
    mine, other = dims[side], dims[1 - side]
    spec, other_spec = specs[side], specs[1 - side]
    for letter in set(spec) & set(other_spec):
        axis, paired = mine[spec.index(letter)], other[other_spec.index(letter)]
        if len(axis) != 1 or len(paired) != 1 or not D.is_whole(paired[0]):
            continue
        if D.size_of(axis) != D.size_of(paired):
            continue  # `einsum_dim` says it
        root, x = axis[0][0].find(), paired[0][0].find()
        if root is x or not root.param or root.kind == COPY or x.param or x.kind == COPY:
            continue
        for copy_letter, copy in zip(spec, mine, strict=True):
            if len(copy) != 1 or copy_letter == letter:
                continue
            stands = D.stands_for(copy[0])
            if copy[0][0].find().kind == COPY and stands[0].find() is x:
                at = other_spec.find(copy_letter)
                if at < 0 or _roots(other[at]) != {x}:
                    return letter, copy_letter
    return None


def _letter_violation(call, equation, operands, side, letter, copy_letter) -> Violation:
    user = written(call, operands)
    labels = user.labels
    spec, other_spec = equation.specs[side], equation.specs[1 - side]
    mine, other = labels[side], labels[1 - side]
    i, j, c = spec.index(letter), other_spec.index(letter), spec.index(copy_letter)
    t, u = operands[side], operands[1 - side]
    what = call.dims(t)[i][0][0].find().param
    words = user.words or {}
    letter, copy_letter = words.get(letter, letter), words.get(copy_letter, copy_letter)
    relation = (
        f"einsum '{user.equation}': '{letter}' pairs {mine}'s axis {i} ({what}, a "
        f"parameter's own axis) with {other}.{call.axis(u, j)} (axis {j}), while {mine} holds the "
        f"copy made along {other}.{call.axis(u, j)} on axis {c} ('{copy_letter}')"
    )
    hint = (
        f"a parameter holds no examples: make the copy along {other}.{call.axis(u, j)} the "
        f"axis of {mine} under '{letter}', and keep the parameter's own axis under "
        f"'{copy_letter}'"
    )
    ops = (call.operand(labels[0], operands[0]), call.operand(labels[1], operands[1]))
    return Violation("misaligned_axes", relation, ops, hint, severity="warning")


# -- nn.MultiheadAttention: a parameter's axis read as the batch ------------------------
@rule(_ops.MHA, kinds=_KINDS, order=1)
def parameter_as_batch(call: CallView) -> Iterator[Violation]:
    """nn.MultiheadAttention reads axis 1 of [seq, batch, embed_dim] as the batch: a
    parameter's own axis there, against another batch axis in the other operands."""
    bound = _ops.bind(_ops.MHA, call.args, call.kwargs)
    named = [(n, bound.get(n)) for n in ("query", "key", "value")]
    if not all(is_tensor(t) and t.dim() == 3 for _, t in named):
        return
    batches = [call.dims(t)[1] for _, t in named]
    for (name, t), axis in zip(named, batches, strict=True):
        roots = _roots(axis)
        if not axis or not all(r.param and r.kind != COPY for r in roots):
            continue
        others = [
            (n, u, b)
            for (n, u), b in zip(named, batches, strict=True)
            if b and _roots(b) != roots and D.size_of(b) == D.size_of(axis)
        ]  # a batch of another size is `mha_batch`'s
        if not others:
            continue
        yield _mha_violation(call, name, t, others[0])
        return


def _mha_violation(call, name: str, t, other) -> Violation:
    other_name, u, _ = other
    what = call.dims(t)[1][0][0].find().param
    first = bool(getattr(call.module, "batch_first", False))
    relation = (
        f"MultiheadAttention (batch_first={first}): the batch axis of {name} is a "
        f"parameter's own axis ({what}), {other_name}'s is {other_name}."
        f"{call.axis(u, 1)}: a parameter holds no examples"
    )
    if first:
        hint = (
            "batch_first=True reads inputs as [batch, seq, embed_dim]: copy the parameter "
            "along the batch on axis 0 (e.g. weight.unsqueeze(0).expand(B, -1, -1))"
        )
    else:
        hint = (
            "batch_first=False reads inputs as [seq, batch, embed_dim]: copy the parameter "
            "along the batch on axis 1 (e.g. weight.unsqueeze(1).repeat(1, B, 1)) and pass "
            "the other inputs as [seq, batch, embed_dim], or build "
            "MultiheadAttention(..., batch_first=True)"
        )
    operands = tuple(call.operand(n, v) for n, v in (("query", t), (other_name, u)))
    return Violation("misaligned_axes", relation, operands, hint, severity="warning")
