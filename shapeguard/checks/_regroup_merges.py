"""`regroup`'s findings of axes merged across kinds: factors that do not line up
(entangled), and positions merged with features while other axes remain."""

from .._errors import Violation
from .._names import dims as D
from .._names.dims import BATCH, COPY, FEATURE, TOKEN
from ._regroup_view import SEQ_AXES, TOKENS, ViewUnderExamination, sizes_merge


class Merges(ViewUnderExamination):
    """A view that merges axes of different kinds."""

    def entangled(self) -> Violation | None:
        """A group whose cuts fall inside axes they do not divide: no target axis is a
        factor of a source one. Positions entangled among themselves are a regrouping of
        positions (a relative shift); a feature axis or the batch entangled with another
        axis is the finding."""
        _, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self.real_axes(gi, gj)
            if len(real_i) < 2 or not any(entangled[j] for j in real_j):
                continue
            if not any(self.kind(i) for i in real_i) or self.positions_only(real_i):
                continue
            known = any(D.established_kind(a) in (FEATURE, BATCH) for a in self.atoms(real_i))
            if not self.evident(real_i, real_j, known):
                continue
            names = [self.axes[i] or f"dim {i}" for i in real_i]
            relation = (
                f"{self.expr}: {self.regroup_text(real_i, real_j)}: the new axes cut across "
                f"{' and '.join(names)}, so each of them holds pieces of several"
            )
            return Violation(
                "view_mixes_axes", relation, self.operands(), self.reorder_hint(real_i, real_j),
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
            real_i, real_j = self.real_axes(gi, gj)
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
                if self.evident(real_i, real_j, known):
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
        return not any(kind in TOKENS for _, kind in flat[first:])

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
        regroup = self.regroup_text(real_i, real_j)
        positions = any(
            n in SEQ_AXES or self.kind(i) == TOKEN for n, i in zip(names, real_i, strict=True)
        )
        if "heads" in names and positions:
            relation = (
                f"{self.expr}: merges heads back before moving them next to d_k: {regroup}, "
                "so each output token holds pieces of other tokens"
            )
            hint = (
                f"transpose first: {self.label}.transpose(1, 2).contiguous().view(batch, seq, "
                f"heads * d_k){sizes_merge(self.shape)}"
            )
        else:
            relation = (
                f"{self.expr}: {regroup}: one new axis joins positions with features, so the "
                "positions of the result hold pieces of other positions"
            )
            hint = self.fold_hint(real_i, real_j) or self.reorder_hint(real_i, real_j)
        return Violation("view_mixes_axes", relation, self.operands(), hint, severity="warning")

    def _with_heads(self, real_i: list[int], real_j: list[int]) -> tuple[list[int], list[int]]:
        """The group, and before it the source axis of the heads that belong with a merged
        d_k, with where it lands, when it is not in the group (an attention output's heads
        are the queries', its d_k the values': one head split, by what attention did)."""
        last = len(self.shape) - 1
        if not any(
            self.axes[i] == "d_k" or (i == last and self.kind(i) == FEATURE) for i in real_i
        ):
            return real_i, real_j
        for h in range(real_i[0] - 1, -1, -1):
            if self.axes[h] in ("heads", "kv_heads") and D.is_factor(self.meta.dims[h]):
                for gi, gj in self.groups:
                    if h in gi:
                        landed = [j for j in gj if self.resolved[j] != 1]
                        return [h, *real_i], [*landed, *real_j]
        return real_i, real_j
