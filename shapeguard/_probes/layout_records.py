"""The inputs as the probes see them (`layout.read_layout` fills these): each input
leaf's batch and token axes, the output's, and the token groups; and how an axis's
provenance is read."""

from dataclasses import dataclass, field

import torch

from .._names import dims as D


@dataclass(slots=True)
class Leaf:
    """One tensor among the inputs: where it sits, what it is, which axes are which."""

    path: tuple
    name: str
    kind: str  # "ids", "data", "mask", "other"
    batch: int | None = None
    seq: dict[int, int] = field(default_factory=dict)  # axis -> token group
    ids_range: tuple[int, int] | None = None  # ids: the values new ids are drawn from
    avoid: frozenset = frozenset()  # ids: values never drawn (the model's pad id)
    polarity: str = ""  # padding mask: "keep" (nonzero = a real token) or "hide"
    padding: bool = False  # a [batch, seq] padding mask (one token axis), polarity known
    dtype: str = ""  # "float", "bool" or "int"; "additive" for a 0 / -inf float mask


@dataclass(slots=True)
class OutLeaf:
    """One floating tensor of the output, with its batch axes and token axes."""

    path: tuple
    batch: tuple[int, ...] = ()
    seq: dict[int, int] = field(default_factory=dict)  # axis -> token group
    # Axes as long as the batch that are not known to be it, nor features nor tokens
    # (CLIP's images-by-texts logits): its examples cannot be compared one by one.
    loose: tuple[int, ...] = ()
    # Axes as long as a token group that the trace does not place (not the batch, not a
    # group's tokens, not features: PEGASUS-X's encoder output after its padding to the
    # block size is cut back): which of their rows are padding cannot be told.
    unplaced: tuple[int, ...] = ()
    # Axes that hold the batch whole as one factor among others (Swin's windows,
    # [batch * windows, ...]): axis -> (outer, inner), the sizes of the factors outside and
    # inside the batch, so each example's rows along it can be picked (`example_rows`).
    folded: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class Layout:
    """Batch size, token groups and each leaf's axes, as the probes see the inputs."""

    batch_size: int | None
    lengths: list[int]  # the length of each token group; group 0 holds the queries
    leaves: dict[tuple, Leaf]
    ambiguous: str = ""  # why some token axes cannot be told apart, if they cannot
    ambiguous_batch: str = ""  # why some input's batch axis cannot be told, if it cannot
    # Why the conventional batch axis holds no independent examples (a product contracts
    # it: `contractions.contracted_batch`); the batch probes do not apply.
    not_batch: str = ""
    # Why the batch cannot be resized (a sub-batch, copies of one example): an input of
    # ids or data has an axis as long as the batch that the trace does not show is it.
    unbatched: str = ""
    batch_dim: int = 0
    seq_dim: int = 1
    outputs: list[OutLeaf] = field(default_factory=list)
    queries: bool = False  # group 0 is a sequence the outputs keep
    group_names: list[str] = field(default_factory=list)  # "input_ids", "memory", ...
    roots: list = field(default_factory=list)  # each group's dim (`_names.dims.Dim`)
    pads: dict[int, torch.Tensor] = field(default_factory=dict)  # group -> bool [batch, len]
    made_inside: str = ""  # why no group is kept by the outputs (patches of an image, ...)
    polarity_unknown: str = ""  # a mask whose polarity the trace could not read
    # Uniform masks no op applied, as long as two sequences: (path, token axis, groups,
    # polarity). `resolve_pending` pads one key and retraces to see which it pads.
    pending: list = field(default_factory=list)

    def padded(self, group: int) -> torch.Tensor | None:
        """bool [batch, length] of padded positions of a group (None: no padding known)."""
        return self.pads.get(group)

    def leaves_of(self, *kinds: str) -> list[Leaf]:
        return [leaf for leaf in self.leaves.values() if leaf.kind in kinds]


def root_of(axis) -> D.Dim | None:
    """The dim of an axis that is one dim whole (not a factor, not merged)."""
    if len(axis) != 1:
        return None
    atom = axis[0]
    return atom[0].find() if D.is_whole(atom) else None


def roots_of(axis) -> list:
    return [atom[0].find() for atom in axis]


def axis_kind(axis) -> str | None:
    kind = D.kind_of(axis)
    return None if kind in ("mixed", D.COPY) else kind


def example_rows(examples, batch: int, outer: int, inner: int) -> torch.Tensor:
    """The rows of `examples` along an axis that folds a batch of `batch` with `outer`
    factors outside it and `inner` inside ([batch * windows]: outer 1), in axis order."""
    picked = torch.as_tensor(examples, dtype=torch.long)
    base = torch.arange(outer).view(-1, 1, 1) * (batch * inner)
    rows = base + picked.view(1, -1, 1) * inner + torch.arange(inner).view(1, 1, -1)
    return rows.reshape(-1)
