"""The model-level reach: which input tokens move which outputs, measured on the subject.

By autograd where the input path is differentiable: the output of the embedding that
turns the token ids into vectors (or the floating data input itself) is made a leaf
that requires grad, and a backward pass per sampled output row (example, position), of
the row against fixed random weights, gives that row's gradient with respect to every
(example, position) of the inputs at once, so that dependence across examples shows
too. The rows' passes run batched (`is_grads_batched`, vmap) where every op has a
batching rule, else one after another. Random weights, not the row's sum: a LayerNorm's outputs sum to a constant.
Elsewhere by perturbation: one run per input (example, position), its ids or data
redrawn there, compared with the reference run.

Bounded cost: at most `MAX_EXAMPLES` examples and `MAX_ROWS` output rows in all (the
positions sampled per example as `_reach.rows.sampled_queries` samples queries: the
first and last ones and evenly spaced between), so at most `MAX_ROWS` backward passes
after one forward (batched: `BATCHED_CELLS` seeded output values per pass at most); perturbation only where the inputs have at most `MAX_RUNS`
(example, position) cells. What is kept is a float `[examples, rows, batch, length]`
of strengths, at most `MAX_ROWS x batch x length` values, dropped once the reach is read.

The subject's model is never changed: the hooks are removed, its parameters'
requires_grad flags are left alone (gradients are taken with respect to the embedding's
output only), its mode stays eval, and every forward starts from the subject's pinned
RNG state (`runs.Pin`).
"""

from dataclasses import dataclass

import torch

from .._reach.rows import sampled_queries
from .compare import scale_of
from .edits import perturbed
from .runs import call
from .subject import Subject
from .tree import first_output, pick, rebuild

MAX_EXAMPLES = 8
MAX_ROWS = 64  # output rows measured in all (one backward each)
MIN_ROWS = 4  # output rows per example, at the least
MAX_RUNS = 256  # perturbation runs (one per input cell) at the most
# Output values seeded per batched backward pass: [rows, *output] seeds, 32 MiB in float64.
BATCHED_CELLS = 1 << 22


@dataclass(slots=True)
class Measured:
    """What moves what: `strength[i, j, b, s]` is how much output row j (position
    `positions[j]`, or the one row when the output keeps no positions) of example
    `examples[i]` moves with input (b, s), 0 where it does not move at all."""

    strength: torch.Tensor
    examples: tuple[int, ...]
    positions: tuple[int, ...] | None  # the output positions measured (None: no positions)
    out_length: int  # the output's positions (1 when it keeps none)
    how: str  # "autograd through embed_tokens (Embedding)", "perturbation of x", ...
    # A strength at or below floor (times the row's largest, for gradients; a change of
    # the output's scale, for perturbation: `absolute`) is no dependence.
    floor: float
    absolute: bool = False

    def moved(self) -> torch.Tensor:
        """bool [examples, rows, batch, length]: which inputs move which output rows."""
        if self.absolute:
            return self.strength > self.floor
        top = self.strength.amax(dim=(-2, -1), keepdim=True)
        return (self.strength > self.floor * top) & (self.strength > 0)


def measure(s: Subject) -> Measured | str:
    """The subject's reach, or why it cannot be measured."""
    layout = s.layout
    length = layout.lengths[0]
    batch = layout.batch_size or 1
    if s.out_batch is None and batch != 1:
        return "the first output has no batch axis whose examples the trace places"
    out_length = s.reference.shape[s.out_seq] if s.out_seq is not None else 1
    examples = tuple(range(min(batch, MAX_EXAMPLES)))
    per = max(MIN_ROWS, MAX_ROWS // len(examples))
    positions = None
    if s.out_seq is not None:
        kept = sampled_queries(out_length, per)
        positions = kept if kept is not None else tuple(range(out_length))
    floor = s.rtol / 100
    grads = _by_autograd(s, examples, positions)
    if isinstance(grads, tuple):
        strength, how = grads
        if bool(torch.isfinite(strength).all()):
            return Measured(strength, examples, positions, out_length, how, floor)
        # 0 * NaN: a row that sees no key (a padded query) is NaN, and its softmax's
        # backward spreads NaN to every key's gradient, dependent or not.
        grads = "its gradients are not finite"
    if batch * length > MAX_RUNS:
        return (
            f"{grads}, and perturbing the {batch * length} input cells one by one is past "
            f"the bound of {MAX_RUNS} runs"
        )
    strength = _by_perturbation(s, examples, positions, batch, length)
    how = f"perturbation of {token_inputs(s)}, one run per input cell ({grads})"
    return Measured(strength, examples, positions, out_length, how, s.rtol, absolute=True)


# -- autograd ---------------------------------------------------------------------------
def _by_autograd(s: Subject, examples, positions) -> tuple[torch.Tensor, str] | str:
    """(strengths, how) by one forward and one backward per output row; or why not."""
    layout = s.layout
    data = [
        leaf
        for leaf in layout.leaves_of("data")
        if leaf.batch is not None and 0 in leaf.seq.values()
    ]
    ids = [
        leaf
        for leaf in layout.leaves_of("ids")
        if leaf.batch is not None and 0 in leaf.seq.values()
    ]
    if not data and not ids:
        return "no token ids or data input with a batch and a token axis"
    made: dict[int, torch.Tensor] = {}  # id of a data input -> its leaf that requires grad
    axes: list[tuple[torch.Tensor, int, int]] = []  # (leaf, batch axis, token axis)

    def grad_leaf(path, t):
        leaf = next((d for d in data if d is layout.leaves.get(path)), None)
        if leaf is None or leaf.batch is None or not t.is_floating_point():
            return t
        if id(t) not in made:  # the same tensor passed twice (q, k, v) stays one tensor
            made[id(t)] = t.detach().clone().requires_grad_(True)
            seq = next(d for d, g in leaf.seq.items() if g == 0)
            axes.append((made[id(t)], leaf.batch, seq))
        return made[id(t)]

    inputs = rebuild(s.inputs, grad_leaf)
    hooks, hooked = _hook_embeddings(s, ids, axes)
    try:
        with torch.enable_grad():
            out = first_output(call(s.model, inputs, "the reach measured by autograd"))
            if out is None or not axes or not out.requires_grad:
                return _why_not(ids, hooked, axes)
            strength = _backward(s, out, examples, positions, axes)
    finally:
        for handle in hooks:
            handle.remove()
    what = " and ".join(hooked) if hooked else token_inputs(s)
    return strength, f"autograd through {what}"


def _hook_embeddings(s: Subject, ids, axes) -> tuple[list, list[str]]:
    """Forward hooks on every nn.Embedding that reads the token ids: each output is
    replaced by a leaf that requires grad (the same values), recorded in `axes`."""
    tensors = [(pick(s.inputs, leaf.path), leaf) for leaf in ids]
    hooks, hooked = [], []
    for name, module in s.model.named_modules():
        if not isinstance(module, torch.nn.Embedding):
            continue

        def hook(module, args, out, name=name):
            given = args[0] if args else None
            for t, leaf in tensors:
                if _same(given, t) and out.dim() == t.dim() + 1:
                    x = out.detach().requires_grad_(True)
                    seq = next(d for d, g in leaf.seq.items() if g == 0)
                    axes.append((x, leaf.batch, seq))
                    label = f"{name} ({type(module).__name__})" if name else "the embedding"
                    if label not in hooked:
                        hooked.append(label)
                    return x
            return None

        hooks.append(module.register_forward_hook(hook))
    return hooks, hooked


def _same(given, t) -> bool:
    if not isinstance(given, torch.Tensor) or not isinstance(t, torch.Tensor):
        return False
    return given is t or (given.shape == t.shape and bool(torch.equal(given, t)))


def _why_not(ids, hooked, axes) -> str:
    if ids and not hooked and not axes:
        return "no nn.Embedding reads the token ids"
    return "the output does not depend differentiably on the inputs"


def _backward(s: Subject, out, examples, positions, axes) -> torch.Tensor:
    """Strengths [examples, rows, batch, length]: each output row's gradient against
    fixed random weights, with respect to every input cell (`axes`)."""
    rows = [(b, q) for b in examples for q in (positions if positions is not None else (None,))]
    weights = torch.randn(
        output_row(s, out, *rows[0]).shape, generator=s.generator, dtype=torch.float64
    ).to(out.dtype)
    try:
        flat = _batched(s, out, rows, weights, axes)
    except Exception:  # an op without a batching rule (vmap): one backward per row
        flat = _looped(s, out, rows, weights, axes)
    return flat.view(len(examples), len(rows) // len(examples), *flat.shape[1:])


def _batched(s: Subject, out, rows, weights, axes) -> torch.Tensor:
    """The rows' gradients by batched backward passes (`is_grads_batched`), in chunks of
    at most `BATCHED_CELLS` output values."""
    import warnings

    xs = [x for x, _, _ in axes]
    chunk = max(1, BATCHED_CELLS // max(out.numel(), 1))
    parts = []
    for start in range(0, len(rows), chunk):
        some = rows[start : start + chunk]
        seeds = torch.zeros(len(some), *out.shape, dtype=out.dtype, device=out.device)
        for k, (b, q) in enumerate(some):
            output_row(s, seeds[k], b, q).copy_(weights)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # vmap's note on a slower fallback
            grads = torch.autograd.grad(
                out, xs, seeds, retain_graph=True, allow_unused=True, is_grads_batched=True
            )
        part = torch.zeros(len(some), s.layout.batch_size or 1, s.layout.lengths[0])
        part = part.double()
        for g, (_, b_axis, s_axis) in zip(grads, axes, strict=True):
            if g is not None:
                for k in range(len(some)):
                    part[k] += _per_cell(g[k], b_axis, s_axis)
        parts.append(part)
    return torch.cat(parts)


def _looped(s: Subject, out, rows, weights, axes) -> torch.Tensor:
    xs = [x for x, _, _ in axes]
    strength = torch.zeros(len(rows), s.layout.batch_size or 1, s.layout.lengths[0])
    strength = strength.double()
    for k, (b, q) in enumerate(rows):
        scalar = (output_row(s, out, b, q) * weights).sum()
        grads = torch.autograd.grad(scalar, xs, retain_graph=True, allow_unused=True)
        for g, (_, b_axis, s_axis) in zip(grads, axes, strict=True):
            if g is not None:
                strength[k] += _per_cell(g, b_axis, s_axis)
    return strength


def output_row(s: Subject, out, b: int, q: int | None):
    """Output row (example b, position q) of `out`; q None: the example's whole output."""
    index: list = [slice(None)] * out.dim()
    if s.out_batch is not None:
        index[s.out_batch] = b
    if q is not None and s.out_seq is not None:
        index[s.out_seq] = q
    return out[tuple(index)]


def _per_cell(g: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """|g| summed over every axis but the batch and token axes: float64 [batch, length]."""
    g = g.detach().abs().double().movedim((batch, seq), (0, 1))
    return g.reshape(g.shape[0], g.shape[1], -1).sum(-1).cpu()


# -- perturbation -----------------------------------------------------------------------
def _by_perturbation(s: Subject, examples, positions, batch: int, length: int) -> torch.Tensor:
    """Strengths by one run per input cell: the largest change of each output row."""
    rows = positions if positions is not None else (None,)
    strength = torch.zeros(len(examples), len(rows), batch, length, dtype=torch.float64)
    reference = s.reference
    scale = scale_of(reference)
    for b_in in range(batch):
        for p in range(length):
            cells = torch.zeros(batch, length, dtype=torch.bool)
            cells[b_in, p] = True
            changed = perturbed(s.layout, s.inputs, s.generator, group=0, cells=cells)
            got = s.run(changed, f"input {p} of example {b_in} changed")
            for i, b in enumerate(examples):
                for j, q in enumerate(rows):
                    gap = (output_row(s, got, b, q) - output_row(s, reference, b, q)).abs()
                    strength[i, j, b_in, p] = float(gap.max()) / scale if gap.numel() else 0.0
    return strength


def token_inputs(s: Subject) -> str:
    """The names of the ids and data inputs of the measured tokens (group 0)."""
    names = [
        leaf.name
        for leaf in s.layout.leaves_of("ids", "data")
        if leaf.batch is not None and 0 in leaf.seq.values()
    ]
    return ", ".join(names) or "the inputs"
