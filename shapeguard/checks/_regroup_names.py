"""`regroup`'s finding where sizes coincide and the view is legal, but the user's own
names for its target sizes contradict what lands on them."""

from .._errors import Violation
from .._names import dims as D
from .._names.dims import BATCH, COPY, FEATURE, TOKEN
from .._names.shown import shown_name
from ._accounts import carve_account
from ._regroup_unfold import Unfolds
from ._regroup_view import carve_hint, holds, sizes_merge


class NamedOtherwise(Unfolds):
    """A view the user's names for its target sizes contradict."""

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
            if intent.axis is not None and holds(held, intent.axis, whole=not intent.part):
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
        held_name = shown_name(held, D.known_name(held)) or " * ".join(_part_name(a) for a in held)
        size = self.resolved[j]
        # What the message shows the read as (a graph's nodes, where a decision reads batch).
        read = shown_name(intent.axis, intent.name) if intent.axis is not None else intent.name
        said = f"{intent.text} ({read})" if read else intent.text
        if intent.kind == FEATURE and held_kind == BATCH:
            i = next(
                (i for i, axis in enumerate(self.meta.dims) if set(held) <= set(D.normalize(axis))),
                None,
            )
            if i is not None and len(self.meta.dims[i]) >= 2:
                return self.unfold_violation(
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
            hint = carve_account(self.call, self.x, self.label, size) or carve_hint(
                self.label, self.shape, real_i[-1:], self.call.declared(), self.sizes, size
            )
        else:
            real_j = [k for k in range(len(self.resolved)) if self.resolved[k] != 1]
            hint = self.reorder_hint(real_i, real_j, intents=True)
        return Violation("view_mixes_axes", relation, self.operands(), hint, severity="warning")

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
                f"heads * d_k){sizes_merge(self.shape)}"
            )
        return f"transpose first: {self.label}.transpose({front}, {back}), then merge with a view"


def _established_of(axis) -> str | None:
    """The one kind that factors of the axis have established (those of unknown kind, and
    copies, aside); None where none has, or where two kinds are."""
    kinds = {D.established_kind(a) for a in axis if a[0].find().kind != COPY} - {None}
    return kinds.pop() if len(kinds) == 1 else None


def _part_name(atom) -> str:
    """A factor in a message: its name, or which named axis it is a part of (a factor of
    the channels a view cut out of them)."""
    name = D.atom_name(atom)
    if name is None and not D.is_whole(atom):
        whole = D.dim_name(atom[0].find())
        if whole is not None:
            return f"part of {whole}"
    return D.describe_atom(atom)
