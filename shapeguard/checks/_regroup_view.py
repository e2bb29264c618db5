"""One view or reshape under examination for `regroup`: its groups, the axes provenance
gives its target, the evidence for a finding (the user's declarations it breaks), and
the hints that show the view the code meant."""

from .. import _ops
from .._names import dims as D
from .._names.dims import BATCH, COPY, FEATURE, TOKEN
from .._names.flow import regroup_view
from .._names.intent import view_intents

SEQ_AXES = ("seq", "seq_q", "seq_k")

# The factors a head split makes of the features.
HEAD_FACTORS = ("heads", "kv_heads", "d_k")

TOKENS = (BATCH, TOKEN)


class ViewUnderExamination:
    """One view under examination: its groups, and the axes provenance gives its target."""

    def __init__(self, call, x, sizes, shape, resolved, groups) -> None:
        self.call, self.x, self.sizes = call, x, sizes
        self.shape, self.resolved, self.groups = shape, resolved, groups
        self.meta = call.meta_of(x)
        self.axes = call.axes(x)
        self.shown = call.shown_axes(x)  # the names messages show (`_names/shown.py`)
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

    def atoms(self, real_i) -> list:
        return [a for i in real_i for a in D.normalize(self.meta.dims[i])]

    def real_axes(self, gi, gj):
        return (
            [i for i in gi if self.shape[i] != 1],
            [j for j in gj if self.resolved[j] != 1],
        )

    def regroup_text(self, real_i, real_j) -> str:
        names = [self.shown[i] or f"dim {i}" for i in real_i]
        src = ", ".join(f"{n}={self.shape[i]}" for n, i in zip(names, real_i, strict=True))
        dst = ", ".join(str(self.resolved[j]) for j in real_j)
        return f"regroups [{src}] as [{dst}]"

    def operands(self):
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
                if entangled[j] or not holds(axes[j], intent.axis, whole=not intent.part):
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
            and holds(axes[k], intent.axis, whole=not intent.part)
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

    def evident(self, real_i, real_j, atoms_known: bool) -> bool:
        """A finding on this group stands on established kinds, or on a declaration the
        view breaks in it (on one of its target axes, or by moving here an axis the user
        declared on another)."""
        if atoms_known or any(j in self.broken for j in real_j):
            return True
        return any(a[0].find() in self._misplaced for a in self.atoms(real_i))

    def positions_only(self, real_i) -> bool:
        """Every factor of the group is a position: a view that moves data between
        positions only, as a relative shift, a window partition or chunks of a sequence
        do, never between positions and features or examples."""
        return all(D.kind_of((a,)) == TOKEN for a in self.atoms(real_i))

    # -- hints -----------------------------------------------------------------------------
    def image(self, real_i) -> bool:
        """The regrouped axes are an image's (channels, height, width, or parts of them),
        where patches are made: never a group that holds attention's heads or d_k (a heads
        merge in a window attention regroups window positions, not an image)."""
        if self.meta.op == "unfold":
            return True
        atoms = self.atoms(real_i)
        if any(D.atom_name(a) in HEAD_FACTORS for a in atoms):
            return False
        names = {D.dim_name(a[0].find()) for a in atoms}
        return bool(names & {"height", "width"})

    def fold_hint(self, real_i, real_j) -> str | None:
        """The hint where a channels-first view ([batch, C, length]) merges a factor of the
        channels into the positions ([C / k, k * length]): heads taken from the channels
        belong in the batch, as guided-diffusion's legacy attention folds them; None
        for any other group."""
        if len(real_i) != 2 or len(real_j) != 2:
            return None
        f, t = real_i
        if self.kind(f) != FEATURE or self.kind(t) != TOKEN:
            return None
        channels, length = self.shape[f], self.shape[t]
        merged = self.resolved[real_j[1]]
        if merged <= length or merged % length or channels % (merged // length):
            return None
        k = merged // length
        lead = ", ".join(str(self.resolved[j]) for j in range(real_j[0]))
        batch = f"{lead} * {k}" if lead else str(k)
        return (
            f"heads are a factor of the channels: fold them into the batch, not into the "
            f"positions: {self.label}.reshape({batch}, {channels // k}, {length}) takes them as "
            "the outer factor of the channels ([heads, 3 * ch], guided-diffusion's legacy "
            "order); where the channels are [3, heads, ch], split q, k and v first "
            f"(.chunk(3, dim={f})) and fold each"
        )

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
        sizes are a reordering of the source's factors (tokens put back as a channels-first
        map too); else, for an image, the hint for patches made or put back."""
        atoms = self.atoms(real_i)
        if self.image(real_i):
            order = self._order(real_i, real_j, intents)
            if order is None or order == list(range(len(order))):
                return self.unpatchify_hint(real_i, real_j) or self.patch_hint(real_i)
        sizes = [a[2] for a in atoms]
        order = self._order(real_i, real_j, intents)
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

    def _order(self, real_i, real_j, intents: bool) -> list[int] | None:
        atoms = self.atoms(real_i)
        wanted = [self.resolved[j] for j in real_j]
        named = self.intents if intents else []
        wants = [named[j].kind if named and named[j] is not None else None for j in real_j]
        kinds = [D.kind_of((a,)) for a in atoms]
        return _reordering([a[2] for a in atoms], wanted, kinds, wants)

    def unpatchify_hint(self, real_i, real_j) -> str | None:
        """The hint where tokens of a patch grid, each holding a patch's pixels of every
        channel ([N, gh * gw, p * p * c]), are viewed as the image [N, c, gh * p, gw * p]:
        the patches' rows and columns are to be moved next to the grid's first. None for
        any other group."""
        tokens = [a for a in self.atoms(real_i) if D.kind_of((a,)) == TOKEN]
        features = [i for i in real_i if self.kind(i) == FEATURE]
        if len(tokens) != 2 or len(features) != 1 or len(real_j) < 3:
            return None
        (gh, gw), pixels = (a[2] for a in tokens), self.shape[features[0]]
        c, height, width = (self.resolved[j] for j in real_j[-3:])
        p = height // gh
        n = real_j[-3]
        if height % gh or width != gw * p or pixels != p * p * c or p < 2 or not n:
            return None
        lead = ", ".join(str(self.resolved[j]) for j in range(n))
        perm = ", ".join(str(k) for k in [*range(n), n + 4, n, n + 2, n + 1, n + 3])
        return (
            "each token holds a patch's pixels, [p, p, c] for its place in the grid: view "
            f"them as such and move the patch rows next to the grid's, "
            f"{self.label}.reshape({lead}, {gh}, {gw}, {p}, {p}, {c}).permute({perm})"
            f".reshape({lead}, {c}, {height}, {width})"
        )


def holds(held, axis, whole: bool) -> bool:
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


def sizes_merge(shape) -> str:
    if len(shape) != 4:
        return ""
    b, h, s, d = shape
    return f", i.e. .transpose(1, 2).reshape({b}, {s}, {h * d})"


def carve_hint(call_label: str, shape, real_i: list[int], declared, sizes=(), count=None) -> str:
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
