"""`regroup`'s finding of a token axis (batch or seq) cut across: heads carved out of
the sequence, heads merged back before the transpose, batch folded into the sequence,
a patch grid or window partition flattened without its permute."""

from math import prod

from .._errors import Violation
from .._names import dims as D
from .._names.dims import BATCH, FEATURE, TOKEN
from ._accounts import carve_account
from ._regroup_view import SEQ_AXES, TOKENS, ViewUnderExamination, carve_hint, sizes_merge


class TokenCuts(ViewUnderExamination):
    """A view that cuts across a token axis."""

    def straddle(self) -> Violation | None:
        for gi, gj in self.groups:
            real_i, real_j = self.real_axes(gi, gj)
            if len(real_i) < 2 or len(real_j) < 2:
                continue
            if self.positions_only(real_i):
                continue  # a relative shift, windows, chunks: positions among themselves
            for t in real_i:
                if self.kind(t) not in TOKENS or not _straddles(
                    self.shape, real_i, t, self.resolved, real_j
                ):
                    continue
                if self._chunked(t, real_j):
                    continue
                if self.evident(real_i, real_j, self._straddle_known(real_i, t)):
                    return self._mixing(real_i, real_j, t)
        return None

    def _straddle_known(self, real_i, t: int) -> bool:
        """The cut axis is established as positions or examples, and what it is mixed with
        is established too."""
        if not all(D.established_kind(a) in TOKENS for a in self.meta.dims[t]):
            return False
        own = {a[0].find() for a in self.meta.dims[t]}
        return any(
            D.established_kind(a) is not None
            for i in real_i
            if i != t
            for a in self.meta.dims[i]
            if a[0].find() not in own
        )

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
            real_i, real_j = self.real_axes(gi, gj)
            if len(real_i) < 2:
                continue
            for t in real_i:
                if (
                    self.kind(t) in TOKENS
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
        if name not in SEQ_AXES and self.kind(t) != TOKEN:
            return False
        return _carves_heads(real_i, t, self.resolved, real_j, self.call.declared())

    def _mixing(self, real_i, real_j, t) -> Violation:
        call, label, expr, shape, axes = self.call, self.label, self.expr, self.shape, self.axes
        names = [axes[i] or f"dim {i}" for i in real_i]
        token = axes[t] or ("batch" if self.kind(t) == BATCH else f"dim {t}")
        said = self.shown[t] or token  # the name the message shows (a graph's nodes)
        declared = call.declared()
        regroup = self.regroup_text(real_i, real_j)
        count = self.count(real_j)
        seq_like = token in SEQ_AXES or self.kind(t) == TOKEN
        tp_note = (
            carve_account(call, self.x, label, count)
            if token in SEQ_AXES and real_i.index(t) == 0
            else None
        )
        lead = real_i.index(t)
        if tp_note is not None:
            relation = f"{expr}: carves heads out of the {said} axis: {regroup}"
            hint = tp_note
        elif self._window_partition(real_i, real_j, t):
            relation = (
                f"{expr}: {regroup}, moving data across the {said} axis: each window takes "
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
                    f".view(batch, seq, heads * d_k){sizes_merge(shape)}"
                )
            else:
                hint = (
                    f"transpose first: {label}.transpose({real_i[0]}, {t}) puts the {said} "
                    "axis in front, then merge with a view"
                )
        elif (
            seq_like
            # An image's tokens put back as a map are no heads carve unless the module
            # declares the heads the target leads with.
            and (_declares_heads(declared) or not self.image(real_i))
            and _carves_heads(real_i, t, self.resolved, real_j, declared)
        ):
            relation = f"{expr}: carves heads out of the {said} axis: {regroup}"
            hint = carve_hint(label, shape, real_i, declared, self.sizes, count)
        elif self.kind(t) == BATCH and any(n in SEQ_AXES for n in names):
            other = next(n for n in names if n in SEQ_AXES)
            relation = (
                f"{expr}: folds batch into {other}: {regroup}, moving data across the batch axis"
            )
            hint = (
                f"reshape reinterprets memory and does not swap axes; to exchange batch and "
                f"{other} use {label}.transpose({real_i[0]}, {real_i[1]})"
            )
        else:
            relation = f"{expr}: {regroup}, moving data across the {said} axis"
            hint = self.reorder_hint(real_i, real_j)
        return Violation("view_mixes_axes", relation, self.operands(), hint, severity="warning")

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


def _declares_heads(declared) -> bool:
    return bool(declared.get("heads") or declared.get("kv_heads"))


def _carves_heads(real_i, t, resolved, real_j, declared) -> bool:
    """The token axis comes first and the target group leads with a head count."""
    heads = declared.get("heads") or declared.get("kv_heads")
    if real_i.index(t) != 0 or len(real_j) < 3:
        return False
    return heads is None or resolved[real_j[0]] in (
        declared.get("heads", ("", 0))[1],
        declared.get("kv_heads", ("", 0))[1],
    )
