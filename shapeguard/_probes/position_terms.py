"""Where token permutation breaks: a position term the module adds, or a bug.

Permuting the tokens permutes the outputs alike only where nothing depends on the
tokens' order. A module can make order part of its function by design without any op
the trace marks as positional: a learned table added whole (`x + self.pos_embed`), a
relative-bias table cut by length and added to the scores, a [seq, seq] mixing matrix.
The two runs of the probe (tokens as given, tokens permuted) are compared op by op;
at the first op whose output breaks the permutation, an operand made from the module's
own parameters, buffers or constants (none of the inputs flows into it) with an axis as
long as the tokens is such a position term: the module does not promise the property,
and the probe says so instead of failing. A convolution whose kernel is wider than one along
an output axis the trace names a token axis (its spatial axis, by the conv's documented
[N, C, *spatial] layout) mixes neighbouring positions by design (Informer's circular conv
token embedding): the property does not apply, and the probe says so, naming the conv.
Where the first op that breaks it reads only what the inputs made (a view that moves data
across the seq axis), it is a failure.
"""

from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .compare import deviation, scale_of
from .locate import TOKEN_AXES, region_permuted
from .subject import Subject
from .tree import leaves, op_tensors
from .watch import describe_event


class _Flow:
    """Records each op's first output and the shapes of its operands made from none of
    the inputs (an observer of one traced forward)."""

    def __init__(self, inputs) -> None:
        self.session: Any = None  # the session it observes, set once it is open
        self.made = WeakTensorKeyDictionary()  # tensors the inputs flow into
        for _, t in leaves(inputs):
            self.made[t] = True
        self.steps: list[tuple] = []

    def before(self, func, op: str, args, kwargs) -> None:
        pass

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        operands = op_tensors((args, kwargs))
        outs = op_tensors(out)
        fed = any(t in self.made for t in operands)
        if fed:
            for o in outs:
                self.made[o] = True
        first = outs[0] if outs else None
        if first is None or not first.is_floating_point() or self.session is None:
            return
        own: list[tuple] = [tuple(t.shape) for t in operands if t not in self.made and t.dim() > 0]
        events = self.session.trace.events
        where = describe_event(events[-1]) if len(events) > count and events[-1].op == op else op
        meta = self.session.metas.get(first)
        axes = meta.axes if meta is not None else ()
        window = _kernel_by_axis(op, operands, first)
        self.steps.append((op, where, first.detach().clone(), axes, own, window))


def _kernel_by_axis(op: str, operands: list, out) -> dict[int, int]:
    """A convolution's kernel size along each spatial axis of its output ({axis: size});
    {} for any other op. conv1d/2d/3d read [N, C, *spatial] (or [C, *spatial]) with a
    weight [out, in / groups, *kernel]: the last axes are the spatial ones, in order."""
    if _ops.lookup(op).family != _ops.CONV or len(operands) < 2:
        return {}
    weight = operands[1]
    spatial = weight.dim() - 2
    if spatial < 1 or out.dim() < spatial + 1:
        return {}
    first = out.dim() - spatial
    return {first + i: int(weight.shape[2 + i]) for i in range(spatial)}


def _record(s: Subject, inputs) -> list[tuple]:
    import warnings

    from .. import _config
    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    args, kwargs = inputs
    flow = _Flow(inputs)
    with _config.forced_on(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with recording_session(Trace(mode="warn"), s.model, args, kwargs) as session:
            flow.session = session
            with session.observe(flow):
                s.model(*args, **kwargs)
    return flow.steps


def _mixes_tokens(where: str, out, axes, window: dict[int, int], length: int) -> str:
    """Why a convolution's output depends on the tokens' order: a kernel wider than one
    along an output axis of the tokens' length that the trace names a token axis ("")."""
    names = tuple(axes or ())
    for d, kernel in window.items():
        if kernel > 1 and out.shape[d] == length and d < len(names) and names[d] in TOKEN_AXES:
            return (
                f"{where} has a kernel of {kernel} along {names[d]} (axis {d} of its "
                f"output, the {length} tokens): it mixes neighbouring positions, so the "
                "output depends on the tokens' order by design and the module is not "
                "permutation-equivariant"
            )
    return ""


NONE = ("", "")  # no reason found: the probe's failure stands


def position_term(s: Subject, given, moved, perm: torch.Tensor) -> tuple[str, str]:
    """Why the module is not permutation-equivariant by design, at the op that first breaks
    the permutation: ("n/a", why) for a convolution along the tokens, ("inconclusive", why)
    for a term made from the module's own state laid along them, `NONE` where the first
    break reads only what the inputs made, or cannot be found."""
    length = len(perm)
    try:
        first, second = _record(s, given), _record(s, moved)
    except Exception:
        return NONE
    region = region_permuted(length, perm)
    for (op_a, where, a, axes, own, window), (op_b, _, b, *_) in zip(first, second, strict=False):
        if op_a != op_b:
            return NONE  # the runs took different paths: no op-by-op comparison
        pair = region(a, b, axes)
        if pair is None or deviation(pair[0], pair[1], scale_of(a)) <= s.rtol:
            continue
        mixing = _mixes_tokens(where, a, axes, window, length)
        if mixing:
            return "n/a", mixing
        tables = [shape for shape in own if length in shape and length > 1]
        if not tables:
            return NONE
        return "inconclusive", (
            f"{where} adds a term made from the module's own parameters or buffers "
            f"({list(tables[0])}), laid along the {length} tokens: a position term (a "
            "learned position table, a relative bias cut to the length) the permutation "
            "does not move, so the module is not permutation-equivariant by design"
        )
    return NONE
