"""What a view or reshape does to the axes: data moved across axes of different origin.

A view keeps memory order, so it can only split an axis into factors or merge
neighbours whole. Read through provenance (`_names`), these are the ways it moves
data where it should not:

- it cuts across a token axis (batch or seq): heads carved out of the sequence,
  heads merged back before the transpose, batch folded into the sequence, a patch
  grid flattened without its permute, a window partition without its permute
  (`view_mixes_axes`);
- it entangles two axes whose factors do not line up (a relative-bias table
  viewed in place of a permute);
- it merges a position with a factor of the features into one axis, while other
  axes remain (`[heads, seq, d_k] -> [seq, heads * d_k]` read as `[seq, d_model]`);
- it unfolds `[batch * heads]` in the other order than it was folded, so examples
  (or, where the batch stays outermost, the other factors of each example) trade their
  data (`batch_mixing`);
- where sizes coincide and none of this shows in the shapes, the user's own names
  for the target sizes (`view(B, self.n_heads, S, d_k)`) contradict what lands there.

A finding is a claim, so each of these fires only on established evidence (design.md,
"What the view rules prove"): the kinds it relies on known from a parameter, an op's
structure or a contract (`dims.established_kind`), or the user's own declarations in the
view's sizes (a size read from a tensor's shape, a declared attribute such as
`self.n_heads`) contradicted by what the view does. The usual layout of a model's input
(a convention) names axes in messages, and is never the only reason to fire.

What a view may do without a finding: regroup positions among themselves (a relative
shift, chunks, windows with their permute), fold positions or features into the batch
(`[batch * chunks, chunk, ...]`, `[batch * channels * rows, ...]`), and flatten to rows
(`[batch * seq * heads, d_k]`, `[batch, seq * 2, C]`): positions major, a factor of the
features minor, whole features after it.
"""

from collections.abc import Iterator
from math import prod

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from .._names import dims as D
from .._names.dims import BATCH, COPY, FEATURE, TOKEN
from .._names.flow import regroup_view
from .._names.intent import view_intents
from . import WARNING, is_tensor, rule
from . import tp as _tp_checks
from ._view import CallView
from ._view_shape import target_shape, view_compatible

_SEQ_AXES = ("seq", "seq_q", "seq_k")
_EINOPS = ("rearrange", "repeat", "reduce", "pack", "unpack")
_TOKENS = (BATCH, TOKEN)


@rule(
    _ops.by_name("view"),
    _ops.by_name("reshape"),
    kinds={"view_mixes_axes": WARNING, "batch_mixing": WARNING},
    order=1,
)
def regroup(call: CallView) -> Iterator[Violation]:
    args = call.args
    if not args or not is_tensor(args[0]):
        return
    x = args[0]
    target = target_shape(args, call.kwargs)
    if target is None:
        return
    shape = tuple(int(s) for s in x.shape)
    resolved = _axes.resolve_view_shape(prod(shape), target)
    if resolved is None:
        return  # view_numel
    if (
        call.op == "view"
        and not x.is_contiguous()
        and not view_compatible(shape, tuple(x.stride()), resolved)
    ):
        return  # noncontiguous_view
    groups = _axes.view_groups(shape, resolved)
    if groups is None:
        return
    view = _View(call, x, target, shape, resolved, groups)
    for finding in (
        view.batch_unfold,
        view.straddle,
        view.entangled,
        view.merged_kinds,
        view.named_otherwise,
    ):
        violation = finding()
        if violation is not None:
            yield violation
            return


def noncontiguous_hint(call: CallView, x, sizes, shape, resolved, label: str) -> str:
    """The hint for a `view` torch refuses for its strides: `.reshape` only where the view
    moves no data across axes (a merge or split of whole neighbours); where it would, the
    reshape runs and computes the wrong thing, so the hint is the view the code meant."""
    groups = _axes.view_groups(shape, resolved)
    generic = f"use {label}.contiguous().view(...) or {label}.reshape(...)"
    if groups is None:
        return generic
    view = _View(call, x, sizes, shape, resolved, groups)
    moved = view.moves_data()
    if moved is None:
        return generic
    real_i, real_j, t = moved
    if t is not None and view.carves(real_i, real_j, t):
        return _carve_hint(label, shape, real_i, call.declared(), sizes, view.count(real_j))
    return f"{label}.reshape(...) would run and move data across axes: " + view.reorder_hint(
        real_i, real_j
    )


class _View:
    """One view under examination: its groups, and the axes provenance gives its target."""

    def __init__(self, call, x, sizes, shape, resolved, groups) -> None:
        self.call, self.x, self.sizes = call, x, sizes
        self.shape, self.resolved, self.groups = shape, resolved, groups
        self.meta = call.meta_of(x)
        self.axes = call.axes(x)
        self._target: tuple[list[D.Axis], list[bool]] | None = None
        self._label: str | None = None
        self._intents: list | None = None
        self._broken: set[int] | None = None
        self._misplaced: set = set()  # the dims of the reads `broken` found elsewhere

    # The view as the user wrote it, read from the source only for a finding.
    @property
    def expr(self) -> str:
        spelled = self.call.label(0, "input")
        return f"{spelled}.{self.call.op}({', '.join(str(s) for s in self.sizes)})"

    @property
    def label(self) -> str:
        """Hints start from the tensor itself: `y.contiguous().view(...)` is fixed on `y`."""
        if self._label is None:
            self._label = self.call.label(0, "input").removesuffix(".contiguous()")
        return self._label

    @property
    def target(self):
        if self._target is None:
            self._target = regroup_view(self.meta, self.shape, self.resolved)
        return self._target

    @property
    def intents(self) -> list:
        if self._intents is None:
            self._intents = view_intents(self.call, len(self.resolved))
        return self._intents

    def kind(self, i: int) -> str | None:
        return D.kind_of(self.meta.dims[i])

    def _atoms(self, real_i) -> list:
        return [a for i in real_i for a in D.normalize(self.meta.dims[i])]

    def _real(self, gi, gj):
        return (
            [i for i in gi if self.shape[i] != 1],
            [j for j in gj if self.resolved[j] != 1],
        )

    def _regroup_text(self, real_i, real_j) -> str:
        names = [self.axes[i] or f"dim {i}" for i in real_i]
        src = ", ".join(f"{n}={self.shape[i]}" for n, i in zip(names, real_i, strict=True))
        dst = ", ".join(str(self.resolved[j]) for j in real_j)
        return f"regroups [{src}] as [{dst}]"

    def _operands(self):
        return (self.call.operand(self.label, self.x),)

    def count(self, real_j) -> int | None:
        return self.resolved[real_j[-2]] if len(real_j) >= 3 else None

    # -- evidence ---------------------------------------------------------------------------
    @property
    def broken(self) -> set[int]:
        """Target axes whose size the user declared, and which the view does not give what
        the declaration says: a size read from an axis this tensor holds (`S` of
        `B, S, _ = x.shape`) on an axis that does not hold it, or a declared size
        (`self.n_heads`) cut across other axes or missing the factor of the features it
        names. Declarations are evidence; a contradiction is the user's own."""
        if self._broken is None:
            self._broken = self._declarations_broken()
        return self._broken

    def _declarations_broken(self) -> set[int]:
        intents = self.intents
        if not intents:
            return set()
        axes, entangled = self.target
        source = {a[0].find() for axis in self.meta.dims for a in axis}
        broken = set()
        for j, intent in enumerate(intents):
            if intent is None or self.resolved[j] == 1:
                continue
            if intent.axis is not None:
                if not {a[0].find() for a in intent.axis} <= source:
                    continue  # a read of an axis this tensor does not hold says nothing here
                if self._size_reused(j, intent):
                    continue
                if entangled[j] or not _holds(axes[j], intent.axis, whole=not intent.part):
                    broken.add(j)
                    self._misplaced |= {a[0].find() for a in intent.axis}
            elif intent.kind == FEATURE and (
                entangled[j] or _features_cut(axes[j]) or self._heads_elsewhere(j, intent.name)
            ):
                broken.add(j)
            elif intent.name == "d_k" and not entangled[j]:
                # The heads of a split whose d_k is declared: the outer factor of the same
                # features, cut across with another axis (`h` unreadable, `hd` declared).
                broken |= {m for m in self._outer_of(j) if _features_cut(axes[m])}
        return broken

    def _outer_of(self, k: int) -> list[int]:
        """The target axes holding the factor just outside the feature factor on axis k
        (the heads of a [heads, d_k] split whose d_k lands on k)."""
        axes, _ = self.target
        axis = axes[k]
        if len(axis) != 1 or D.established_kind(axis[0]) != FEATURE:
            return []
        dim, stride, size = axis[0]
        root = dim.find()
        return [
            m
            for m, other in enumerate(axes)
            if m != k and any(a[0].find() is root and a[1] == stride * size for a in other)
        ]

    def _size_reused(self, j: int, intent) -> bool:
        """The same read names another target axis, which holds the axis read: the user
        spends one length on two axes by design (`view(-1, tgt_len, tgt_len)` for queries
        and keys of self-attention), and only one of them can be that axis."""
        axes, entangled = self.target
        return any(
            k != j
            and other is not None
            and other.text == intent.text
            and not entangled[k]
            and _holds(axes[k], intent.axis, whole=not intent.part)
            for k, other in enumerate(self.intents)
        )

    def _heads_elsewhere(self, j: int, name: str | None) -> bool:
        """Target axis j is declared the heads (`self.n_heads`) but holds no established
        feature, while the heads land on another axis: the outer factor of a feature axis
        the view splits into [heads, d_k] with d_k where the user declared it, or an axis
        that attention established as the heads."""
        if name not in ("heads", "kv_heads"):
            return False
        axes, entangled = self.target
        if any(D.established_kind(a) == FEATURE for a in axes[j]):
            return False
        intents = self.intents
        for k, axis in enumerate(axes):
            if k == j or entangled[k]:
                continue
            said = intents[k].name if intents[k] is not None else None
            if said not in ("heads", "kv_heads") and any(
                D.atom_name(a) in ("heads", "kv_heads") and D.established_kind(a) == FEATURE
                for a in axis
            ):
                return True
            if said != "d_k":
                continue
            outer = self._outer_of(k)
            if outer and j not in outer:
                return True
        return False

    def _evident(self, real_i, real_j, atoms_known: bool) -> bool:
        """A finding on this group stands on established kinds, or on a declaration the
        view breaks in it (on one of its target axes, or by moving here an axis the user
        declared on another)."""
        if atoms_known or any(j in self.broken for j in real_j):
            return True
        return any(a[0].find() in self._misplaced for a in self._atoms(real_i))

    # -- batch * heads unfolded in the wrong order ------------------------------------
    def batch_unfold(self) -> Violation | None:
        """A split of one axis that holds the batch with other factors (`[batch * heads]`)
        whose cuts do not fall between those factors."""
        axes, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) != 1 or len(real_j) < 2:
                continue
            source = self.meta.dims[real_i[0]]
            if len(source) < 2 or BATCH not in D.kinds_in(source):
                continue
            originals = set(D.normalize(source))
            cut = any(entangled[j] for j in real_j) or any(
                atom not in originals for j in real_j for atom in axes[j]
            )
            known = any(D.established_kind(a) is not None for a in source)
            if cut and self._evident(real_i, real_j, known):
                return self._unfold_violation(real_i[0], real_j)
        return None

    def _unfold_violation(self, i: int, real_j, reason: str = "") -> Violation:
        source = D.normalize(self.meta.dims[i])
        folded = " * ".join(D.describe_atom(a) for a in source)
        sizes = [a[2] for a in source]
        cut_sizes = [self.resolved[j] for j in real_j]
        why = reason or (
            f"it cuts the {self.x.shape[i]} entries into "
            f"{' x '.join(map(str, cut_sizes))}, not into the "
            f"{' x '.join(map(str, sizes))} they were folded from"
        )
        site = self.call.site
        if site is not None and site.callee in _EINOPS:
            letters = " ".join((D.atom_name(a) or "x")[0] for a in source)
            hint = (
                f"the pattern must unfold the group in the order it was folded, "
                f"[{folded}]: write ({letters}) on the left of the arrow, as in the fold"
            )
        else:
            order = ", ".join(D.describe_atom(a) for a in source)
            hint = (
                f"unfold in the order of the fold, [{folded}]: {self._unfold_call(sizes, real_j)}; "
                f"its axes are then [{order}, ...] already, so no transpose swaps them back"
            )
        return Violation(
            "batch_mixing",
            f"{self.expr}: unfolds [{folded}] ({self.x.shape[i]}) in another order than it was "
            f"folded: {why}, {_who_trades(source, sizes, cut_sizes, reason)}",
            self._operands(),
            hint,
            severity="warning",
        )

    def _unfold_call(self, sizes: list[int], real_j: list[int]) -> str:
        """The user's own view with its sizes for the folded factors put in the fold's
        order (`view(h, B, S, d_k)` becomes `view(B, h, S, d_k)`), when that can be read."""
        spelled = f"{self.label}.view({', '.join(map(str, sizes))}, ...)"
        site = self.call.site
        if site is None or not self.call.site_matches() or len(site.args) != len(self.resolved):
            return spelled
        first = real_j[: len(sizes)]
        if sorted(self.resolved[j] for j in first) != sorted(sizes):
            return spelled
        texts = list(site.args)
        intents = self.intents
        by_size: dict[int, list[tuple[bool, str]]] = {}
        for j in first:
            intent = intents[j] if intents else None
            heads = intent is not None and intent.name == "heads"
            by_size.setdefault(self.resolved[j], []).append((heads, texts[j]))
        # Equal sizes go where the user's names say: the one that names the heads last.
        for group in by_size.values():
            group.sort(key=lambda entry: entry[0])
        for j, size in zip(first, sizes, strict=True):
            texts[j] = by_size[size].pop(0)[1]
        return f"{self.label}.{self.call.op}({', '.join(texts)})"

    # -- a token axis cut across --------------------------------------------------------
    def straddle(self) -> Violation | None:
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) < 2 or len(real_j) < 2:
                continue
            if self._positions_only(real_i):
                continue  # a relative shift, windows, chunks: positions among themselves
            for t in real_i:
                if self.kind(t) not in _TOKENS or not _straddles(
                    self.shape, real_i, t, self.resolved, real_j
                ):
                    continue
                if self._chunked(t, real_j):
                    continue
                if self._evident(real_i, real_j, self._straddle_known(real_i, t)):
                    return self._mixing(real_i, real_j, t)
        return None

    def _straddle_known(self, real_i, t: int) -> bool:
        """The cut axis is established as positions or examples, and what it is mixed with
        is established too."""
        if not all(D.established_kind(a) in _TOKENS for a in self.meta.dims[t]):
            return False
        own = {a[0].find() for a in self.meta.dims[t]}
        return any(
            D.established_kind(a) is not None
            for i in real_i
            if i != t
            for a in self.meta.dims[i]
            if a[0].find() not in own
        )

    def _positions_only(self, real_i) -> bool:
        """Every factor of the group is a position: a view that moves data between
        positions only, as a relative shift, a window partition or chunks of a sequence
        do, never between positions and features or examples."""
        return all(D.kind_of((a,)) == TOKEN for a in self._atoms(real_i))

    def _chunked(self, t: int, real_j) -> bool:
        """Axis `t` is cut into factors, each of which lands alone on an axis of its own
        or in a fold into the batch (an axis whose outermost factor is not a position or a
        feature): chunks or windows of a sequence folded into the batch
        (`[batch * chunks, chunk, ...]`), an image's rows folded with its channels
        (MobileViT's unfold)."""
        axes, entangled = self.target
        if any(entangled[j] for j in real_j):
            return False
        own = {a[0].find() for a in self.meta.dims[t]}
        for j in real_j:
            mine = [a for a in axes[j] if a[0].find() in own]
            if not mine or len(mine) == len(axes[j]):
                continue
            if D.kind_of(axes[j][:1]) in (TOKEN, FEATURE):
                return False
        return True

    def moves_data(self) -> tuple[list[int], list[int], int | None] | None:
        """The first group in which the view moves data across axes (a token axis cut
        across, or an entanglement), whatever the evidence: (its source and target axes,
        the token axis cut or None). For a hint, never for a finding."""
        _, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) < 2:
                continue
            for t in real_i:
                if (
                    self.kind(t) in _TOKENS
                    and len(real_j) >= 2
                    and _straddles(self.shape, real_i, t, self.resolved, real_j)
                ):
                    return real_i, real_j, t
            if any(entangled[j] for j in real_j):
                return real_i, real_j, None
        return None

    def carves(self, real_i, real_j, t: int) -> bool:
        """Heads carved out of a sequence: the cut token axis leads the group, and the
        group's target leads with the head count (or the module declares none)."""
        name = self.axes[t] or ""
        if name not in _SEQ_AXES and self.kind(t) != TOKEN:
            return False
        return _carves_heads(real_i, t, self.resolved, real_j, self.call.declared())

    def _mixing(self, real_i, real_j, t) -> Violation:
        call, label, expr, shape, axes = self.call, self.label, self.expr, self.shape, self.axes
        names = [axes[i] or f"dim {i}" for i in real_i]
        token = axes[t] or ("batch" if self.kind(t) == BATCH else f"dim {t}")
        declared = call.declared()
        regroup = self._regroup_text(real_i, real_j)
        count = self.count(real_j)
        seq_like = token in _SEQ_AXES or self.kind(t) == TOKEN
        tp_note = (
            _tp_checks.carve_note(call, self.x, label, count)
            if token in _SEQ_AXES and real_i.index(t) == 0
            else None
        )
        lead = real_i.index(t)
        if tp_note is not None:
            relation = f"{expr}: carves heads out of the {token} axis: {regroup}"
            hint = tp_note
        elif self._window_partition(real_i, real_j, t):
            relation = (
                f"{expr}: {regroup}, moving data across the {token} axis: each window takes "
                f"rows of pixels, not a square of them"
            )
            hint = self._window_hint()
        elif (
            seq_like
            and 0 < lead < len(real_i) - 1
            and self.kind(real_i[0]) != BATCH
            and not self.image(real_i)
        ):
            # A merge that brings the axes in front of the token axis into it: the heads
            # (named or not) merged back before the transpose that puts them next to d_k.
            before = " and ".join(names[:lead])
            relation = (
                f"{expr}: merges {before} back before moving them next to "
                f"{names[-1]}: {regroup}, so each output token holds pieces of other tokens"
            )
            if (real_i[0], t, len(shape)) == (1, 2, 4):
                hint = (
                    f"transpose first: {label}.transpose(1, 2).contiguous()"
                    f".view(batch, seq, heads * d_k){_sizes_merge(shape)}"
                )
            else:
                hint = (
                    f"transpose first: {label}.transpose({real_i[0]}, {t}) puts the {token} "
                    "axis in front, then merge with a view"
                )
        elif seq_like and _carves_heads(real_i, t, self.resolved, real_j, declared):
            relation = f"{expr}: carves heads out of the {token} axis: {regroup}"
            hint = _carve_hint(label, shape, real_i, declared, self.sizes, count)
        elif self.kind(t) == BATCH and any(n in _SEQ_AXES for n in names):
            other = next(n for n in names if n in _SEQ_AXES)
            relation = (
                f"{expr}: folds batch into {other}: {regroup}, moving data across the batch axis"
            )
            hint = (
                f"reshape reinterprets memory and does not swap axes; to exchange batch and "
                f"{other} use {label}.transpose({real_i[0]}, {real_i[1]})"
            )
        elif self.image(real_i):
            relation = f"{expr}: {regroup}, moving data across the {token} axis"
            hint = self.patch_hint(real_i)
        else:
            relation = f"{expr}: {regroup}, moving data across the {token} axis"
            hint = self.reorder_hint(real_i, real_j)
        return Violation("view_mixes_axes", relation, self._operands(), hint, severity="warning")

    def _window_partition(self, real_i, real_j, t) -> bool:
        """The view folds part of a position axis into the batch while the rest of it
        merges with another position axis: windows cut without the permute that brings
        their grid next to the batch ([B, nH, wH, nW, wW, C].view(-1, wH, wW, C))."""
        axes, entangled = self.target
        if any(entangled[j] for j in real_j) or self.kind(real_i[0]) == TOKEN:
            return False
        own = {a[0].find() for a in self.meta.dims[t]}
        for j in real_j:
            mine = [a for a in axes[j] if a[0].find() in own]
            others = [a for a in axes[j] if a[0].find() not in own]
            if mine and others and D.kind_of(axes[j][:1]) == TOKEN:
                return all(D.kind_of((a,)) == TOKEN for a in others)
        return False

    def _window_hint(self) -> str:
        return (
            "a view keeps memory order, so windows of [B, H, W, C] need the window grid moved "
            f"next to the batch first: {self.label}.view(B, H // w, w, W // w, w, C)"
            ".permute(0, 1, 3, 2, 4, 5).reshape(-1, w, w, C)"
        )

    # -- factors that do not line up -----------------------------------------------------
    def entangled(self) -> Violation | None:
        """A group whose cuts fall inside axes they do not divide: no target axis is a
        factor of a source one. Positions entangled among themselves are a regrouping of
        positions (a relative shift); a feature axis or the batch entangled with another
        axis is the finding."""
        _, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) < 2 or not any(entangled[j] for j in real_j):
                continue
            if not any(self.kind(i) for i in real_i) or self._positions_only(real_i):
                continue
            known = any(D.established_kind(a) in (FEATURE, BATCH) for a in self._atoms(real_i))
            if not self._evident(real_i, real_j, known):
                continue
            names = [self.axes[i] or f"dim {i}" for i in real_i]
            relation = (
                f"{self.expr}: {self._regroup_text(real_i, real_j)}: the new axes cut across "
                f"{' and '.join(names)}, so each of them holds pieces of several"
            )
            return Violation(
                "view_mixes_axes", relation, self._operands(), self.reorder_hint(real_i, real_j),
                severity="warning",
            )  # fmt: skip
        return None

    # -- positions merged with features ----------------------------------------------------
    def merged_kinds(self) -> Violation | None:
        """A target axis that joins positions (seq) with features, while the view keeps
        other axes: the tokens of the result hold pieces of other tokens. A merge the user
        prepared with a transpose or permute is deliberate, a flattened example
        ([batch, seq * d_model]) has no other axis to be wrong about, a fold into the batch
        makes items, and a flatten to rows keeps each position whole (`_rows`)."""
        if self.meta.laid_out:
            return None
        axes, entangled = self.target
        others = [
            j for j in range(len(axes)) if axes[j] and D.kind_of(axes[j]) not in (BATCH, COPY)
        ]
        if len(others) < 2:
            return None
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) < 2:
                continue
            for j in real_j:
                if entangled[j]:
                    continue
                kinds = D.kinds_in(axes[j])
                if TOKEN not in kinds or FEATURE not in kinds or self._deliberate_fold(j, axes[j]):
                    continue
                if D.kind_of(axes[j][:1]) not in (TOKEN, FEATURE) or self._rows(j):
                    continue  # a fold into the batch, or a flatten to rows
                known = {D.established_kind(a) for a in axes[j]} >= {TOKEN, FEATURE}
                if self._evident(real_i, real_j, known):
                    return self._merge_violation(real_i, real_j)
        return None

    def _rows(self, j: int) -> bool:
        """Target axis j flattens to rows: in the target's order, every factor before its
        first feature factor is a position or an example, no position comes after it, and
        every axis after j holds features only. Each index of the leading axes then
        addresses the features of one position (a head of a token, half of a token's
        channels), positions in their order: nothing moves between positions. Heads in
        front of the positions ([heads, seq, d_k] -> [seq', heads * d_k]) are not rows."""
        axes, _ = self.target
        flat = [
            (k, D.kind_of((a,)))
            for k in range(len(axes))
            for a in axes[k]
            if D.kind_of((a,)) != COPY
        ]
        first = next((n for n, (k, kind) in enumerate(flat) if kind == FEATURE), None)
        if first is None or flat[first][0] != j:
            return False
        return not any(kind in _TOKENS for _, kind in flat[first:])

    def _deliberate_fold(self, j: int, axis) -> bool:
        """The user built target size j from the size of the axis we only take for
        positions by the input's usual layout: `view(T, bsz * h, d)` after
        `T, bsz, C = x.size()` folds what seq-first code knows is its batch with the heads.
        Structure (attention, a conv, positions) outranks the user's arithmetic; the
        convention does not."""
        tokens = [a[0].find() for a in axis if a[0].find().kind == TOKEN]
        if not tokens or any(root.kind_rank > D.CONVENTION for root in tokens):
            return False
        intents = self.intents
        intent = intents[j] if j < len(intents) else None
        if intent is None or intent.axis is None:
            return False
        read = {id(root) for root in D.roots_of(intent.axis)}
        return all(id(root) in read for root in tokens)

    def _merge_violation(self, real_i, real_j) -> Violation:
        # The heads that belong with the merged d_k may sit on an axis of their own just
        # outside the group (seq == heads: [heads, seq, d_k] -> [heads, seq * d_k]).
        real_i, real_j = self._with_heads(real_i, real_j)
        names = [self.axes[i] or f"dim {i}" for i in real_i]
        regroup = self._regroup_text(real_i, real_j)
        if "heads" in names and any(n in _SEQ_AXES for n in names):
            relation = (
                f"{self.expr}: merges heads back before moving them next to d_k: {regroup}, "
                "so each output token holds pieces of other tokens"
            )
            hint = (
                f"transpose first: {self.label}.transpose(1, 2).contiguous().view(batch, seq, "
                f"heads * d_k){_sizes_merge(self.shape)}"
            )
        else:
            relation = (
                f"{self.expr}: {regroup}: one new axis joins positions with features, so the "
                "positions of the result hold pieces of other positions"
            )
            hint = self.reorder_hint(real_i, real_j)
        return Violation("view_mixes_axes", relation, self._operands(), hint, severity="warning")

    def _with_heads(self, real_i: list[int], real_j: list[int]) -> tuple[list[int], list[int]]:
        """The group, and before it the source axis of the heads that belong with a merged
        d_k, with where it lands, when it is not in the group (an attention output's heads
        are the queries', its d_k the values': one head split, by what attention did)."""
        if not any(self.axes[i] == "d_k" for i in real_i):
            return real_i, real_j
        for h in range(real_i[0] - 1, -1, -1):
            if self.axes[h] in ("heads", "kv_heads") and D.is_factor(self.meta.dims[h]):
                for gi, gj in self.groups:
                    if h in gi:
                        landed = [j for j in gj if self.resolved[j] != 1]
                        return [h, *real_i], [*landed, *real_j]
        return real_i, real_j

    # -- the user's own names say otherwise ----------------------------------------------------
    def named_otherwise(self) -> Violation | None:
        """Sizes coincide, the view is legal, and the user's names for its target sizes
        contradict what lands on them: a declaration the view breaks (`broken`), or a kind
        the user's names give that an established kind contradicts."""
        intents = self.intents
        if not intents:
            return None
        axes, entangled = self.target
        for j, intent in enumerate(intents):
            if intent is None or entangled[j] or not axes[j]:
                continue
            held = axes[j]
            held_kind = D.kind_of(held)
            if intent.axis is not None and _holds(held, intent.axis, whole=not intent.part):
                continue
            if intent.kind is None or held_kind == COPY or held_kind == intent.kind:
                continue
            if held_kind in (None, "mixed"):
                # What lands there is of no one kind: only the user's own read, which the
                # view puts elsewhere, says it is wrong.
                if j in self.broken and intent.axis is not None:
                    return self._intent_violation(j, intent, held, None)
                continue
            if j not in self.broken and not self._kinds_contradict(intent, held):
                continue
            return self._intent_violation(j, intent, held, held_kind)
        return None

    @staticmethod
    def _kinds_contradict(intent, held) -> bool:
        """The kind the user's name gives against the kind of what lands there, with at
        least one of the two established (a declared attribute, or a kind a parameter or
        structure gives): the input's usual layout alone never decides."""
        said = intent.axis is None or _established_of(intent.axis) is not None
        return said or _established_of(held) is not None

    def _intent_violation(self, j: int, intent, held, held_kind) -> Violation:
        held_name = D.axis_name(held) or " * ".join(D.describe_atom(a) for a in held)
        size = self.resolved[j]
        said = f"{intent.text} ({intent.name})" if intent.name else intent.text
        if intent.kind == FEATURE and held_kind == BATCH:
            i = next(
                (i for i, axis in enumerate(self.meta.dims) if set(held) <= set(D.normalize(axis))),
                None,
            )
            if i is not None and len(self.meta.dims[i]) >= 2:
                return self._unfold_violation(
                    i,
                    [k for k in range(len(self.resolved)) if self.resolved[k] != 1],
                    f"axis {j} is {said} but receives the batch (the sizes coincide, {size})",
                )
        what = f"{held_name} ({held_kind} axis)" if held_kind else held_name
        relation = (
            f"{self.expr}: axis {j} is {said} but receives {what}: "
            f"a view keeps memory order, and only the coinciding sizes ({size}) let it run"
        )
        real_i = [i for i in range(len(self.shape)) if self.shape[i] != 1]
        moved = self._moved_in_front(intent, held)
        if moved is not None:
            hint = moved
        elif intent.name in ("heads", "kv_heads") and held_kind == TOKEN:
            hint = _tp_checks.carve_note(self.call, self.x, self.label, size) or _carve_hint(
                self.label, self.shape, real_i[-1:], self.call.declared(), self.sizes, size
            )
        else:
            real_j = [k for k in range(len(self.resolved)) if self.resolved[k] != 1]
            hint = self.reorder_hint(real_i, real_j, intents=True)
        return Violation("view_mixes_axes", relation, self._operands(), hint, severity="warning")

    def _moved_in_front(self, intent, held) -> str | None:
        """The merge hint, where the view merges axes and what lands on the axis the user
        read from a tensor is the source axis just in front of it: the axes were merged
        before the transpose that brings them together ([B, h, S, d] viewed [B, S, h * d])."""
        if intent.axis is None or len(self.resolved) >= len(self.shape):
            return None
        read = {a[0].find() for a in intent.axis}
        got = {a[0].find() for a in held}
        where = [i for i, axis in enumerate(self.meta.dims) if {a[0].find() for a in axis} & read]
        came = [i for i, axis in enumerate(self.meta.dims) if {a[0].find() for a in axis} & got]
        if len(where) != 1 or len(came) != 1 or came[0] != where[0] - 1:
            return None
        front, back = came[0], where[0]
        if (front, back, len(self.shape)) == (1, 2, 4):
            return (
                f"transpose first: {self.label}.transpose(1, 2).contiguous().view(batch, seq, "
                f"heads * d_k){_sizes_merge(self.shape)}"
            )
        return f"transpose first: {self.label}.transpose({front}, {back}), then merge with a view"

    # -- hints -----------------------------------------------------------------------------
    def image(self, real_i) -> bool:
        """The regrouped axes are an image's (channels, height, width, or parts of them)."""
        names = {D.dim_name(a[0].find()) for i in real_i for a in self.meta.dims[i]}
        return bool(names & {"height", "width"}) or self.meta.op == "unfold"

    def _conv_output(self, real_i) -> bool:
        """The regrouped channels are a convolution's output features (the patches of a
        strided conv): the image is patchified already, only its grid is to flatten."""
        for i in real_i:
            for a in self.meta.dims[i]:
                root = a[0].find()
                named = D.dim_name(root) in ("channels", "d_model")
                if named and root.kind == FEATURE and root.kind_rank >= D.PARAM:
                    made = _ops.lookup(self.meta.op or "")
                    return made.family == _ops.CONV and made.name != "unfold"
        return False

    def patch_hint(self, real_i=()) -> str:
        if self.meta.op == "unfold":
            return (
                "F.unfold gives [batch, C * p * p, patches], the patches last: "
                f"{self.label}.transpose(1, 2) makes [batch, patches, C * p * p]"
            )
        if real_i and self._conv_output(real_i):
            return (
                "a conv gives [batch, channels, height, width], the channels first: "
                f"{self.label}.flatten(2).transpose(1, 2) makes [batch, height * width, channels]"
            )
        return (
            "a reshape keeps the image's memory order [channels, height, width], so each patch "
            "would take rows of pixels, not squares: cut height and width into patches, move "
            f"the patch grid first and permute, e.g. {self.label}.unflatten(3, (W // p, p))"
            ".unflatten(2, (H // p, p)).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p), "
            "or use nn.Conv2d(C, d_model, kernel_size=p, stride=p)"
        )

    def reorder_hint(self, real_i, real_j, intents: bool = False) -> str:
        """View in the order the data is stored, then permute: computed when the target
        sizes are a reordering of the source's factors."""
        if self.image(real_i):
            return self.patch_hint(real_i)
        atoms = self._atoms(real_i)
        sizes = [a[2] for a in atoms]
        wanted = [self.resolved[j] for j in real_j]
        named = self.intents if intents else []
        wants = [named[j].kind if named and named[j] is not None else None for j in real_j]
        order = _reordering(sizes, wanted, [D.kind_of((a,)) for a in atoms], wants)
        generic = (
            "a view keeps memory order and cannot move an axis: view the tensor in the order "
            "its axes are stored, then move them with permute (or transpose)"
        )
        if order is None or order == list(range(len(order))):
            return generic
        lead = [str(self.resolved[j]) for j in range(real_j[0])] if real_j else []
        stored = ", ".join([*lead, *(str(s) for s in sizes)])
        perm = ", ".join(str(p) for p in [*range(len(lead)), *(len(lead) + k for k in order)])
        return f"{generic}: {self.label}.view({stored}).permute({perm})"


def _holds(held, axis, whole: bool) -> bool:
    """Whether a target axis holds the axis the user read its size from (all of it and
    nothing else, or, for a factor of a product, all of it); a broadcast copy counted from
    that axis stands for it (`dims.stands_for`)."""
    want = set(D.normalize(axis))
    have = {D.stands_for(atom) for atom in D.normalize(held)}
    return want == have if whole else want <= have


def _features_cut(held) -> bool:
    """A target axis declared a factor of the features (`self.n_heads`) holds a factor of
    an established feature axis together with a piece of another axis (part of the
    sequence the -1 absorbed): the declared size is cut across two axes. Heads folded with
    a whole axis (`bsz * self.num_heads`) are a fold, not a cut."""
    features = {a[0].find() for a in held if D.established_kind(a) == FEATURE}
    return bool(features) and any(
        a[0].find() not in features and a[0].find().kind != COPY and not D.is_whole(a) for a in held
    )


def _established_of(axis) -> str | None:
    """The one kind that factors of the axis have established (those of unknown kind, and
    copies, aside); None where none has, or where two kinds are."""
    kinds = {D.established_kind(a) for a in axis if a[0].find().kind != COPY} - {None}
    return kinds.pop() if len(kinds) == 1 else None


def _who_trades(source, sizes: list[int], cut_sizes: list[int], reason: str) -> str:
    """Whose data the wrong unfold mixes: examples, or, where the fold's outer factors
    (the batch) are cut where they were folded, the other factors within each example."""
    if reason:
        return "so examples trade their data"
    kept = 0
    while kept < min(len(sizes), len(cut_sizes)) and sizes[kept] == cut_sizes[kept]:
        kept += 1
    outer = source[:kept]
    if not kept or not any(a[0].find().kind == BATCH for a in outer):
        return "so examples trade their data"
    inner = " * ".join(D.describe_atom(a) for a in source[kept:])
    keeps = " * ".join(D.describe_atom(a) for a in outer)
    return (
        f"so within each example the [{inner}] entries trade places ([{keeps}] is the "
        "outermost factor in both orders: no example takes another's data)"
    )


def _reordering(sizes, wanted, kinds, wants) -> list[int] | None:
    """The permutation of the stored factors (`sizes`, of `kinds`) that gives the `wanted`
    target sizes: a factor goes only where its size fits and its kind does not contradict
    what the user's names want there (a position named after a sequence takes no feature);
    among fitting factors the stored order is kept. None when no such permutation exists."""
    if len(sizes) != len(wanted) or sorted(sizes) != sorted(wanted):
        return None

    def fits(k: int, j: int) -> bool:
        want, have = wants[j], kinds[k]
        return sizes[k] == wanted[j] and (want is None or have is None or want == have)

    def search(j: int, free: list[int]) -> list[int] | None:
        if j == len(wanted):
            return []
        for k in free:
            if fits(k, j):
                rest = search(j + 1, [f for f in free if f != k])
                if rest is not None:
                    return [k, *rest]
        return None

    return search(0, list(range(len(sizes))))


def _straddles(shape, real_i: list[int], t: int, target, real_j: list[int]) -> bool:
    """Whether some target axis covers part of source axis `t` and part of another.

    In the flat memory of one view group, axis `t` spans the strides [inner, outer);
    a target axis is fine when it lies inside that span, outside it, or contains it
    whole, with the boundaries dividing evenly."""
    inner = prod(shape[i] for i in real_i if i > t)
    outer = inner * shape[t]
    for j in real_j:
        lo = prod(target[k] for k in real_j if k > j)
        hi = lo * target[j]
        inside = lo >= inner and hi <= outer and lo % inner == 0 and outer % hi == 0
        outside = (hi <= inner and inner % hi == 0) or (lo >= outer and lo % outer == 0)
        contains = lo <= inner and hi >= outer and inner % lo == 0 and hi % outer == 0
        if not (inside or outside or contains):
            return True
    return False


def _carves_heads(real_i, t, resolved, real_j, declared) -> bool:
    """The token axis comes first and the target group leads with a head count."""
    heads = declared.get("heads") or declared.get("kv_heads")
    if real_i.index(t) != 0 or len(real_j) < 3:
        return False
    return heads is None or resolved[real_j[0]] in (
        declared.get("heads", ("", 0))[1],
        declared.get("kv_heads", ("", 0))[1],
    )


def _sizes_merge(shape) -> str:
    if len(shape) != 4:
        return ""
    b, h, s, d = shape
    return f", i.e. .transpose(1, 2).reshape({b}, {s}, {h * d})"


def _carve_hint(call_label: str, shape, real_i: list[int], declared, sizes=(), count=None) -> str:
    label = call_label
    heads = declared.get("heads")
    kv_heads = declared.get("kv_heads")
    if kv_heads is not None and count == kv_heads[1] and (heads is None or heads[1] != count):
        heads = kv_heads  # the keys' or values' split: n_kv_heads * head_dim is the width
    d_k = declared.get("d_k")
    features = shape[real_i[-1]]
    if -1 in sizes and heads is not None and d_k is not None and features != heads[1] * d_k[1]:
        # `W_k(x)` was made by the layer W_k: name the layer to fix.
        made = label.endswith(")") and "(" in label
        maker = label.split("(", 1)[0] if made else f"what made {label}"
        return (
            f"{label} has {features} features but {heads[0]} * {d_k[0]} = {heads[1] * d_k[1]}: "
            f"the -1 absorbed the difference into the sequence axis; check {maker}"
        )
    spelled = ""
    if heads is not None and d_k is not None and len(shape) == 3:
        spelled = f", i.e. view({shape[0]}, {shape[1]}, {heads[1]}, {d_k[1]}).transpose(1, 2)"
    return (
        f"split heads out of the feature axis, then move them: "
        f"use {label}.view(batch, seq, heads, d_k).transpose(1, 2){spelled}"
    )
