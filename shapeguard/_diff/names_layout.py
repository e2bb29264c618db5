"""Differences that move elements: a transpose, heads grouped the other way, a reversed,
rolled or shifted axis.

Bounded: at most 120 permutations (tensors of up to 5 axes; none tried beyond), two
regroupings, one flip per axis, and per axis every roll when it has at most MAX_ROLL_AXIS
positions (else the shifts ±1, ±2 and half its size) and two shifts by one. Each is one
comparison of the whole tensor.
"""

import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .fit import HEAD_DIM_AXES, Fit, axis_index, axis_word, matches, residual

MOST_PERMUTED_AXES = 5
MAX_ROLL_AXIS = 128


def layout_fits(
    ref: Any, port: Any, axes: Sequence[str | None], sizes: Mapping[str, int], tol: tuple
) -> list[Fit]:
    return [
        *_transposes(ref, port, axes, tol),
        *_groupings(ref, port, axes, sizes, tol),
        *_reversals(ref, port, axes, tol),
        *_rolls(ref, port, axes, tol),
        *_shifts(ref, port, axes, tol),
    ]


def _names(axes: Sequence[str | None], order: Sequence[int]) -> str:
    return "(" + ", ".join(axis_word(axes, i) for i in order) + ")"


def _transposes(ref, port, axes, tol) -> list[Fit]:
    if ref.dim() > MOST_PERMUTED_AXES or ref.dim() < 2:
        return []
    fits = []
    identity = tuple(range(ref.dim()))
    for order in itertools.permutations(identity):
        if order == identity or tuple(ref.shape[i] for i in order) != tuple(port.shape):
            continue
        moved = ref.permute(order)
        if not matches(moved, port, *tol):
            continue
        undo = tuple(order.index(i) for i in identity)
        swapped = [axis_word(axes, i) for i in identity if order[i] != i]
        fits.append(
            Fit(
                "transpose",
                f"port == ref.permute{order}: the port's axes are {_names(axes, order)} "
                f"where the reference's are {_names(axes, identity)} "
                f"(sizes {tuple(ref.shape)})",
                f"put {', '.join(swapped)} back in the reference's order on the port's line "
                f"(.permute{undo} of its result), or fix what swapped them: the operands of "
                "a product in the wrong order, or a transpose too many or too few",
                {"permute": order, "undo": undo},
                residual(moved, port),
                move=functools.partial(torch.permute, dims=order),
            )
        )
    return fits


def regroup(t, heads_at: int, dim_at: int, heads: int, head_dim: int, d_first: bool):
    """ref's (h d) features read back as (d h) (d_first) or the other way round."""
    x = t.movedim((heads_at, dim_at), (-2, -1))
    if d_first:
        flat = x.reshape(*x.shape[:-2], heads * head_dim)
        x = flat.reshape(*x.shape[:-2], head_dim, heads).transpose(-1, -2)
    else:
        flat = x.transpose(-1, -2).reshape(*x.shape[:-2], heads * head_dim)
        x = flat.reshape(*x.shape[:-2], heads, head_dim)
    return x.movedim((-2, -1), (heads_at, dim_at))


def _groupings(ref, port, axes, sizes, tol) -> list[Fit]:
    h_at, d_at = axis_index(axes, "heads"), axis_index(axes, *HEAD_DIM_AXES)
    if h_at is None or d_at is None or ref.shape != port.shape:
        return []
    heads, head_dim = ref.shape[h_at], ref.shape[d_at]
    if sizes.get("heads", heads) != heads or sizes.get("head_dim", head_dim) != head_dim:
        return []  # the sizes the models declare disagree with the named axes: no claim
    fits = []
    for d_first in (True, False):
        moved = regroup(ref, h_at, d_at, heads, head_dim, d_first)
        if not matches(moved, port, *tol):
            continue
        port_says, ref_says = ("(d h)", "(h d)") if d_first else ("(h d)", "(d h)")
        fix = (
            "x.view(B, T, heads, head_dim).transpose(1, 2), or einops 'b t (h d) -> b h t d'"
            if d_first
            else "x.view(B, T, head_dim, heads).permute(0, 3, 1, 2), or einops "
            "'b t (d h) -> b h t d'"
        )
        fits.append(
            Fit(
                "head_grouping",
                f"the port's heads are grouped {port_says} where the reference's are "
                f"{ref_says}: heads {heads}, head_dim {head_dim} over {heads * head_dim} features",
                f"split the port's heads as {ref_says}, as the reference does: {fix}",
                {"port": port_says, "ref": ref_says, "heads": heads, "head_dim": head_dim},
                residual(moved, port),
                move=functools.partial(
                    regroup,
                    heads_at=h_at,
                    dim_at=d_at,
                    heads=heads,
                    head_dim=head_dim,
                    d_first=d_first,
                ),
            )
        )
    return fits


def _reversals(ref, port, axes, tol) -> list[Fit]:
    if ref.shape != port.shape:
        return []
    fits = []
    for i, n in enumerate(ref.shape):
        if n < 2 or not matches(ref.flip(i), port, *tol):
            continue
        name = axis_word(axes, i)
        fits.append(
            Fit(
                "reverse",
                f"port == ref reversed along {name} ({n}): port[{name}=t] == ref[{name}={n - 1}-t]",
                f"remove the reversal of {name} on the port's line (a flip or a reversed "
                f"index), or reverse it back where the reversed part ends (.flip({i}))",
                {"axis": i, "undo": ("flip", i)},
                residual(ref.flip(i), port),
                move=functools.partial(torch.flip, dims=(i,)),
            )
        )
    return fits


def _roll_shifts(n: int) -> list[int]:
    if n <= MAX_ROLL_AXIS:
        return list(range(1, n))
    return sorted({1, 2, n // 2, n - 2, n - 1})


def _rolls(ref, port, axes, tol) -> list[Fit]:
    if ref.shape != port.shape:
        return []
    fits = []
    for i, n in enumerate(ref.shape):
        for shift in _roll_shifts(n):
            moved = torch.roll(ref, shift, dims=i)
            if not matches(moved, port, *tol):
                continue
            name, signed = axis_word(axes, i), shift if shift <= n // 2 else shift - n
            fits.append(
                Fit(
                    "roll",
                    f"port == ref rolled by {signed} along {name} ({n}): "
                    f"port[{name}=t] == ref[{name}=(t - {signed}) mod {n}]",
                    f"a roll of {name} by {signed} without its un-roll: roll back where the "
                    f"rolled part ends (torch.roll(x, {-signed}, dims={i})), or remove the roll",
                    {"axis": i, "shift": signed, "undo": ("roll", -signed, i)},
                    residual(moved, port),
                    move=functools.partial(torch.roll, shifts=shift, dims=i),
                )
            )
    return fits


def _shifts(ref, port, axes, tol) -> list[Fit]:
    """A shift by one: port[t] == ref[t + 1] (or t - 1) where both exist, which the same
    positions unshifted do not explain and a roll (checked apart) does not either."""
    if ref.shape != port.shape:
        return []
    fits = []
    for i, n in enumerate(ref.shape):
        if n < 3:
            continue
        for step in (1, -1):
            ahead = ref.narrow(i, 1, n - 1) if step == 1 else ref.narrow(i, 0, n - 1)
            at = port.narrow(i, 0, n - 1) if step == 1 else port.narrow(i, 1, n - 1)
            unshifted = ref.narrow(i, 0, n - 1) if step == 1 else ref.narrow(i, 1, n - 1)
            rolled = torch.roll(ref, -step, dims=i)
            if (
                not matches(ahead, at, *tol)
                or matches(unshifted, at, *tol)
                or matches(rolled, port, *tol)
            ):
                continue
            name = axis_word(axes, i)
            sign = "+" if step == 1 else "-"
            fix = (
                "start its positions at 0 (arange(T), not arange(1, T + 1)) or its slice "
                "at 0 (table[:T], not table[1 : T + 1])"
                if step == 1
                else "drop the position it puts before the first (a pad or cat in front, or "
                "positions starting at -1)"
            )
            fits.append(
                Fit(
                    "shift",
                    f"port[{name}=t] == ref[{name}=t {sign} 1] for the {n - 1} positions both "
                    f"have ({name} {n}): the port is one position "
                    f"{'ahead of' if step == 1 else 'behind'} the reference",
                    f"the port's {name} is off by one: {fix}",
                    {"axis": i, "shift": step},
                    residual(ahead, at),
                )
            )
    return fits
