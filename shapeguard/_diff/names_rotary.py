"""Rotary pairs interleaved (GPT-J: dims 2i, 2i+1) in one side and half-split (NeoX: dims i,
i + head_dim/2) in the other.

The rotation is not guessed: from the upstream pair (the same tensor before rotary, which
agreed) and the reference's output, the rotation per position and frequency is fitted
under each pairing, one complex least-squares ratio averaged over every axis but seq and
head_dim (so it is evidence, not a free parameter per element); the pairing that
reproduces the reference is the reference's, and the same rotations applied with the other
pairing must give the port's tensor. With the same fitted rotation, differences made before
rotary are named after it: the rotation for the next position (a shift), heads split
(d h), a projection's bias. Bounded: two fits per upstream tensor of the pair's shape or of
its projection's (at most MOST_UPSTREAM of them, and as many reference-only tensors), each
followed by at most five comparisons.
"""

from collections.abc import Sequence
from typing import Any

import torch

from .fit import HEAD_DIM_AXES, SEQ_AXES, Fit, axis_index, axis_word, matches, residual
from .names_layout import regroup

MOST_UPSTREAM = 4
PAIRINGS = {
    "half-split": "NeoX: dims i and i + head_dim/2",
    "interleaved": "GPT-J: dims 2i and 2i + 1",
}


def _complex(x, pairing: str):
    half = x.shape[-1] // 2
    if pairing == "half-split":
        return torch.complex(x[..., :half], x[..., half:])
    return torch.complex(x[..., 0::2], x[..., 1::2])


def _real(z, pairing: str):
    if pairing == "half-split":
        return torch.cat((z.real, z.imag), -1)
    return torch.stack((z.real, z.imag), -1).flatten(-2)


def _rotation(before, after, pairing: str, shared: tuple[int, ...]):
    """The rotation per (seq, frequency) that takes `before` to `after` under `pairing`."""
    z, w = _complex(before, pairing), _complex(after, pairing)
    num = (w * z.conj()).sum(dim=shared, keepdim=True)
    den = (z.abs() ** 2).sum(dim=shared, keepdim=True)
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def _befores(ref, upstream, seq_at: int, heads_at: int | None):
    """(the tensor before rotary in ref's layout, its heads axis) from each upstream
    reference tensor: one of ref's shape, or a projection's (batch, seq, heads * head_dim)
    output split as (h d) (a layout the reference's fit then confirms or refutes, never
    assumed)."""
    found = []
    for u in upstream:
        if tuple(u.shape) == tuple(ref.shape):
            found.append((u.double(), heads_at))
        elif ref.dim() == 4 and seq_at == 2 and u.dim() == 3:
            B, H, T, D = ref.shape
            if tuple(u.shape) == (B, T, H * D):
                found.append((u.double().reshape(B, T, H, D).transpose(1, 2), 1))
    return found[:MOST_UPSTREAM]


def _rotate(before, turn, pairing: str):
    return _real(_complex(before, pairing) * turn, pairing)


def rotary_fits(
    ref: Any, port: Any, axes: Sequence[str | None], upstream, tol: tuple, ref_before=()
) -> list[Fit]:
    """`upstream`: the agreeing pairs before (their reference side is read); `ref_before`:
    reference tensors the port has no counterpart of (its projection's module never ran),
    as good a "before" on the reference's side, since the fit must reproduce the reference."""
    seq_at = axis_index(axes, *SEQ_AXES)
    dim_at = axis_index(axes, *HEAD_DIM_AXES)
    if seq_at is None or dim_at != ref.dim() - 1 or ref.shape != port.shape:
        return []
    head_dim = ref.shape[-1]
    if head_dim % 2 or head_dim < 4:
        return []
    shared = tuple(i for i in range(ref.dim() - 1) if i != seq_at)
    fits = []
    heads_at = axis_index(axes, "heads")
    befores = [
        *_befores(ref, [pair.ref for pair in upstream], seq_at, heads_at),
        *_befores(ref, ref_before, seq_at, heads_at),
    ]
    for before, heads_at in befores:
        for pairing, other in (("half-split", "interleaved"), ("interleaved", "half-split")):
            turn = _rotation(before, ref.double(), pairing, shared)
            if not matches(_rotate(before, turn, pairing), ref, *tol):
                continue
            fits += _pairing_fits(before, turn, pairing, other, port, head_dim, tol)
            fits += _position_fits(before, turn, pairing, port, axes, seq_at, tol)
            if heads_at is not None:
                fits += _grouping_fits(before, turn, pairing, port, heads_at, tol)
            fits += _bias_fits(before, turn, pairing, port, axes, seq_at, heads_at, tol)
    return fits


def _pairing_fits(before, turn, pairing, other, port, head_dim, tol) -> list[Fit]:
    predicted = _rotate(before, turn, other)
    if not matches(predicted, port, *tol):
        return []
    return [
        Fit(
            "rotary_pairing",
            f"the port pairs rotary dims {other} ({PAIRINGS[other]}) "
            f"where the reference pairs them {pairing} ({PAIRINGS[pairing]}), "
            f"head_dim {head_dim}, the same rotation per position and frequency",
            f"rotate the port's pairs {pairing} as the reference does"
            + (
                ": x1, x2 = x.chunk(2, -1); x * cos + cat((-x2, x1), -1) * sin"
                if pairing == "half-split"
                else ": x1, x2 = x[..., ::2], x[..., 1::2]; stack((x1 * cos - x2 * "
                "sin, x1 * sin + x2 * cos), -1).flatten(-2)"
            )
            + ", or permute the checkpoint's q and k rows to the port's pairing",
            {"port": other, "ref": pairing, "head_dim": head_dim},
            residual(predicted, port),
        )
    ]


def _position_fits(before, turn, pairing, port, axes, seq_at, tol) -> list[Fit]:
    """The port rotates position t by the reference's angle for t + 1 (or t - 1)."""
    n = before.shape[seq_at]
    if n < 3:
        return []
    fits = []
    for step in (1, -1):
        lo, hi = (0, 1) if step == 1 else (1, 0)
        x = before.narrow(seq_at, lo, n - 1)
        predicted = _rotate(x, turn.narrow(seq_at, hi, n - 1), pairing)
        at = port.narrow(seq_at, lo, n - 1)
        unshifted = _rotate(x, turn.narrow(seq_at, lo, n - 1), pairing)
        if not matches(predicted, at, *tol) or matches(unshifted, at, *tol):
            continue
        name = axis_word(axes, seq_at)
        sign = "+" if step == 1 else "-"
        fits.append(
            Fit(
                "shift",
                f"the port rotates {name}=t by the reference's rotary angle for t {sign} 1 "
                f"(the {n - 1} positions both have, {name} {n}): its rotary positions are "
                f"one {'ahead' if step == 1 else 'behind'}",
                "the port's rotary positions are off by one: start them at 0 (arange(T), "
                "not arange(1, T + 1)) or its cos/sin table's slice at 0 (table[:T], not "
                "table[1 : T + 1])"
                if step == 1
                else "the port's rotary positions are off by one: start them at 0, not -1",
                {"axis": seq_at, "shift": step, "at": "rotary"},
                residual(predicted, at),
            )
        )
    return fits


def _grouping_fits(before, turn, pairing, port, heads_at, tol) -> list[Fit]:
    """The port split its heads (d h) before rotating them as the reference does."""
    heads, head_dim = before.shape[heads_at], before.shape[-1]
    moved = regroup(before, heads_at, before.dim() - 1, heads, head_dim, True)
    predicted = _rotate(moved, turn, pairing)
    if not matches(predicted, port, *tol):
        return []
    return [
        Fit(
            "head_grouping",
            f"the port's heads are grouped (d h) where the reference's are (h d): heads "
            f"{heads}, head_dim {head_dim} over {heads * head_dim} features (seen after rotary)",
            "split the port's heads as (h d), as the reference does: "
            "x.view(B, T, heads, head_dim).transpose(1, 2), or einops 'b t (h d) -> b h t d'",
            {"port": "(d h)", "ref": "(h d)", "heads": heads, "head_dim": head_dim},
            residual(predicted, port),
        )
    ]


def _bias_fits(before, turn, pairing, port, axes, seq_at, heads_at, tol) -> list[Fit]:
    """The port's tensor before rotary (the reference's rotation undone) is the reference's
    plus a per-feature offset the same at every position and batch row: a bias."""
    if not bool((turn.abs() > 0.5).all()):
        return []  # not a rotation: nothing to undo
    unrotated = _rotate(port.double(), 1 / turn, pairing)
    delta = unrotated - before
    kept = tuple(i for i in range(before.dim()) if i not in (seq_at, 0))  # heads, head_dim
    if heads_at is None or kept != (heads_at, before.dim() - 1):
        return []
    b = delta.mean(dim=(0, seq_at), keepdim=True)
    if float(b.abs().max()) == 0.0 or not matches(_rotate(before + b, turn, pairing), port, *tol):
        return []
    heads, head_dim = before.shape[heads_at], before.shape[-1]
    return [
        Fit(
            "bias",
            f"port == rotary(x + b) where ref == rotary(x), b a vector over heads x head_dim "
            f"({heads} x {head_dim} = {heads * head_dim} features) the same at every "
            f"{axis_word(axes, 0)} and {axis_word(axes, seq_at)} (largest |b| {float(b.abs().max()):.3g}): a bias one side adds "
            "to the projection and the other does not",
            "the port's projection drops the reference's bias (nn.Linear(..., bias=False), "
            "or F.linear without its bias), or adds one the reference lacks: match its bias",
            {"largest": float(b.abs().max()), "at": "before rotary"},
            residual(_rotate(before + b, turn, pairing), port),
        )
    ]
