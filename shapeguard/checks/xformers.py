"""xformers' `memory_efficient_attention`: q, k, v and the `attn_bias` checked before the
call runs, in the names of its BMHK layout (`[batch, seq, heads, d_k]`). xformers does
not broadcast: q, k and v share batch and heads, k and v share their keys, and a tensor
bias has the full `[batch, heads, seq_q, seq_k]`; a block-diagonal bias packs the
sequences along seq in a batch of one, and its seqstarts must add up to q's and k's
lengths (xformers' own validation does not compare them: the kernel reads past them).

The call reaches this family only through the wrapper a trace puts on
`xformers.ops.fmha.memory_efficient_attention` (`_trace/torch_entries.py`), so it is
checked on a CPU too, where the kernel itself cannot run: the check and the reach
(`_xformers_reach`) come first, and the call's own failure then propagates unchanged.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Operand, Violation
from .._names import axes as _axes
from .._values import is_tensor
from . import ERROR, rule
from ._view import CallView

_KINDS = {"xformers_shape": ERROR, "xformers_bias": ERROR}
_OP = _ops.XFORMERS.name
# The axes of q, k and v in each rank xformers takes (BMK, BMHK, BMGHK).
_AXES = {
    3: (("batch", "seq_q", "d_k"), ("batch", "seq_k", "d_k"), ("batch", "seq_k", "d_v")),
    4: (
        ("batch", "seq_q", "heads", "d_k"),
        ("batch", "seq_k", "heads", "d_k"),
        ("batch", "seq_k", "heads", "d_v"),
    ),
    5: (
        ("batch", "seq_q", "groups", "heads", "d_k"),
        ("batch", "seq_k", "groups", "heads", "d_k"),
        ("batch", "seq_k", "groups", "heads", "d_v"),
    ),
}
_NO_BROADCAST = "xformers does not broadcast"


def is_xformers(func) -> bool:
    """Whether `func` is xformers' own `memory_efficient_attention` (what the trace's
    wrapper hands on)."""
    return (
        getattr(func, "__module__", "") == "xformers.ops.fmha"
        and getattr(func, "__name__", "") == _OP
    )


def is_block_diagonal(bias) -> bool:
    """xformers' block-diagonal biases (BlockDiagonalMask and its causal and local
    kinds, the padded and gappy keys ones): sequences packed along seq, by seqstarts."""
    q_info, k_info = getattr(bias, "q_seqinfo", None), getattr(bias, "k_seqinfo", None)
    return isinstance(getattr(q_info, "seqstart_py", None), list) and isinstance(
        getattr(k_info, "seqstart_py", None), list
    )


def tensor_bias(bias):
    """The tensor a bias adds to the scores: a plain tensor bias, or the one a
    LowerTriangularMaskWithTensorBias holds; None where it adds none."""
    if is_tensor(bias):
        return bias
    held = getattr(bias, "_bias", None)
    return held if is_tensor(held) else None


@rule(_ops.XFORMERS, kinds=_KINDS)
def xformers_contract(call: CallView) -> Iterator[Violation]:
    if not is_xformers(call.func):
        return
    bound = call.bound()
    q, k, v, bias = (bound.get(n) for n in ("query", "key", "value", "attn_bias"))
    if not (is_tensor(q) and is_tensor(k) and is_tensor(v)):
        return  # xformers' own checks say it
    names = [
        _label(call, t, i, n) for i, (t, n) in enumerate(((q, "query"), (k, "key"), (v, "value")))
    ]
    if q.dim() not in _AXES or k.dim() != q.dim() or v.dim() != q.dim():
        yield Violation(
            "xformers_shape",
            f"{_OP}: {names[0]} has {q.dim()} axes, {names[1]} {k.dim()}, {names[2]} "
            f"{v.dim()}; it takes q, k and v alike as [batch, seq, heads, d_k] (or "
            "[batch, seq, d_k], or [batch, seq, groups, heads, d_k])",
            tuple(call.operand(n, t) for n, t in zip(names, (q, k, v), strict=True)),
            "split the heads off the features: x.view(batch, seq, heads, d_k) for each",
        )
        return
    shapes = [tuple(int(s) for s in t.shape) for t in (q, k, v)]
    axes = _AXES[q.dim()]
    operands = [
        Operand(n, _axes.format_shape(s, a)) for n, s, a in zip(names, shapes, axes, strict=True)
    ]
    if bias is not None:
        operands.append(Operand(_label(call, bias, 3, "attn_bias"), _bias_text(bias)))
    found = _layout_swap(call, names, shapes) or _shape_problem(names, shapes, axes)
    if found is None and bias is not None:
        found = _bias_problem(names, shapes, bias)
    if found is not None:
        kind, relation, hint = found
        yield Violation(kind, f"{_OP}: {relation}", tuple(operands), hint)


def _label(call: CallView, value, index: int, param: str) -> str:
    if index < len(call.args) and call.args[index] is value:
        return call.label(index, param)
    return call.label_of(value, param) if is_tensor(value) else param


def _bias_text(bias) -> str:
    held = tensor_bias(bias)
    kind = type(bias).__name__
    if held is bias:
        return f"tensor {list(held.shape)}"
    if is_block_diagonal(bias):
        q_lengths, k_lengths = _lengths(bias.q_seqinfo), _lengths(bias.k_seqinfo)
        return f"{kind}(q_seqlen={q_lengths}, kv_seqlen={k_lengths})"
    if held is not None:
        return f"{kind} with a tensor {list(held.shape)}"
    return kind


def _lengths(info) -> list[int]:
    starts = info.seqstart_py
    lengths = getattr(info, "seqlen_py", None)  # padded keys: each block's real length
    if isinstance(lengths, list):
        return [int(n) for n in lengths]
    return [int(b) - int(a) for a, b in zip(starts, starts[1:], strict=False)]


def _layout_swap(call: CallView, names, shapes) -> tuple[str, str, str] | None:
    """q, k, v laid out as SDPA's [batch, heads, seq, d_k]: the module declares its head
    count, and q's axis 1 holds that many entries while its axis 2 does not."""
    declared = call.declared().get("heads")
    q = shapes[0]
    if declared is None or len(q) != 4:
        return None
    attr, size = declared
    if not (q[1] == size != q[2]):
        return None
    fix = ", ".join(f"{n}.transpose(1, 2)" for n in dict.fromkeys(names))
    return (
        "xformers_shape",
        f"{', '.join(dict.fromkeys(names))} look like [batch, heads, seq, d_k]; {_OP} takes "
        "[batch, seq, heads, d_k]",
        f"the module declares {attr}={size}, and axis 1 of {names[0]} has {size} entries. "
        f"Pass {fix} and transpose the output back",
    )


def _shape_problem(names, shapes, axes) -> tuple[str, str, str] | None:
    """The first size q, k and v do not share as xformers requires (no broadcasting)."""
    (qn, kn, vn), (q, k, v) = names, shapes
    qa, ka, _ = axes
    for name, shape in ((kn, k), (vn, v)):
        if shape[0] != q[0]:
            return (
                "xformers_shape",
                f"{name}.batch ({shape[0]}) != {qn}.batch ({q[0]})",
                f"{_NO_BROADCAST}: q, k and v come from the same batch (expand a shared k or "
                "v yourself)",
            )
    if k[1] != v[1]:
        return (
            "xformers_shape",
            f"{kn}.seq_k ({k[1]}) != {vn}.seq_k ({v[1]})",
            f"every key needs a value: {kn} and {vn} must have the same sequence length",
        )
    for axis in range(2, len(q) - 1):  # heads, and groups before them in BMGHK
        for name, shape in ((kn, k), (vn, v)):
            if shape[axis] != q[axis]:
                what = qa[axis]
                return (
                    "xformers_shape",
                    f"{name}.{what} ({shape[axis]}) != {qn}.{what} ({q[axis]})",
                    f"{_NO_BROADCAST}: {_gqa_remedy(name, shape, q[axis])}",
                )
    if k[-1] != q[-1]:
        return (
            "xformers_shape",
            f"{kn}.d_k ({k[-1]}) != {qn}.d_k ({q[-1]})",
            "queries and keys are compared in one head size: check the q and k projections "
            f"(their output features / heads); {ka[-1]} of {kn} must be {q[-1]}",
        )
    return None


def _gqa_remedy(name: str, shape: tuple[int, ...], heads: int) -> str:
    """Grouped-query attention's remedy: each kv head expanded to its query heads (a view)."""
    kv = shape[2]
    if len(shape) != 4 or kv == 0 or heads % kv:
        return "k and v need the query's heads (or groups) at this axis"
    b, s, d = shape[0], shape[1], shape[3]
    return (
        f"for grouped-query attention expand k and v to the query's {heads} heads: "
        f"{name}.unsqueeze(3).expand({b}, {s}, {kv}, {heads // kv}, {d}).reshape({b}, {s}, "
        f"{heads}, {d}), or pass [batch, seq, groups, heads, d_k] tensors, each group's kv "
        "head expanded"
    )


def _bias_problem(names, shapes, bias) -> tuple[str, str, str] | None:
    """A tensor bias that is not [batch, heads, seq_q, seq_k] (BMHK calls), a block-diagonal
    bias on a batch other than one, or whose seqstarts do not add up to seq_q and seq_k."""
    q, k = shapes[0], shapes[1]
    held = tensor_bias(bias)
    if held is not None and len(q) == 4:
        want = (q[0], q[2], q[1], k[1])
        have = tuple(int(s) for s in held.shape)
        if have == want:
            return None
        full = _axes.format_shape(want, ("batch", "heads", "seq_q", "seq_k"))
        fits = len(have) <= 4 and all(
            h in (1, w) for h, w in zip(reversed(have), reversed(want), strict=False)
        )
        remedy = (
            f"yours broadcasts to that shape: pass attn_bias.expand({', '.join(map(str, want))}) "
            "(a view, no copy)"
            if fits
            else "build it for these sizes"
        )
        return (
            "xformers_bias",
            f"the attn_bias tensor is {list(have)}, but {names[0]} and {names[1]} need {full}",
            f"{_NO_BROADCAST} a bias; {remedy}",
        )
    if not is_block_diagonal(bias):
        return None
    if any(shape[0] != 1 for shape in shapes):
        batch = q[0]
        return (
            "xformers_bias",
            f"{names[0]}.batch ({batch}) != 1, but a {type(bias).__name__} packs the sequences "
            "along seq in one row",
            f"pack them: {names[0]}.reshape(1, {batch} * seq, ...) for q, k and v, with "
            f"{type(bias).__name__}.from_seqlens(the {batch} lengths), or pass the batch "
            "with a per-example bias instead",
        )
    if "Gappy" in type(bias).__name__ or "Paged" in type(bias).__name__:
        return None  # their seqstarts are offsets into blocks of keys, not a packed total
    for info, shape, name, axis, side in (
        (bias.q_seqinfo, q, names[0], "seq_q", "q_seqlen"),
        (bias.k_seqinfo, k, names[1], "seq_k", "kv_seqlen"),
    ):
        total = int(info.seqstart_py[-1])
        if total != shape[1]:
            lengths = _lengths(info)
            return (
                "xformers_bias",
                f"the {type(bias).__name__}'s {side}={lengths} end at {total}, but "
                f"{name}.{axis} is {shape[1]}",
                f"make the bias from the lengths of the sequences packed into {name}: they "
                f"add up to its {axis} ({shape[1]}); a wrong total reads past the sequences "
                "or leaves tokens out",
            )
    return None
