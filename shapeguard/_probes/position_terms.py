"""Where token permutation breaks: a position term the module adds, or a bug.

Permuting the tokens permutes the outputs alike only where nothing depends on the
tokens' order. A module can make order part of its function by design without any op
the trace marks as positional: a learned table added whole (`x + self.pos_embed`), a
relative-bias table cut by length and added to the scores, a [seq, seq] mixing matrix.
The two runs of the probe (tokens as given, tokens permuted) are compared op by op;
at the first op whose output breaks the permutation, an operand made from the module's
own parameters, buffers or constants (none of the inputs flows into it) with an axis as
long as the tokens is such a position term: the module does not promise the property,
and the probe says so instead of failing; so is a convolution along the tokens (its kernel
is laid along the relative positions). Where the first op that breaks it reads only what
the inputs made (a view that moves data across the seq axis), it is a failure.
"""

from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .compare import deviation, scale_of
from .locate import region_permuted
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
        if _ops.lookup(op).family == _ops.CONV and operands and operands[0].dim() > 2:
            # A convolution's kernel is laid along its input's spatial axes: a relative
            # position term wherever one of them holds the tokens.
            own.append(("along", *operands[0].shape[2:]))
        events = self.session.trace.events
        where = describe_event(events[-1]) if len(events) > count and events[-1].op == op else op
        meta = self.session.metas.get(first)
        axes = meta.axes if meta is not None else ()
        self.steps.append((op, where, first.detach().clone(), axes, own))


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


def position_term(s: Subject, given, moved, perm: torch.Tensor) -> str:
    """The op where a term made from the module's own state, laid along the tokens, first
    breaks the permutation ("" where the first break reads only what the inputs made, or
    cannot be found)."""
    length = len(perm)
    try:
        first, second = _record(s, given), _record(s, moved)
    except Exception:
        return ""
    region = region_permuted(length, perm)
    for (op_a, where, a, axes, own), (op_b, _, b, _, _) in zip(first, second, strict=False):
        if op_a != op_b:
            return ""  # the runs took different paths: no op-by-op comparison
        pair = region(a, b, axes)
        if pair is None or deviation(pair[0], pair[1], scale_of(a)) <= s.rtol:
            continue
        tables = [shape for shape in own if length in shape and length > 1]
        if not tables:
            return ""
        if tables[0][0] == "along":
            return (
                f"{where} convolves along the {length} tokens with a kernel of the module's "
                "own parameters: a relative position term the permutation does not move, so "
                "the module is not permutation-equivariant by design"
            )
        return (
            f"{where} adds a term made from the module's own parameters or buffers "
            f"({list(tables[0])}), laid along the {length} tokens: a position term (a "
            "learned position table, a relative bias cut to the length) the permutation "
            "does not move, so the module is not permutation-equivariant by design"
        )
    return ""
