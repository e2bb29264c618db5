"""Semantic probes: properties every correct attention module has, checked by running it.

Each probe changes the inputs (or the weights) in a way that must leave some part
of the output unchanged (or permuted), runs the module, and measures how far the
output moved, relative to the output's scale. The inputs are sliced and perturbed
along the axes the trace identified as batch and seq; a probe that cannot tell
those axes apart, or does not apply to the module, says so and is skipped.

- batch independence: changing one example leaves the others' outputs alone;
- sub-batch consistency: the first examples run alone give the same outputs;
- causality (causal modules): changing later tokens leaves earlier outputs alone;
- key-padding invariance: changing padded keys leaves the real tokens' outputs alone;
- token-permutation equivariance (no positional terms, no mask);
- head-permutation invariance: permuting heads in the Q/K/V projections' rows and
  the output projection's columns leaves the output unchanged;
- length change: the module runs at a shorter length, and a causal module's first
  t outputs are the outputs of the first t tokens alone.

Everything here runs on a private copy of the module, in float64 when it can.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import _axes

# Relative tolerance on the output's scale: float64 rounding is ~1e-16 per op.
RTOL = {torch.float64: 1e-7, torch.float32: 1e-4}
_DEFAULT_RTOL = 1e-2
_SEQ_NAMES = ("seq", "seq_q", "seq_k")


@dataclass(slots=True)
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: the property checked, e.g. "batch independence".
        status: "passed", "failed" or "skipped".
        message: what was done and what came out, in the house style.
        deviation: how far the output moved, relative to its scale (None when not run).
        tolerance: the largest deviation accepted, on the same scale.
        op: the traced op a failure points to, "op at file:line (module)".
    """

    name: str
    status: str
    message: str
    deviation: float | None = None
    tolerance: float | None = None
    op: str = ""

    @property
    def passed(self) -> bool:
        """False only for a failed probe (a skipped one does not fail the check)."""
        return self.status != "failed"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "message": self.message,
            "deviation": self.deviation,
            "tolerance": self.tolerance,
            "op": self.op,
        }


# -- inputs as leaves ------------------------------------------------------------------
@dataclass(slots=True)
class Leaf:
    """One tensor among the inputs: where it sits, what it is, which axes are which."""

    path: tuple
    name: str
    kind: str  # "data" (token features), "mask", "other" (cos/sin, positions, ...)
    batch: int | None = None
    seq: dict[int, int] = field(default_factory=dict)  # axis -> seq group


def leaves(obj, path=()) -> list[tuple[tuple, torch.Tensor]]:
    """Every tensor in nested tuples, lists and dicts, with its path."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    found = []
    if isinstance(obj, tuple | list):
        for i, item in enumerate(obj):
            found += leaves(item, (*path, i))
    elif isinstance(obj, dict):
        for key, item in obj.items():
            found += leaves(item, (*path, key))
    return found


def rebuild(obj, fn: Callable, path=()):
    """A copy of `obj` with each tensor replaced by `fn(path, tensor)`."""
    if isinstance(obj, torch.Tensor):
        return fn(path, obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj)))
    if isinstance(obj, tuple | list):
        return type(obj)(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj))
    if isinstance(obj, dict):
        return {k: rebuild(v, fn, (*path, k)) for k, v in obj.items()}
    return obj


def first_output(out) -> torch.Tensor | None:
    """The first floating tensor of a module's output (tuple, dict or ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, tuple | list) else ()
    for item in items:
        found = first_output(item)
        if found is not None:
            return found
    return None


_PAD_NAMES = ("pad",)


def _kind(name: str, t: torch.Tensor) -> str:
    """ "mask" (bool, integer, named so, or an additive 0 / -inf float mask), "other" for
    positional inputs (cos, sin, position tables: moved with their tokens, never
    redrawn), else "data"."""
    if t.dtype == torch.bool or not t.is_floating_point() or "mask" in name.lower():
        return "mask"
    if positional_name(name):
        return "other"
    if t.device.type != "cpu" or t.numel() > 1 << 22 or t.dim() < 2:
        return "data"
    additive = bool(((t == 0) | (t <= -1e4)).all()) and bool((t <= -1e4).any())
    return "mask" if additive else "data"


@dataclass(slots=True)
class Layout:
    """Batch size, seq groups and each leaf's axes, as the probes see the inputs."""

    batch_size: int | None
    lengths: list[int]  # length of each seq group; group 0 holds the queries
    leaves: dict[tuple, Leaf]
    ambiguous: str = ""  # why some axes cannot be told apart, if they cannot
    batch_dim: int = 0
    seq_dim: int = 1


def read_layout(model, args: tuple, kwargs: dict, names: list[str]) -> Layout | str:
    """Find batch and seq axes: the first floating input with 3 or more axes is
    [batch, seq, features] ([seq, batch, features] for a module built with
    batch_first=False); other inputs are matched by their sizes."""
    found = leaves((args, kwargs))
    name_of = {p: names[i] if i < len(names) else _path_name(p) for i, (p, _) in enumerate(found)}
    kinds = {p: _kind(name_of[p], t) for p, t in found}
    primary = next(((p, t) for p, t in found if kinds[p] == "data" and t.dim() >= 3), None)
    if primary is None:
        return "no input is [batch, seq, features]: the probes need one"
    batch_dim, seq_dim = (1, 0) if _seq_first(model) else (0, 1)
    p_shape = primary[1].shape
    batch_size = int(p_shape[batch_dim])
    lengths = [int(p_shape[seq_dim])]
    layout = Layout(batch_size, lengths, {}, batch_dim=batch_dim, seq_dim=seq_dim)
    for path, t in found:
        kind = kinds[path]
        leaf = Leaf(path, name_of[path], kind)
        if kind == "data" and t.dim() >= 3 and t.shape[batch_dim] == batch_size:
            # Another token input: keys and values, or a memory of its own length.
            length = int(t.shape[seq_dim])
            if length not in lengths:
                lengths.append(length)
            leaf.batch, leaf.seq = batch_dim, {seq_dim: lengths.index(length)}
        else:
            leaf.kind = "other" if kind == "data" else kind
            _match_by_size(layout, leaf, t)
        layout.leaves[path] = leaf
    return layout


def _match_by_size(layout: Layout, leaf: Leaf, t: torch.Tensor) -> None:
    """Axes of a mask (all of them) or of a cos/sin-like input (all but the last) named
    by size; a size shared by batch and a seq group, or by two groups, is ambiguous."""
    dims = range(t.dim()) if leaf.kind == "mask" else range(t.dim() - 1)
    known = [layout.batch_size, *layout.lengths]
    if (
        leaf.kind == "mask"
        and t.dim() == 2
        and tuple(t.shape) == (known[0], known[1]) == (known[1], known[0])
    ):
        # batch == seq: a triangle is [seq_q, seq_k], anything else a [batch, seq] padding mask.
        if _triangular(t):
            leaf.seq = {0: 0, 1: 0}
        else:
            leaf.batch, leaf.seq = 0, {1: 0}
        return
    for d in dims:
        size = int(t.shape[d])
        if size == 1 or size not in known:
            continue
        if known.count(size) > 1:
            layout.ambiguous = (
                f"{leaf.name} {list(t.shape)}: batch and seq (or two sequences) are both "
                f"{size}, so its axes cannot be told apart; use distinct sizes"
            )
            continue
        if size == layout.batch_size and leaf.batch is None and not leaf.seq:
            leaf.batch = d
        elif size in layout.lengths:
            leaf.seq[d] = layout.lengths.index(size)


def _triangular(t: torch.Tensor) -> bool:
    from .checks.mask_semantics import triangle

    hidden = t <= -1e4 if t.is_floating_point() and bool((t < 0).any()) else t != 0
    return bool(triangle(hidden) or triangle(~hidden))


def _seq_first(model) -> bool:
    for module in (model, getattr(model, "self_attn", None)):
        if module is not None and getattr(module, "batch_first", True) is False:
            return True
    return False


def _path_name(path: tuple) -> str:
    return ".".join(str(p) for p in path[1:]) or "input"


def positional_name(name: str) -> bool:
    """`position_embeddings.0`, `cos`, `freqs_cis`: an input that encodes positions."""
    lowered = name.lower()
    return any(w in lowered for w in ("position", "pos_", "cos", "sin", "rotary", "rope", "freqs"))


# -- editing inputs --------------------------------------------------------------------
def take(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    return x.index_select(dim, index.to(x.device))


def sliced(
    layout: Layout,
    inputs,
    *,
    batch: int | None = None,
    group: int | None = None,
    length: int | None = None,
):
    """Inputs cut to the first `batch` examples, or group `group` cut to `length`."""

    def cut(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        if batch is not None and leaf.batch is not None:
            t = t.narrow(leaf.batch, 0, batch)
        if group is not None:
            for dim, g in leaf.seq.items():
                if g == group:
                    t = t.narrow(dim, 0, length)
        return t.contiguous()  # a slice is a view; the module may .view() its input

    return rebuild(inputs, cut)


def permuted(layout: Layout, inputs, perms: dict[int, torch.Tensor]):
    """Inputs with each seq group's positions permuted (data, masks and positions alike)."""

    def move(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        for dim, g in leaf.seq.items():
            if g in perms:
                t = take(t, dim, perms[g])
        return t

    return rebuild(inputs, move)


def perturbed(
    layout: Layout,
    inputs,
    generator,
    *,
    example: int | None = None,
    group: int | None = None,
    positions: torch.Tensor | None = None,
):
    """Inputs whose data values are redrawn at one example, at some positions of a seq
    group, or at both; masks and positional inputs stay as they are."""

    def change(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or leaf.kind != "data":
            return t
        where = torch.ones(t.shape, dtype=torch.bool)
        if example is not None:
            if leaf.batch is None:
                return t
            where &= _along(t, leaf.batch, torch.tensor([example]))
        if group is not None:
            dims = [d for d, g in leaf.seq.items() if g == group]
            if not dims:
                return t
            where &= _along(t, dims[0], positions)
        noise = torch.randn(t.shape, generator=generator, dtype=t.dtype) * t.std().clamp(min=1e-3)
        return torch.where(where.to(t.device), noise.to(t.device), t)

    return rebuild(inputs, change)


def _along(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """A bool tensor of t's shape, True at `index` along `dim`."""
    hit = torch.zeros(t.shape[dim], dtype=torch.bool)
    hit[index] = True
    shape = [1] * t.dim()
    shape[dim] = -1
    return hit.view(shape).expand(t.shape)


# -- comparing outputs -----------------------------------------------------------------
def deviation(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """max |a - b| over `scale`; NaN in one place and not the other is infinite."""
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if bool((nan_a != nan_b).any()):
        return float("inf")
    both = ~nan_a
    if not bool(both.any()):
        return 0.0
    diff = (a[both] - b[both]).abs().max().item()
    return diff / scale


def scale_of(out: torch.Tensor) -> float:
    finite = out[torch.isfinite(out)]
    if finite.numel() == 0:
        return 1.0
    return max(finite.abs().max().item(), 1e-12)


def rtol_for(dtype) -> float:
    return RTOL.get(dtype, _DEFAULT_RTOL)


def distinct_length(current: int, taken: set[int]) -> int | None:
    """A smaller size (about half) that coincides with no other size in play."""
    for t in (current // 2 + 1, *range(current - 1, 0, -1)):
        if 1 <= t < current and t not in taken:
            return t
    return None


def derangement(n: int, generator) -> torch.Tensor:
    """A random permutation of range(n) that moves every element (one n-cycle)."""
    order = torch.randperm(n, generator=generator)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def sizes_in_play(layout: Layout, declared: dict) -> set[int]:
    sizes = {size for _, size in declared.values()}
    sizes.update(layout.lengths)
    if layout.batch_size:
        sizes.add(layout.batch_size)
    return sizes


def declared_sizes(model) -> dict:
    for module in model.modules():
        found = _axes.declared_sizes(module)
        if "heads" in found:
            return found
    return {}


def seq_axes_of(axes, shape, length: int) -> list[int]:
    """Axes named seq, seq_q or seq_k whose size is `length`."""
    return [d for d, n in enumerate(axes or ()) if n in _SEQ_NAMES and shape[d] == length]


# -- what the trace says about the module ------------------------------------------------
_POSITIONAL_OPS = frozenset({"arange", "cos", "sin", "polar", "view_as_complex", "embedding"})
_TABLE_READS = frozenset({"__getitem__", "index_select", "narrow", "embedding", "gather"})


class Watch:
    """Notes, while a shapeguard session traces one forward, what the probes need to
    know: whether the module is causal, masked or positional, which Linears make Q, K,
    V and read the context, and (for locating a failure) every op's output."""

    def __init__(self, session, *, keep_values: bool = False) -> None:
        from torch.overrides import TorchFunctionMode

        from ._session import _PASS_THROUGH_ATTRS, _PASS_THROUGH_NAMES, op_name

        watch = self
        skip = _PASS_THROUGH_NAMES | _PASS_THROUGH_ATTRS
        self.session = session
        self.causal = ""  # why the module is causal, when it is
        self.masked = ""  # where a mask is applied
        self.positional = ""  # where a positional term is computed
        self.linears: list[tuple] = []  # (module, input role, output role)
        self.values: list[tuple] | None = [] if keep_values else None

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                op = op_name(func)
                if op in skip:
                    return func(*args, **kwargs)
                count = len(watch.session.trace.events)
                watch._before(func, op, args, kwargs)
                out = func(*args, **kwargs)
                watch._after(op, args, out, count)
                return out

        self.mode = _Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def _where(self, count: int, op: str) -> str:
        events = self.session.trace.events
        if len(events) > count and events[-1].op == op:
            return describe_event(events[-1])
        return op

    def _before(self, func, op: str, args, kwargs) -> None:
        if op not in _MASKING_OPS:
            return
        from ._session import OpCall
        from .checks.mask_semantics import aligned, mask_uses, triangle

        call = OpCall(self.session, func, op, args, kwargs, None)
        positional = args[5] if op == "scaled_dot_product_attention" and len(args) > 5 else None
        if kwargs.get("is_causal", positional) is True and not self.causal:
            self.causal = f"{op}(is_causal=True)"
        for use in mask_uses(call):
            self.masked = self.masked or use.op
            hidden = aligned(use.hidden, len(use.target))
            square = hidden.shape[-2:] == use.target[-2:] and min(use.target[-2:]) > 1
            if square and not self.causal and triangle(hidden):
                self.causal = f"a triangular mask in {use.op}"

    def _after(self, op: str, args, out, count: int) -> None:
        session = self.session
        if op in _POSITIONAL_OPS or (op in _TABLE_READS and _reads_a_table(session, args)):
            self.positional = self.positional or self._where(count, op)
        if op == "linear" and session.module_stack and isinstance(out, torch.Tensor):
            meta_in, meta_out = session.metas.get(args[0]), session.metas.get(out)
            self.linears.append(
                (
                    session.module_stack[-1],
                    meta_in.role if meta_in else None,
                    meta_out.role if meta_out else None,
                )
            )
        out = first_output(out)  # nn.MultiheadAttention's op returns (output, weights)
        if self.values is not None and out is not None:
            meta = session.metas.get(out)
            axes = meta.axes if meta else ()
            self.values.append((op, self._where(count, op), out.detach().clone(), axes))


_MASKING_OPS = frozenset(
    {
        "masked_fill",
        "masked_fill_",
        "where",
        "add",
        "__add__",
        "__radd__",
        "add_",
        "__iadd__",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
    }
)


def _reads_a_table(session, args) -> bool:
    """Indexing a parameter or a module buffer: a position table, usually."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    table = args[0]
    if isinstance(table, torch.nn.Parameter):
        return True
    meta = session.metas.get(table)
    if meta is not None:
        return bool(meta.buffer)
    return any(buf is table for module in session.module_stack for buf in module._buffers.values())


def describe_event(event) -> str:
    """`view at model.py:12 (blocks.0.attn)`: how a failed probe names a traced op."""
    where = f"{event.op} at {event.location}" if event.location else event.op
    module = event.module or event.module_type
    return f"{where} ({module})" if module else where


# -- the module under probe ----------------------------------------------------------------
@dataclass(slots=True)
class Subject:
    """A private copy of the module, its inputs, and what the trace found."""

    model: torch.nn.Module
    inputs: tuple  # (args, kwargs)
    layout: Layout
    reference: torch.Tensor
    out_batch: int | None
    out_seq: int | None
    watch: Watch
    events: list
    declared: dict
    rtol: float
    generator: torch.Generator
    causal: str = ""
    traced_model: torch.nn.Module | None = None  # the copy the trace ran (its Linears)

    def run(self, inputs) -> torch.Tensor:
        args, kwargs = inputs
        out = first_output(self.model(*args, **kwargs))
        if out is None:
            raise RuntimeError("the module returned no floating-point tensor")
        return out

    def result(
        self,
        name: str,
        dev: float,
        action: str,
        target: str,
        hint: str,
        point=None,
        lead: str = "first seen at ",
    ) -> ProbeResult:
        """Passed or failed by `dev` against the tolerance: "<action> left <target>
        unchanged", or "<action> moved <target> by ..." with the op `point()` names."""
        tol = self.rtol
        if dev <= tol:
            return ProbeResult(
                name, "passed", f"{action} left {target} unchanged (deviation {dev:.1e})", dev, tol
            )
        op = point() if point is not None else ""
        where = f"\n  {lead}{op}" if op else ""
        return ProbeResult(
            name,
            "failed",
            f"{action} moved {target} by {_fmt(dev)} of the output's scale (tolerance "
            f"{tol:.0e}){where}\n  hint: {hint}",
            dev,
            tol,
            op,
        )


def _fmt(dev: float) -> str:
    return "inf (NaN appeared)" if dev == float("inf") else f"{dev:.2g}"


def skipped(name: str, why: str) -> ProbeResult:
    return ProbeResult(name, "skipped", why)


def out_rows(subject: Subject, out: torch.Tensor, *, examples=None, positions=None):
    """The output restricted to some examples (batch axis) and query positions (seq axis)."""
    if examples is not None:
        out = take(out, subject.out_batch, torch.as_tensor(examples))
    if positions is not None:
        out = take(out, subject.out_seq, torch.as_tensor(positions))
    return out


# -- the probes -------------------------------------------------------------------------
def batch_independence(s: Subject) -> ProbeResult:
    name = "batch independence"
    b = s.layout.batch_size
    if not b or b < 2 or s.out_batch is None:
        return skipped(name, "needs a batch of 2 or more and a batch axis in the output")
    if s.layout.ambiguous:
        return skipped(name, s.layout.ambiguous)
    j = b - 1
    changed = perturbed(s.layout, s.inputs, s.generator, example=j)
    others = list(range(j))
    out = s.run(changed)
    dev = deviation(
        out_rows(s, out, examples=others),
        out_rows(s, s.reference, examples=others),
        scale_of(s.reference),
    )

    def point():
        return locate(s, s.inputs, changed, _region_batch(b, others))

    return s.result(
        name,
        dev,
        f"changing example {j} of {b}",
        "the other examples' outputs",
        "something mixes examples: a view or reshape that moves data across the batch axis, "
        "attention over the batch axis, or a [batch, seq] mask read as [seq_q, seq_k]",
        point,
    )


def sub_batch(s: Subject) -> ProbeResult:
    name = "sub-batch consistency"
    b = s.layout.batch_size
    if not b or b < 2 or s.out_batch is None:
        return skipped(name, "needs a batch of 2 or more and a batch axis in the output")
    if s.layout.ambiguous:
        return skipped(name, s.layout.ambiguous)
    k = distinct_length(b, sizes_in_play(s.layout, s.declared)) or 1
    small = sliced(s.layout, s.inputs, batch=k)
    try:
        out = s.run(small)
    except Exception as error:  # the module itself fails: that is the finding
        return _crashed(name, f"the first {k} of {b} examples run alone", error, s, small)
    ref = s.reference.narrow(s.out_batch, 0, k)
    dev = deviation(out, ref, scale_of(s.reference))

    def point():
        return locate(s, s.inputs, small, _region_prefix("batch", b, k))

    return s.result(
        name,
        dev,
        f"running the first {k} of {b} examples alone",
        "their outputs",
        "an example's output depends on the batch it is in: look for data moved across the "
        "batch axis, or a mask that lines up only at this batch size",
        point,
    )


def causality(s: Subject) -> ProbeResult:
    name = "causality"
    if not s.causal:
        return skipped(
            name,
            "the module is not causal (no is_causal, no triangular mask, "
            "not declared with causal=True)",
        )
    length = s.layout.lengths[0]
    if length < 2 or s.out_seq is None:
        return skipped(name, "needs 2 or more tokens and a seq axis in the output")
    t = length // 2
    later = torch.arange(t, length)
    changed = perturbed(s.layout, s.inputs, s.generator, group=0, positions=later)
    out = s.run(changed)
    early = list(range(t))
    dev = deviation(
        out_rows(s, out, positions=early),
        out_rows(s, s.reference, positions=early),
        scale_of(s.reference),
    )

    def point():
        return locate(s, s.inputs, changed, _region_prefix("seq", length, t, same_size=True))

    return s.result(
        name,
        dev,
        f"changing tokens {t}..{length - 1}",
        f"the outputs of tokens 0..{t - 1}",
        f"the module is causal ({s.causal}) but earlier tokens see later ones: check the "
        "mask's polarity and direction (hide key j from query i when j > i) and that it "
        "reaches every head",
        point,
    )


def length_change(s: Subject) -> ProbeResult:
    name = "length change"
    length = s.layout.lengths[0]
    if s.layout.ambiguous:
        return skipped(name, s.layout.ambiguous)
    t = distinct_length(length, sizes_in_play(s.layout, s.declared))
    if t is None:
        return skipped(name, f"no shorter length than {length} that differs from the other sizes")
    short = sliced(s.layout, s.inputs, group=0, length=t)
    try:
        out = s.run(short)
    except Exception as error:
        return _crashed(name, f"at seq {t} instead of {length}", error, s, short)
    if s.out_seq is not None and out.shape[s.out_seq] != t:
        return ProbeResult(
            name,
            "failed",
            f"at seq {t} instead of {length} the output has "
            f"{out.shape[s.out_seq]} positions on its seq axis, not {t}",
        )
    if not s.causal or s.out_seq is None:
        return ProbeResult(name, "passed", f"runs at seq {t} instead of {length}")
    ref = s.reference.narrow(s.out_seq, 0, t)
    dev = deviation(out, ref, scale_of(s.reference))

    def point():
        return locate(s, s.inputs, short, _region_prefix("seq", length, t))

    return s.result(
        name,
        dev,
        f"running the first {t} of {length} tokens alone",
        "their outputs",
        f"the module is causal ({s.causal}), so a prefix must give the same outputs alone: "
        "a mask or position term that depends on the full length is misaligned",
        point,
    )


def key_padding(s: Subject) -> ProbeResult:
    name = "key-padding invariance"
    found = _padding_leaf(s)
    if isinstance(found, str):
        return skipped(name, found)
    path, leaf, group, pads_true = found
    if s.out_batch is None or (group == 0 and s.out_seq is None):
        return skipped(name, "the output has no batch and seq axes to compare")
    length = s.layout.lengths[group]
    p = max(1, length // 3)
    padded = torch.arange(length - p, length)
    with_padding = rebuild(
        s.inputs, lambda q, t: _pad(t, leaf, padded, pads_true) if q == path else t
    )
    reference = s.run(with_padding)
    changed = perturbed(
        s.layout, with_padding, s.generator, example=0, group=group, positions=padded
    )
    out = s.run(changed)
    b = s.layout.batch_size
    parts = []
    if group == 0:  # self-attention: the padded queries' own outputs may change
        real = list(range(length - p))
        parts.append(
            (
                out_rows(s, out, examples=[0], positions=real),
                out_rows(s, reference, examples=[0], positions=real),
            )
        )
    else:
        parts.append((out_rows(s, out, examples=[0]), out_rows(s, reference, examples=[0])))
    if b > 1:
        rest = list(range(1, b))
        parts.append((out_rows(s, out, examples=rest), out_rows(s, reference, examples=rest)))
    dev = max(deviation(a, r, scale_of(reference)) for a, r in parts)
    polarity = "True" if pads_true else "False"
    keys = "key" if p == 1 else f"{p} keys"

    def point():
        return locate(s, with_padding, changed, _region_padding(length, p))

    return s.result(
        name,
        dev,
        f"changing the last {keys} of example 0, marked as padding in {leaf.name} "
        f"({polarity} = padding)",
        "the real tokens' outputs",
        "padded keys still reach the real tokens: check the mask's polarity and that it "
        "sits on the key axis ([batch, 1, 1, seq_k])",
        point,
    )


def token_permutation(s: Subject) -> ProbeResult:
    name = "token-permutation equivariance"
    if s.causal or s.watch.masked:
        return skipped(name, f"the module applies a mask ({s.causal or s.watch.masked})")
    if s.watch.positional:
        return skipped(name, f"the module has positional terms ({s.watch.positional})")
    if s.out_seq is None or s.layout.lengths[0] < 2:
        return skipped(name, "needs 2 or more tokens and a seq axis in the output")
    if s.layout.ambiguous:
        return skipped(name, s.layout.ambiguous)
    perms = {g: derangement(n, s.generator) for g, n in enumerate(s.layout.lengths) if n > 1}
    moved = permuted(s.layout, s.inputs, perms)
    out = s.run(moved)
    expected = take(s.reference, s.out_seq, perms[0])
    dev = deviation(out, expected, scale_of(s.reference))

    def point():
        return locate(s, s.inputs, moved, _region_permuted(s.layout.lengths[0], perms[0]))

    return s.result(
        name,
        dev,
        "permuting the tokens",
        "the outputs (permuted back)",
        "with no mask and no positions, attention treats tokens as a set: a view that moves "
        "data across the seq axis, or a hidden position term, breaks that",
        point,
    )


def _crashed(name: str, what: str, error: Exception, s: Subject, inputs) -> ProbeResult:
    """The module raised: rerun under shapeguard for the op, line and an explanation."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    op, relation = locate_crash(s, inputs)
    where = f"\n  raised at {op}" if op else ""
    return ProbeResult(
        name, "failed", f"{what}, the module fails: {relation or first}{where}", op=op
    )


def _padding_leaf(s: Subject):
    """The [batch, seq_k] (or [batch, 1, 1, seq_k]) padding mask among the inputs, with its
    polarity: True (or nonzero) marks padding when its name says pad, else it marks keys to
    keep; a float mask is additive (very negative = padding)."""
    for path, leaf in s.layout.leaves.items():
        if leaf.kind != "mask" or leaf.batch is None or len(leaf.seq) != 1:
            continue
        ((dim, group),) = leaf.seq.items()
        if s.layout.lengths[group] < 2:
            continue
        return path, leaf, group, any(w in leaf.name.lower() for w in _PAD_NAMES)
    return "no [batch, seq_k] padding mask among the inputs"


def _pad(t: torch.Tensor, leaf: Leaf, padded: torch.Tensor, pads_true: bool) -> torch.Tensor:
    """The mask with the `padded` keys of example 0 marked as padding."""
    t = t.clone()
    ((dim, _),) = leaf.seq.items()
    where = _along(t, dim, padded) & _along(t, leaf.batch, torch.tensor([0]))
    value = torch.finfo(t.dtype).min if t.is_floating_point() else int(pads_true)
    return t.masked_fill(where.to(t.device), value)


# -- locating a failure ------------------------------------------------------------------
def record_values(s: Subject, inputs, *, mode: str = "warn") -> list[tuple]:
    """Every op's output in one traced forward: (op, where, value, axis names)."""
    import warnings

    from . import _config
    from ._errors import ShapeWarning
    from ._record import Trace
    from ._session import close_session, open_session

    args, kwargs = inputs
    disabled, _config._disabled_by_api = _config._disabled_by_api, False  # probe runs turn it off
    session = open_session(Trace(mode=mode), root=s.model)
    watch = Watch(session, keep_values=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShapeWarning)
            session.enter_module(s.model, args, kwargs)
            with watch:
                s.model(*args, **kwargs)
    finally:
        close_session(session)
        _config._disabled_by_api = disabled
    return watch.values or []


def locate(s: Subject, inputs_a, inputs_b, region) -> str:
    """The first traced op whose output differs, in the region the probe says must not."""
    try:
        first, second = record_values(s, inputs_a), record_values(s, inputs_b)
    except Exception:
        return ""
    for (op_a, where, a, axes), (op_b, _, b, _) in zip(first, second, strict=False):
        if op_a != op_b:
            return ""  # the two runs took different paths: no op-by-op comparison
        pair = region(a, b, axes)
        if pair is not None and deviation(*pair, scale_of(a)) > s.rtol:
            return where
    return ""


def locate_crash(s: Subject, inputs) -> tuple[str, str]:
    """Rerun a failing forward under shapeguard: (the op and line, the broken relation)."""
    from ._errors import ShapeError

    try:
        record_values(s, inputs, mode="raise")
    except ShapeError as error:
        where = f"{error.op} at {error.location}" if error.location else error.op
        return (f"{where} ({error.module})" if error.module else where), error.relation
    except Exception:
        return "", ""
    return "", ""


def _named(axes, names) -> list[int]:
    return [d for d, n in enumerate(axes or ()) if n in names]


def _region_batch(batch: int, keep: list[int]):
    index = torch.tensor(keep)

    def region(a, b, axes):
        dims = [d for d in _named(axes, ("batch",)) if a.shape[d] == batch]
        if not dims or a.shape != b.shape:
            return None
        return take(a, dims[0], index), take(b, dims[0], index)

    return region


def _region_prefix(name: str, full: int, k: int, *, same_size: bool = False):
    """The first k along every axis called `name` (batch, or any seq axis) of size full;
    the second run has size k there (a shorter run) or full (`same_size`)."""
    names = _SEQ_NAMES if name == "seq" else (name,)

    def region(a, b, axes):
        if a.dim() != b.dim():
            return None
        dims = [d for d in _named(axes, names) if a.shape[d] == full]
        if not dims:
            return None
        for d in dims:
            a = a.narrow(d, 0, k)
            if same_size:
                b = b.narrow(d, 0, k)
        return (a, b) if a.shape == b.shape else None

    return region


def _region_padding(length: int, p: int):
    return _region_prefix("seq", length, length - p, same_size=True)


def _region_permuted(length: int, perm: torch.Tensor):
    def region(a, b, axes):
        dims = [d for d in _named(axes, _SEQ_NAMES) if a.shape[d] == length]
        if not dims or a.shape != b.shape:
            return None
        for d in dims:
            a = take(a, d, perm)
        return a, b

    return region


# -- head permutation ----------------------------------------------------------------------
@dataclass(slots=True)
class Rows:
    """A block of a parameter along one axis that holds `heads` heads of `d_k` each."""

    param: str  # parameter name in the model
    axis: int
    offset: int
    heads: int
    d_k: int
    kv: bool = False  # permuted with the kv-head permutation


@dataclass(slots=True)
class HeadGroup:
    """One attention layer's projections, as blocks of head rows (Q/K/V) and columns (out)."""

    name: str
    heads: int
    kv_heads: int
    d_k: int
    rows: list[Rows]
    has_out: bool


_QKV = (
    ("W_q", "W_k", "W_v"),
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("to_q", "to_k", "to_v"),
    ("wq", "wk", "wv"),
    ("q_lin", "k_lin", "v_lin"),
    ("q", "k", "v"),
)
_PACKED = ("c_attn", "qkv", "qkv_proj", "Wqkv", "to_qkv", "in_proj", "W_qkv")
_OUT = ("out", "o_proj", "out_proj", "c_proj", "to_out", "wo", "proj", "W_o", "out_lin", "o")


def _out_axis(module) -> int:
    """The axis of a projection's weight that holds its outputs (Conv1D stores [in, out])."""
    return 1 if type(module).__name__ == "Conv1D" else 0


def _is_projection(module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def _proj_rows(prefix: str, module, offset: int, heads: int, d_k: int, kv: bool) -> list[Rows]:
    axis = _out_axis(module)
    rows = [Rows(f"{prefix}weight", axis, offset, heads, d_k, kv)]
    if isinstance(getattr(module, "bias", None), torch.Tensor):
        rows.append(Rows(f"{prefix}bias", 0, offset, heads, d_k, kv))
    return rows


def _out_columns(prefix: str, module, heads: int, d_k: int) -> list[Rows]:
    return [Rows(f"{prefix}weight", 1 - _out_axis(module), 0, heads, d_k)]


def find_heads(model, watch: Watch | None, traced=None) -> list[HeadGroup]:
    """Attention layers whose head blocks can be permuted: from the trace (Linears whose
    outputs become Q, K, V and the one that reads the context), else by attribute names.
    `traced` is the copy the trace ran, when it is not `model` (names are the same)."""
    names = {id(m): n for n, m in (traced or model).named_modules()}
    groups: list[HeadGroup] = []
    traced = _from_trace(model, watch, names) if watch is not None else None
    if traced is not None:
        groups.append(traced)
    seen = {g.name for g in groups}
    for name, module in model.named_modules():
        if name in seen:
            continue
        group = _from_attributes(name, module)
        if group is not None:
            groups.append(group)
            seen.add(name)
    return groups


def _sizes(module) -> tuple[int, int, int] | None:
    found = _axes.declared_sizes(module)
    if "heads" not in found or "d_k" not in found:
        return None
    heads, d_k = found["heads"][1], found["d_k"][1]
    kv = found.get("kv_heads", ("", heads))[1]
    if heads < 2 or heads % kv:
        return None
    return heads, kv, d_k


def _from_trace(model, watch: Watch, names: dict) -> HeadGroup | None:
    by_role: dict[str, object] = {}
    out = None
    for module, role_in, role_out in watch.linears:
        if role_out in ("Q", "K", "V") and role_out not in by_role:
            by_role[role_out] = module
        elif role_in in ("context", "out") and out is None and len(by_role) == 3:
            out = module  # `output = attn @ v; return self.wo(output)` names it "out"
    if set(by_role) != {"Q", "K", "V"} or len({id(m) for m in by_role.values()}) != 3:
        return None
    q_name = names.get(id(by_role["Q"]), "")
    owner_name = q_name.rpartition(".")[0]
    owner = model.get_submodule(owner_name) if owner_name else model
    sizes = _sizes(owner)
    if sizes is None:
        return None
    heads, kv, d_k = sizes
    rows = []
    for role in ("Q", "K", "V"):
        module = by_role[role]
        count = heads if role == "Q" else kv
        if module.weight.shape[_out_axis(module)] != count * d_k:
            return None
        rows += _proj_rows(_prefix(names[id(module)]), module, 0, count, d_k, role != "Q")
    out_name = names.get(id(out)) if out is not None else None
    if out_name is None:
        attr = next((n for n in _OUT if _is_projection(getattr(owner, n, None))), None)
        out_name = f"{_prefix(owner_name)}{attr}" if attr else None
    if out_name is not None:
        rows += _out_columns(_prefix(out_name), model.get_submodule(out_name), heads, d_k)
    return HeadGroup(owner_name, heads, kv, d_k, rows, out_name is not None)


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def _from_attributes(name: str, module) -> HeadGroup | None:
    sizes = _sizes(module)
    if sizes is None:
        return None
    heads, kv, d_k = sizes
    base = _prefix(name)
    if isinstance(module, torch.nn.MultiheadAttention):
        if not module._qkv_same_embed_dim or module.bias_k is not None:
            return None
        e = module.embed_dim
        rows = [Rows(f"{base}in_proj_weight", 0, i * e, heads, d_k) for i in range(3)]
        if module.in_proj_bias is not None:
            rows += [Rows(f"{base}in_proj_bias", 0, i * e, heads, d_k) for i in range(3)]
        rows += _out_columns(f"{base}out_proj.", module.out_proj, heads, d_k)
        return HeadGroup(name, heads, heads, d_k, rows, True)
    rows = []
    for q, k, v in _QKV:
        parts = [getattr(module, n, None) for n in (q, k, v)]
        if all(_is_projection(p) for p in parts):
            for attr, part, count, is_kv in (
                (q, parts[0], heads, False),
                (k, parts[1], kv, True),
                (v, parts[2], kv, True),
            ):
                if part.weight.shape[_out_axis(part)] != count * d_k:
                    return None
                rows += _proj_rows(f"{base}{attr}.", part, 0, count, d_k, is_kv)
            break
    else:
        packed = next((n for n in _PACKED if _is_projection(getattr(module, n, None))), None)
        if packed is None:
            return None
        part = getattr(module, packed)
        if part.weight.shape[_out_axis(part)] != (heads + 2 * kv) * d_k:
            return None
        for offset, count, is_kv in (
            (0, heads, False),
            (heads * d_k, kv, True),
            ((heads + kv) * d_k, kv, True),
        ):
            rows += _proj_rows(f"{base}{packed}.", part, offset, count, d_k, is_kv)
    out_name = next((n for n in _OUT if _is_projection(getattr(module, n, None))), None)
    if out_name is not None:
        rows += _out_columns(f"{base}{out_name}.", getattr(module, out_name), heads, d_k)
    return HeadGroup(name, heads, kv, d_k, rows, out_name is not None)


def head_orders(heads: int, kv: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(query-head order, kv-head order): kv heads deranged, and the query heads of each
    kv group moved with their group and rotated within it, so grouped-query attention
    keeps every query head with its own kv head."""
    group = heads // kv
    kv_order = derangement(kv, generator) if kv > 1 else torch.zeros(1, dtype=torch.long)
    within = torch.roll(torch.arange(group), 1)
    q_order = torch.tensor(
        [int(kv_order[h // group]) * group + int(within[h % group]) for h in range(heads)]
    )
    return q_order, kv_order


def block_index(size: int, offset: int, order: torch.Tensor, d_k: int) -> torch.Tensor:
    """An index over `size` positions that reorders the head blocks at `offset`."""
    index = torch.arange(size)
    blocks = (order[:, None] * d_k + torch.arange(d_k)[None, :]).flatten() + offset
    index[offset : offset + blocks.numel()] = blocks
    return index


def permute_heads(model, group: HeadGroup, q_order, kv_order) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for rows in group.rows:
            param = params[rows.param]
            order = kv_order if rows.kv else q_order
            index = block_index(param.shape[rows.axis], rows.offset, order, rows.d_k)
            param.copy_(param.index_select(rows.axis, index.to(param.device)))


def head_permutation(s: Subject) -> ProbeResult:
    import copy

    name = "head-permutation invariance"
    groups = find_heads(s.model, s.watch, s.traced_model)
    if not groups:
        return skipped(name, "found no Q/K/V projections with a declared head count of 2 or more")
    try:
        model = copy.deepcopy(s.model)
    except Exception as error:
        return skipped(name, f"the module cannot be copied to permute its heads ({error})")
    expected = s.reference
    described = []
    for group in groups:
        q_order, kv_order = head_orders(group.heads, group.kv_heads, s.generator)
        permute_heads(model, group, q_order, kv_order)
        described.append(f"{group.heads} heads of {group.name or type(model).__name__}")
        if not group.has_out:
            if len(groups) > 1 or expected.shape[-1] != group.heads * group.d_k:
                return skipped(name, "the heads are not merged by an output projection")
            expected = take(expected, -1, block_index(expected.shape[-1], 0, q_order, group.d_k))
    args, kwargs = s.inputs
    out = first_output(model(*args, **kwargs))
    dev = deviation(out, expected, scale_of(s.reference))
    return s.result(
        name,
        dev,
        f"permuting the {', '.join(described)} (Q/K/V projection rows, output projection columns)",
        "the output",
        "heads are not kept apart between the split and the merge: split d_model into "
        "[heads, d_k] and move heads next to batch (view then transpose), and transpose back "
        "before merging",
        lambda: _head_ops(s.events),
        lead="",
    )


def _head_ops(events) -> str:
    """Where heads are split off the features and merged back."""
    split = merge = None
    for event in events:
        has_in = any("heads" in (r.axes or ()) for r in event.inputs)
        has_out = any("heads" in (r.axes or ()) for r in event.outputs)
        if split is None and has_out and not has_in:
            split = event
        elif split is not None and has_in and not has_out and event.op in _MERGES:
            merge = event
            break
    parts = []
    if split is not None:
        parts.append(f"heads split by {describe_event(split)}")
    if merge is not None:
        parts.append(f"merged by {describe_event(merge)}")
    return " and ".join(parts)


_MERGES = frozenset({"view", "reshape", "flatten", "contiguous", "permute", "transpose"})
