"""Probes along the seq axis: causality, length change, key padding, token permutation."""

import torch

from .compare import deviation, scale_of
from .edits import (
    along,
    derangement,
    distinct_length,
    permuted,
    perturbed,
    sizes_in_play,
    sliced,
    take,
)
from .layout import Leaf
from .locate import crashed, locate, region_padding, region_permuted, region_prefix
from .result import ProbeResult, skipped
from .subject import Subject, out_rows
from .tree import rebuild

_PAD_NAMES = ("pad",)


def causality(s: Subject) -> ProbeResult:
    """In a causal module, changing later tokens leaves earlier tokens' outputs unchanged."""
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
        return locate(s, s.inputs, changed, region_prefix("seq", length, t, same_size=True))

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
    """The module runs at a shorter length; a causal one gives a prefix's outputs unchanged."""
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
        return crashed(name, f"at seq {t} instead of {length}", error, s, short)
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
        return locate(s, s.inputs, short, region_prefix("seq", length, t))

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
    """Changing keys marked as padding leaves the real tokens' outputs unchanged."""
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
        return locate(s, with_padding, changed, region_padding(length, p))

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
    """Without masks or positions, permuting the tokens permutes the outputs alike."""
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
        return locate(s, s.inputs, moved, region_permuted(s.layout.lengths[0], perms[0]))

    return s.result(
        name,
        dev,
        "permuting the tokens",
        "the outputs (permuted back)",
        "with no mask and no positions, attention treats tokens as a set: a view that moves "
        "data across the seq axis, or a hidden position term, breaks that",
        point,
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
    where = along(t, dim, padded) & along(t, leaf.batch, torch.tensor([0]))
    value = torch.finfo(t.dtype).min if t.is_floating_point() else int(pads_true)
    return t.masked_fill(where.to(t.device), value)
