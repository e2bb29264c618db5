"""What a view or reshape does to the axes: data moved across axes of different origin.

A view keeps memory order, so it can only split an axis into factors or merge
neighbours whole. Read through provenance (`_names`), these are the ways it moves
data where it should not:

- it cuts across a token axis (batch or seq): heads carved out of the sequence,
  heads merged back before the transpose, batch folded into the sequence, a patch
  grid flattened without its permute (`view_mixes_axes`);
- it entangles two axes whose factors do not line up (a relative-bias table
  viewed in place of a permute);
- it merges a position with a factor of the features into one axis, while other
  axes remain (`[heads, seq, d_k] -> [seq, heads * d_k]` read as `[seq, d_model]`);
- it unfolds `[batch * heads]` in the other order than it was folded, so examples
  trade their heads (`batch_mixing`);
- where sizes coincide and none of this shows in the shapes, the user's own names
  for the target sizes (`view(B, self.n_heads, S, d_k)`) contradict what lands there.
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
from . import WARNING, rule
from . import tp as _tp_checks
from ._view import CallView
from .heads_view import target_shape, view_compatible

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
    if not args or not hasattr(args[0], "shape"):
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


class _View:
    """One view under examination: its groups, and the axes provenance gives its target."""

    def __init__(self, call, x, sizes, shape, resolved, groups) -> None:
        self.call, self.x, self.sizes = call, x, sizes
        self.shape, self.resolved, self.groups = shape, resolved, groups
        self.meta = call.meta_of(x)
        self.axes = call.axes(x)
        self._target: tuple[list[D.Axis], list[bool]] | None = None
        self._label: str | None = None

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

    def kind(self, i: int) -> str | None:
        return D.kind_of(self.meta.dims[i])

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
            if cut:
                return self._unfold_violation(real_i[0], real_j)
        return None

    def _unfold_violation(self, i: int, real_j, reason: str = "") -> Violation:
        source = D.normalize(self.meta.dims[i])
        folded = " * ".join(D.describe_atom(a) for a in source)
        sizes = [a[2] for a in source]
        why = reason or (
            f"it cuts the {self.x.shape[i]} entries into "
            f"{' x '.join(str(self.resolved[j]) for j in real_j)}, not into the "
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
            hint = (
                f"unfold in the order of the fold, [{folded}]: {self._unfold_call(sizes, real_j)}; "
                "its axes are then [batch, heads, ...] already, so no transpose swaps them back"
            )
        return Violation(
            "batch_mixing",
            f"{self.expr}: unfolds [{folded}] ({self.x.shape[i]}) in another order than it was "
            f"folded: {why}, so examples trade their data",
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
        intents = view_intents(self.call, len(self.resolved))
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
            for t in real_i:
                if self.kind(t) in _TOKENS and _straddles(
                    self.shape, real_i, t, self.resolved, real_j
                ):
                    return self._mixing(real_i, real_j, t)
        return None

    def _mixing(self, real_i, real_j, t) -> Violation:
        call, label, expr, shape, axes = self.call, self.label, self.expr, self.shape, self.axes
        names = [axes[i] or f"dim {i}" for i in real_i]
        token = axes[t] or ("batch" if self.kind(t) == BATCH else f"dim {t}")
        declared = call.declared()
        regroup = self._regroup_text(real_i, real_j)
        count = self.resolved[real_j[-2]] if len(real_j) >= 3 else None
        tp_note = (
            _tp_checks.carve_note(call, self.x, label, count)
            if token in _SEQ_AXES and real_i.index(t) == 0
            else None
        )
        if tp_note is not None:
            relation = f"{expr}: carves heads out of the {token} axis: {regroup}"
            hint = tp_note
        elif token in _SEQ_AXES and "heads" in names[: real_i.index(t)]:
            relation = (
                f"{expr}: merges heads back before moving them next to d_k: {regroup}, "
                "so each output token holds pieces of other tokens"
            )
            hint = (
                f"transpose first: {label}.transpose(1, 2).contiguous().view(batch, seq, heads * d_k)"
                f"{_sizes_merge(shape)}"
            )
        elif token in _SEQ_AXES and _carves_heads(real_i, t, self.resolved, real_j, declared):
            relation = f"{expr}: carves heads out of the {token} axis: {regroup}"
            hint = _carve_hint(label, shape, real_i, declared, count)
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
            hint = self.patch_hint()
        else:
            relation = f"{expr}: {regroup}, moving data across the {token} axis"
            hint = _carve_hint(label, shape, real_i, declared, count)
        return Violation("view_mixes_axes", relation, self._operands(), hint, severity="warning")

    # -- factors that do not line up -----------------------------------------------------
    def entangled(self) -> Violation | None:
        """A group whose cuts fall inside axes they do not divide: no target axis is a
        factor of a source one, and at least one of the axes is known."""
        _, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self._real(gi, gj)
            if len(real_i) < 2 or not any(entangled[j] for j in real_j):
                continue
            if not any(self.kind(i) for i in real_i):
                continue
            names = [self.axes[i] or f"dim {i}" for i in real_i]
            relation = (
                f"{self.expr}: {self._regroup_text(real_i, real_j)}: the new axes cut across "
                f"{' and '.join(names)}, so each of them holds pieces of several"
            )
            return Violation(
                "view_mixes_axes", relation, self._operands(), self._reorder_hint(real_i, real_j),
                severity="warning",
            )  # fmt: skip
        return None

    # -- positions merged with features ----------------------------------------------------
    def merged_kinds(self) -> Violation | None:
        """A target axis that joins positions (seq) with features, while the view keeps
        other axes: the tokens of the result hold pieces of other tokens. A merge the user
        prepared with a transpose or permute is deliberate, and a flattened example
        ([batch, seq * d_model]) has no other axis to be wrong about."""
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
                if TOKEN in kinds and FEATURE in kinds and not self._deliberate_fold(j, axes[j]):
                    return self._merge_violation(real_i, real_j)
        return None

    def _deliberate_fold(self, j: int, axis) -> bool:
        """The user built target size j from the size of the axis we only take for
        positions by the input's usual layout: `view(T, bsz * h, d)` after
        `T, bsz, C = x.size()` folds what seq-first code knows is its batch with the heads.
        Structure (attention, a conv, positions) outranks the user's arithmetic; the
        convention does not."""
        tokens = [a[0].find() for a in axis if a[0].find().kind == TOKEN]
        if not tokens or any(root.kind_rank > D.CONVENTION for root in tokens):
            return False
        intents = view_intents(self.call, len(self.resolved))
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
            hint = self._reorder_hint(real_i, real_j)
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
        contradict what lands on them."""
        intents = view_intents(self.call, len(self.resolved))
        if not intents:
            return None
        axes, entangled = self.target
        for j, intent in enumerate(intents):
            if intent is None or entangled[j] or not axes[j]:
                continue
            held = axes[j]
            held_kind = D.kind_of(held)
            if intent.axis is not None:
                wanted = {a[0].find() for a in intent.axis}
                if wanted <= {a[0].find() for a in held}:
                    continue
            if (
                intent.kind is None
                or held_kind in (None, "mixed", COPY)
                or held_kind == intent.kind
            ):
                continue
            return self._intent_violation(j, intent, held, held_kind)
        return None

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
        relation = (
            f"{self.expr}: axis {j} is {said} but receives {held_name} ({held_kind} axis): "
            f"a view keeps memory order, and only the coinciding sizes ({size}) let it run"
        )
        if intent.name in ("heads", "kv_heads") and held_kind == TOKEN:
            real_i = [i for i in range(len(self.shape)) if self.shape[i] != 1]
            hint = _tp_checks.carve_note(self.call, self.x, self.label, size) or _carve_hint(
                self.label, self.shape, real_i[-1:], self.call.declared(), size
            )
        else:
            real_i = [i for i in range(len(self.shape)) if self.shape[i] != 1]
            real_j = [k for k in range(len(self.resolved)) if self.resolved[k] != 1]
            hint = self._reorder_hint(real_i, real_j, intents=True)
        return Violation("view_mixes_axes", relation, self._operands(), hint, severity="warning")

    # -- hints -----------------------------------------------------------------------------
    def image(self, real_i) -> bool:
        """The regrouped axes are an image's (channels, height, width, or parts of them)."""
        names = {D.dim_name(a[0].find()) for i in real_i for a in self.meta.dims[i]}
        return bool(names & {"height", "width"}) or self.meta.op == "unfold"

    def patch_hint(self) -> str:
        if self.meta.op == "unfold":
            return (
                "F.unfold gives [batch, C * p * p, patches], the patches last: "
                f"{self.label}.transpose(1, 2) makes [batch, patches, C * p * p]"
            )
        return (
            "a reshape keeps the image's memory order [channels, height, width], so each patch "
            "would take rows of pixels, not squares: cut height and width into patches, move "
            f"the patch grid first and permute, e.g. {self.label}.unflatten(3, (W // p, p))"
            ".unflatten(2, (H // p, p)).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p), "
            "or use nn.Conv2d(C, d_model, kernel_size=p, stride=p)"
        )

    def _reorder_hint(self, real_i, real_j, intents: bool = False) -> str:
        """View in the order the data is stored, then permute: computed when the target
        sizes are a reordering of the source's factors."""
        if self.image(real_i):
            return self.patch_hint()
        atoms = [a for i in real_i for a in D.normalize(self.meta.dims[i])]
        sizes = [a[2] for a in atoms]
        wanted = [self.resolved[j] for j in real_j]
        named = view_intents(self.call, len(self.resolved)) if intents else []
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


def _carve_hint(call_label: str, shape, real_i: list[int], declared, count=None) -> str:
    label = call_label
    heads = declared.get("heads")
    kv_heads = declared.get("kv_heads")
    if kv_heads is not None and count == kv_heads[1] and (heads is None or heads[1] != count):
        heads = kv_heads  # the keys' or values' split: n_kv_heads * head_dim is the width
    d_k = declared.get("d_k")
    features = shape[real_i[-1]]
    if heads is not None and d_k is not None and features != heads[1] * d_k[1]:
        # `W_k(x)` was made by the layer W_k: name the layer to fix.
        made = label.endswith(")") and "(" in label
        maker = label.split("(", 1)[0] if made else f"what made {label}"
        return (
            f"{label} has {features} features but {heads[0]} * {d_k[0]} = {heads[1] * d_k[1]}: "
            f"the -1 absorbed the difference into the sequence axis; check {maker}"
        )
    sizes = ""
    if heads is not None and d_k is not None and len(shape) == 3:
        sizes = f", i.e. view({shape[0]}, {shape[1]}, {heads[1]}, {d_k[1]}).transpose(1, 2)"
    return (
        f"split heads out of the feature axis, then move them: "
        f"use {label}.view(batch, seq, heads, d_k).transpose(1, 2){sizes}"
    )
