"""Probes along the tokens: causality, length change, key padding, token permutation.

They edit the token groups the layout found (token ids by drawing other ids, data with
noise), group 0 being the queries: the tokens whose positions the output keeps. Padded
positions are left out of every comparison.
"""

from typing import cast

import torch

from .edits import (
    derangement,
    distinct_length,
    padded,
    permuted,
    perturbed,
    sizes_in_play,
    sliced,
    take,
    take_examples,
)
from .locate import locate, region_padding, region_permuted, region_prefix
from .result import ProbeResult, inconclusive, not_applicable
from .subject import Subject

# Every split is tested up to this many tokens; beyond, LONG_SPLITS splits spread evenly
# from 1 to length - 1 (with the unchanged copy, one batch of 8 copies of one example).
STRICT_UP_TO = 16
LONG_SPLITS = 7


def _group_names(s: Subject, group: int) -> str:
    names = [
        leaf.name
        for leaf in s.layout.leaves.values()
        if leaf.kind in ("ids", "data") and group in leaf.seq.values()
    ]
    return ", ".join(names)


def _queries(s: Subject, name: str) -> ProbeResult | None:
    """Why a probe over the queries cannot run (an inconclusive or n/a result), or None."""
    if not s.layout.queries:
        why = s.layout.made_inside or "no input has a token axis that the outputs keep"
        return not_applicable(name, why)
    if s.layout.lengths[0] < 2:
        return inconclusive(name, "needs 2 or more tokens")
    if not s.outputs(group=0):
        return not_applicable(name, "no output keeps the tokens' positions")
    return None


def splits(length: int) -> list[int]:
    """The split points t of the causality test: every one up to STRICT_UP_TO tokens, else
    LONG_SPLITS of them from 1 to length - 1 (both ends included), evenly spread."""
    if length <= STRICT_UP_TO:
        return list(range(1, length))
    step = (length - 2) / (LONG_SPLITS - 1)
    return sorted({max(1, min(length - 1, round(1 + i * step))) for i in range(LONG_SPLITS)})


def causality(s: Subject) -> ProbeResult:
    """In a causal module, no token's output depends on any later token: for each split t,
    changing tokens t.. leaves the outputs of tokens ..t-1 unchanged."""
    name = "causality"
    if not s.causal:
        return not_applicable(
            name,
            s.not_causal
            or "the module is not causal (no is_causal, no causal mask, no causal attention "
            "layer, not declared with causal=True)",
        )
    cannot = _queries(s, name)
    if cannot is not None:
        return cannot
    layout = s.layout
    length = layout.lengths[0]
    cuts = splits(length)
    pad = layout.padded(0)
    e = int(pad.sum(1).argmin()) if pad is not None and layout.batch_size else 0
    leaves = [leaf for leaf in s.outputs(group=0) if len(leaf.batch) <= 1]
    if not leaves:
        return not_applicable(name, "no output keeps the tokens' positions per example")
    # Copies of one example in one batch, where every compared output has its batch axis
    # (a batch of one's outputs may have none: its copies could not be told apart).
    batched = layout.batch_size and all(len(leaf.batch) == 1 for leaf in leaves)
    devs = _copies(s, cuts, e, leaves) if batched and not layout.unbatched else None
    copies = devs is not None
    if devs is None:
        # One run per split, on the batch as given (a module with a fixed number of cache
        # rows, or an input whose batch axis is unknown, takes no batch of copies).
        devs = []
        for t in cuts:
            changed = perturbed(layout, s.inputs, s.generator, group=0, positions=range(t, length))
            got = s.run_all(changed, f"tokens {t}..{length - 1} changed")
            devs.append(s.measure(got, s.refs, leaves, positions={0: list(range(t))}))
    failing = [i for i, d in enumerate(devs) if d > s.rtol]
    tokens = _group_names(s, 0)
    about = f" of {tokens}" if tokens else ""
    if not failing:
        t_list = (
            f"for each t from 1 to {length - 1}"
            if len(cuts) == length - 1
            else ("for t in " + ", ".join(map(str, cuts)))
        )
        return s.result(
            name,
            max(devs),
            f"changing tokens t..{length - 1}{about}, {t_list},",
            "the outputs of tokens 0..t-1",
            "",
        )
    # The smallest split that fails names the first token that sees a later one: the
    # split before it passed, so that token is t - 1.
    i = min(failing)
    t = cuts[i]
    single = take_examples(layout, s.inputs, torch.tensor([e])) if copies else s.inputs
    moved = perturbed(layout, single, s.generator, group=0, positions=range(t, length))
    example = f" (example {e})" if copies else ""

    def point():
        return locate(s, single, moved, region_prefix("seq", length, t, same_size=True))

    moved_at = f"token {t - 1}" if i == 0 or cuts[i - 1] == t - 1 else f"tokens 0..{t - 1}"
    return s.result(
        name,
        devs[i],
        f"changing tokens {t}..{length - 1}{about}{example}",
        f"the output of {moved_at}",
        f"the module is causal ({s.causal}) but earlier tokens see later ones: check the "
        "mask's direction and its diagonal (hide key j from query i when j > i, never "
        "j > i + 1) and that it reaches every head",
        point,
    )


def _copies(s: Subject, cuts: list[int], e: int, leaves) -> list[float] | None:
    """Each split's deviation from one batch of copies of example `e` (the first left
    unchanged, copy c changed from token cuts[c-1] on); None when the module rejects a
    batch of that many rows."""
    from .runs import Rejected

    layout = s.layout
    length = layout.lengths[0]
    pad = layout.padded(0)
    n = len(cuts) + 1
    stacked = take_examples(layout, s.inputs, torch.full((n,), e, dtype=torch.long))
    later = torch.zeros(n, length, dtype=torch.bool)
    for c, t in enumerate(cuts, 1):
        later[c, t:] = True
    changed = perturbed(layout, stacked, s.generator, group=0, cells=later)
    try:
        got = s.run_all(changed, f"{n} copies of example {e} in one batch")
    except Rejected:
        return None
    pads = {0: pad[[e] * n]} if pad is not None else {}
    return [
        s.measure(
            got,
            got,
            leaves,
            examples=[c],
            want_examples=[0],
            positions={0: list(range(t))},
            pad_examples=[c],
            pads=pads,
        )
        for c, t in enumerate(cuts, 1)
    ]


def length_change(s: Subject) -> ProbeResult:
    """The module runs at a shorter length; a causal one gives a prefix's outputs unchanged."""
    name = "length change"
    cannot = _queries(s, name)
    if cannot is not None:
        return cannot
    layout = s.layout
    length = layout.lengths[0]
    if layout.ambiguous:
        return inconclusive(name, layout.ambiguous)
    t = distinct_length(length, sizes_in_play(layout, s.declared))
    if t is None:
        return inconclusive(
            name, f"no shorter length than {length} that differs from the other sizes"
        )
    short = sliced(layout, s.inputs, group=0, length=t)
    got = s.run_all(short, f"seq {t} instead of {length}")
    leaves = s.outputs(group=0)
    for leaf in leaves:
        out = got.get(leaf.path)
        for d, g in leaf.seq.items():
            if g == 0 and out is not None and out.shape[d] != t:
                return ProbeResult(
                    name,
                    "failed",
                    f"at seq {t} instead of {length} the output {_path(leaf.path)} has "
                    f"{out.shape[d]} positions on its seq axis, not {t}",
                )
    if not s.causal:
        return ProbeResult(name, "passed", f"runs at seq {t} instead of {length}")
    dev = s.measure(got, s.refs, leaves, want_positions={0: list(range(t))})

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
    """Changing the tokens a padding mask marks leaves the real tokens' outputs unchanged.
    The mask's polarity is the one the module applies it with (the trace read it)."""
    name = "key-padding invariance"
    layout = s.layout
    masks = [leaf for leaf in layout.leaves.values() if leaf.padding]
    if not masks:
        if layout.polarity_unknown:
            return inconclusive(name, layout.polarity_unknown)
        return not_applicable(name, "no input is a padding mask ([batch, seq], applied to keys)")
    if layout.batch_size is None:
        return inconclusive(name, "the padding mask has no batch axis")
    mask = masks[0]
    (group,) = set(mask.seq.values())
    length = layout.lengths[group]
    if length < 2:
        return inconclusive(name, "needs 2 or more tokens")
    if not any(group in leaf.seq.values() for leaf in layout.leaves_of("ids", "data")):
        return inconclusive(name, f"no input holds the tokens {mask.name} pads")
    # Not None: `Layout` records the padding of a group with each padding mask of it.
    pad = cast(torch.Tensor, layout.padded(group))
    counts = pad.sum(1)
    full = counts >= length
    if bool(((counts > 0) & ~full).any()):
        # The inputs' own padding: change what the padded positions hold.
        e = int(torch.where(full, -1, counts).argmax())
        inputs, reference, pads = s.inputs, s.refs, layout.pads
        cells = torch.zeros_like(pad)
        cells[e] = pad[e]
        how = "its own"
    else:
        # None yet: pad the first example (on the left for a causal module, whose
        # batched generation pads there; on the right otherwise).
        e, p = 0, max(1, length // 3)
        cells = torch.zeros_like(pad)
        if s.causal and group == 0:
            cells[0, :p] = True
        else:
            cells[0, length - p :] = True
        inputs = padded(layout, s.inputs, group, cells)
        pads = dict(layout.pads)
        pads[group] = pad | cells
        reference = s.run_all(inputs, f"{mask.name} with padding added to example 0")
        how = "added"
    compared, unplaced = _placed_outputs(s, length)
    if not compared and not unplaced:
        return inconclusive(
            name,
            "no output has a batch axis whose examples the trace places, so the real "
            "tokens of the padded example cannot be compared",
        )
    if not compared:
        return inconclusive(
            name,
            f"no output keeps the padded tokens where the trace places them: {unplaced} "
            f"{'has an axis' if ', ' not in unplaced else 'have axes'} as long as the "
            f"{length} tokens that the trace does not show are them, so its padded rows "
            "cannot be left out of the comparison",
        )
    changed = perturbed(layout, inputs, s.generator, group=group, cells=cells)
    got = s.run_all(changed, f"the padded tokens of example {e} changed")
    dev = s.measure(got, reference, compared, pads=pads)
    positions = cells[e].nonzero().flatten().tolist()
    value = _pad_value(mask)
    where = _positions(positions)
    tokens = _group_names(s, group)

    left_out = (
        f"; {unplaced} left out: an axis as long as the tokens the trace does not place"
        if unplaced
        else ""
    )
    action = (
        f"changing {tokens} at the padded position{'s' if len(positions) > 1 else ''} "
        f"{where} of example {e} ({how} padding: {mask.name} marks it {value}, as "
        f"{_applied_by(s)} reads it{left_out})"
    )
    hint = (
        "padded tokens still reach the real ones: the mask must reach every attention "
        "over these keys (cross-attention too), on the key axis, with padding hidden, "
        "before the softmax"
    )
    if dev <= s.rtol:
        return s.result(name, dev, action, "the real tokens' outputs", hint)
    from .padding_paths import not_promised, padding_paths

    paths = padding_paths(s, inputs, changed, compared, length, positions)
    if paths is not None and paths.elsewhere is not None:
        return inconclusive(name, not_promised(paths.elsewhere, dev), deviation=dev)
    through = paths.through_attention if paths is not None else None

    def point():
        if through is not None:
            return through.where
        return locate(s, inputs, changed, region_padding(length, positions))

    return s.result(name, dev, action, "the real tokens' outputs", hint, point)


def _placed_outputs(s: Subject, length: int) -> tuple[list, str]:
    """(the outputs key padding compares, the names of those it leaves out): an output
    with an axis as long as the padded tokens that the trace does not place may hold the
    padded rows there, which no property covers."""
    placed, names = [], []
    # A batch of one's outputs may have no batch axis (or one the trace does not show is
    # it): there is one example, compared whole.
    one = s.layout.batch_size == 1
    for leaf in s.outputs() if one else s.outputs(batch=True):
        out = s.refs[leaf.path]
        if any(out.shape[d] == length for d in leaf.unplaced):
            names.append(_output_name(leaf.path))
        else:
            placed.append(leaf)
    return placed, ", ".join(names)


def _output_name(path: tuple) -> str:
    """`logits`, `encoder_last_hidden_state`; `output[1]` for a tuple's item."""
    if path and isinstance(path[0], int):
        return "output" + "".join(f"[{p}]" for p in path)
    return _path(path)


def _pad_value(mask) -> str:
    """How a mask spells padding: -inf (additive), True / False (bool), 1 / 0."""
    if mask.dtype == "additive":
        return "-inf"
    hide = mask.polarity == "hide"
    if mask.dtype == "bool":
        return "True" if hide else "False"
    return "1" if hide else "0"


def _applied_by(s: Subject) -> str:
    ops = []
    for use in s.watch.mask_uses:
        if use.op not in ops:
            ops.append(use.op)
    return ", ".join(ops[:2]) if ops else "the module"


def _positions(positions: list[int]) -> str:
    if len(positions) > 2 and positions == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}..{positions[-1]}"
    return ", ".join(map(str, positions))


def token_permutation(s: Subject) -> ProbeResult:
    """Without masks or positions, permuting the tokens permutes the outputs alike."""
    name = "token-permutation equivariance"
    if s.causal:
        return not_applicable(name, f"the module is causal ({s.causal})")
    inside = _mask_made_inside(s)
    if inside:
        return not_applicable(name, f"the module applies a mask over the positions ({inside})")
    if s.watch.positional:
        return not_applicable(name, f"the module has positional terms ({s.watch.positional})")
    cannot = _queries(s, name)
    if cannot is not None:
        return cannot
    if s.layout.ambiguous:
        return inconclusive(name, s.layout.ambiguous)
    perms = {g: derangement(n, s.generator) for g, n in enumerate(s.layout.lengths) if n > 1}
    moved = permuted(s.layout, s.inputs, perms)
    got = s.run_all(moved, "the tokens permuted")
    leaves = s.outputs(group=0)
    expected = {}
    for leaf in leaves:
        t = s.refs[leaf.path]
        for d, g in leaf.seq.items():
            if g in perms:
                t = take(t, d, perms[g])
        expected[leaf.path] = t
    pads = {g: p[:, perms[g]] for g, p in s.layout.pads.items() if g in perms}
    dev = s.measure(got, expected, leaves, pads=pads)
    if dev > s.rtol:
        from .position_terms import position_term

        outcome, why = position_term(s, s.inputs, moved, perms[0])
        if outcome == "n/a":
            return not_applicable(name, why)
        if outcome:
            return inconclusive(name, why, deviation=dev)

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


def _mask_made_inside(s: Subject) -> str:
    """The op of a mask that hides more than padded keys, when no input mask over two
    token axes (moved with the tokens) accounts for it."""
    square = any(leaf.kind == "mask" and len(leaf.seq) >= 2 for leaf in s.layout.leaves.values())
    for use in s.watch.mask_uses:
        if use.extra and not square:
            return use.op
    if s.watch.masked and not s.watch.mask_uses:
        return s.watch.masked  # applied where its values could not be read
    return ""


def _path(path: tuple) -> str:
    return ".".join(map(str, path)) or "output"
