"""Rotary pairs interleaved (GPT-J: dims 2i, 2i+1) in one side and half-split (NeoX: dims i,
i + head_dim/2) in the other.

The rotation is not guessed: from the upstream pair (the same tensor before rotary, which
agreed) and the reference's output, the rotation per position and frequency is fitted
under each pairing, one complex least-squares ratio averaged over every axis but seq and
head_dim (so it is evidence, not a free parameter per element); the pairing that
reproduces the reference is the reference's, and the same rotations applied with the other
pairing must give the port's tensor. Bounded: two fits and one comparison per upstream
pair of the same shape (at most MOST_UPSTREAM of them).
"""

from collections.abc import Sequence
from typing import Any

import torch

from .fit import HEAD_DIM_AXES, SEQ_AXES, Fit, axis_index, matches, residual

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


def rotary_fits(ref: Any, port: Any, axes: Sequence[str | None], upstream, tol: tuple) -> list[Fit]:
    seq_at = axis_index(axes, *SEQ_AXES)
    dim_at = axis_index(axes, *HEAD_DIM_AXES)
    if seq_at is None or dim_at != ref.dim() - 1 or ref.shape != port.shape:
        return []
    head_dim = ref.shape[-1]
    if head_dim % 2 or head_dim < 4:
        return []
    shared = tuple(i for i in range(ref.dim() - 1) if i != seq_at)
    fits = []
    for pair in [p for p in upstream if tuple(p.ref.shape) == tuple(ref.shape)][:MOST_UPSTREAM]:
        before = pair.ref.double()
        for ref_pairing, port_pairing in (
            ("half-split", "interleaved"),
            ("interleaved", "half-split"),
        ):
            turn = _rotation(before, ref.double(), ref_pairing, shared)
            if not matches(_real(_complex(before, ref_pairing) * turn, ref_pairing), ref, *tol):
                continue
            predicted = _real(_complex(before, port_pairing) * turn, port_pairing)
            if not matches(predicted, port, *tol):
                continue
            fits.append(
                Fit(
                    "rotary_pairing",
                    f"the port pairs rotary dims {port_pairing} ({PAIRINGS[port_pairing]}) "
                    f"where the reference pairs them {ref_pairing} ({PAIRINGS[ref_pairing]}), "
                    f"head_dim {head_dim}, the same rotation per position and frequency",
                    f"rotate the port's pairs {ref_pairing} as the reference does"
                    + (
                        ": x1, x2 = x.chunk(2, -1); x * cos + cat((-x2, x1), -1) * sin"
                        if ref_pairing == "half-split"
                        else ": x1, x2 = x[..., ::2], x[..., 1::2]; stack((x1 * cos - x2 * "
                        "sin, x1 * sin + x2 * cos), -1).flatten(-2)"
                    )
                    + ", or permute the checkpoint's q and k rows to the port's pairing",
                    {"port": port_pairing, "ref": ref_pairing, "head_dim": head_dim},
                    residual(predicted, port),
                )
            )
    return fits
