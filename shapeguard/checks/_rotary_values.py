"""Whether a table's values are rotary positions along an axis: read, never guessed.

A rotary table made before the trace opened (a buffer built in `__init__` from
`arange(max_len)`) carries no provenance, and one cut by a size read from the heads axis
(`cache[:x.size(1)]`) even takes the heads' identity. Its values still say what its rows
are: row r of a cos table is cos(r * theta) per frequency, of a complex one
exp(i * r * theta), so row 0 is the identity rotation and every row one more step of the
same rotation. Such an axis holds positions 0, 1, 2, ... whatever it was lined up with.

Only small plain CPU tensors are read (`_mask_effects.readable`); at least three rows, and
a frequency that turns, so a table of ones (a gate, a layer scale) is never a rotation.
Rows that start at another position (a cached step's offset) are not claimed.
"""

from ._mask_effects import readable

_ROWS = 3  # row 0, a step, and a second step that must repeat it
_TOLERANCE = 1e-3  # float32 cos of r * theta at a few hundred positions stays well inside
# The smallest angle per row that counts as a rotation (radians): RoPE's fastest frequency
# turns 1 rad a position (a long-context scaling divides it by tens at most), while a decay
# near 1 (a linear attention's per-head gates) passes the cos recurrence within tolerance
# only while it turns less than this.
_TURNS = 5e-2


def positions_axis(table, axis: int) -> bool:
    """Whether `table`'s values along `axis` are rotary positions 0, 1, 2, ...: a cos table
    (row 0 all ones, each row the next step of one rotation per frequency) or a complex one
    (row 0 all 1 + 0i, each row the row before times row 1)."""
    if not readable(table) or table.dim() < 2 or table.shape[axis] < _ROWS:
        return False
    import torch

    rows = table.detach().movedim(axis, 0).reshape(table.shape[axis], -1)
    if rows.is_complex():
        return _complex_rows(rows.to(torch.complex128))
    if not rows.is_floating_point():
        return False
    return _cos_rows(rows.to(torch.float64))


def _cos_rows(rows) -> bool:
    """cos(r * theta): row 0 all ones, and rows r - 1, r, r + 1 obey the recurrence every
    sinusoid of one frequency obeys, c[r + 1] = 2 cos(theta) c[r] - c[r - 1]."""
    if not bool((rows[0] - 1).abs().max() < _TOLERANCE):
        return False
    if bool(rows.abs().max() > 1 + _TOLERANCE):
        return False
    step = rows[1]
    if not bool((step < 1 - _TURNS**2 / 2).any()):
        return False  # no frequency turns: ones, not a rotation
    predicted = 2 * step * rows[1:-1] - rows[:-2]
    return bool((predicted - rows[2:]).abs().max() < _TOLERANCE)


def _complex_rows(rows) -> bool:
    """exp(i r theta): row 0 all 1, unit magnitudes, row r + 1 = row r * row 1."""
    if not bool((rows[0] - 1).abs().max() < _TOLERANCE):
        return False
    if not bool((rows.abs() - 1).abs().max() < _TOLERANCE):
        return False
    step = rows[1]
    if not bool((step.angle().abs() > _TURNS).any()):
        return False
    return bool((rows[:-1] * step - rows[1:]).abs().max() < _TOLERANCE)
