"""The axes of a model's own inputs, read by the usual layouts (a convention, weaker
than anything the ops that consume them say).

- token ids (integers) are `[batch, seq]` (`[seq]` alone);
- a float `[batch, seq, features]` activation, `[batch, features]` for 2-D;
- a 4-D float is an image `[batch, channels, height, width]` (q, k, v passed in as
  `[batch, heads, seq, d_k]` are renamed by the attention that reads them);
- a mask (bool, or named like one) is named by the op that applies it; until then
  its axes take the names of the main input's batch and seq where their sizes say
  so unambiguously, as a last resort that decides nothing.

Audio features (`[batch, mel, frames]`) read as `[batch, seq, features]` here; the
model's own conv then says mel is channels and frames are positions.
"""

from . import dims as D
from .dims import BATCH, CONVENTION, FEATURE, GUESS, TOKEN, Axis


def claim_input(axes: tuple[Axis, ...], tensor, label: str, declared: dict) -> None:
    """Claim the usual layout of a main input (`axes` are the tensor's own)."""
    for i, axis in enumerate(axes):
        for dim, _, _ in axis:
            root = dim.find()
            if not root.origin or root.origin.startswith("a tensor made"):
                root.origin = f"axis {i} of {label}"
    ndim = len(axes)
    dtype = tensor.dtype
    if ndim >= 2:
        D.claim_atoms(axes[0], BATCH, CONVENTION, "batch")
    if not (dtype.is_floating_point or dtype.is_complex):
        if ndim in (1, 2):
            D.claim_atoms(axes[-1], TOKEN, CONVENTION, "seq")
        return
    if ndim == 3:
        D.claim_atoms(axes[1], TOKEN, CONVENTION, "seq")
    if ndim == 4:
        D.claim_atoms(axes[1], FEATURE, CONVENTION, "channels")
        D.claim_atoms(axes[2], TOKEN, CONVENTION, "height")
        D.claim_atoms(axes[3], TOKEN, CONVENTION, "width")
    if ndim in (2, 3):
        D.claim_atoms(axes[-1], FEATURE, CONVENTION)
        d_model = declared.get("d_model")
        if d_model is not None and d_model[1] == int(tensor.shape[-1]):
            D.claim_atoms(axes[-1], FEATURE, CONVENTION, "d_model")


def guess_mask(axes: tuple[Axis, ...], main: tuple[Axis, ...]) -> None:
    """Name a mask's axes after the main input's batch and seq, by size, only where the
    two sizes differ (else nothing: a guess must never pick the wrong one)."""
    sizes = {}
    for axis in main:
        name = D.known_name(axis)
        if name in ("batch", "seq") and axis:
            sizes[name] = D.size_of(axis)
    if len(sizes) != 2 or sizes["batch"] == sizes["seq"]:
        return
    by_size = {size: name for name, size in sizes.items()}
    for axis in axes:
        name = by_size.get(D.size_of(axis))
        if name is not None and len(axis) == 1:
            D.claim_part(axis[0], name, GUESS)


def mask_batch(axes: tuple[Axis, ...], main: tuple[Axis, ...]) -> None:
    """A mask handed in beside the main input, as long on its first axis as the main
    input's batch: batch-first like it, by convention (attention names it for good)."""
    if len(axes) < 2 or not main or not main[0] or not axes[0]:
        return
    if D.known_name(main[0]) == "batch" and D.size_of(axes[0]) == D.size_of(main[0]):
        D.claim_atoms(axes[0], BATCH, CONVENTION)


def pair_sequences(inputs: list) -> None:
    """Two or more activations `[batch, seq, features]` (`forward(x, memory)`): the first
    one's positions are the queries, the others' the keys, until attention says more."""
    seqs = [
        meta.dims[1]
        for tensor, meta in inputs
        if tensor.dim() == 3 and tensor.is_floating_point() and meta.dims[1]
    ]
    if len(seqs) < 2:
        return
    for i, axis in enumerate(seqs):
        D.set_side(axis[0][0].find(), q=i == 0, k=i != 0)
