"""Heatmap pictures as PNG data URIs: a tiny encoder and a perceptual color scale.

Standard library only (zlib, struct, base64), so the HTML report embeds each
heatmap as an image with no JavaScript and no network, and it prints as is.
"""

import base64
import struct
import zlib
from typing import cast

# Anchor colors of viridis (dark blue, low -> yellow, high), linearly interpolated.
_VIRIDIS = (
    (68, 1, 84),
    (72, 40, 120),
    (62, 74, 137),
    (49, 104, 142),
    (38, 130, 142),
    (31, 158, 137),
    (53, 183, 121),
    (109, 205, 89),
    (180, 222, 44),
    (253, 231, 37),
)


def color(value: float) -> tuple[int, int, int]:
    """The viridis color of `value` in [0, 1] (clamped).

    >>> color(0.0), color(1.0)
    ((68, 1, 84), (253, 231, 37))
    """
    value = min(1.0, max(0.0, value))
    position = value * (len(_VIRIDIS) - 1)
    low = min(int(position), len(_VIRIDIS) - 2)
    t = position - low
    a, b = _VIRIDIS[low], _VIRIDIS[low + 1]
    # Three channels: zip of two RGB triples.
    return cast(
        tuple[int, int, int], tuple(round(x + (y - x) * t) for x, y in zip(a, b, strict=True))
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def encode_png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of `pixels` (rows of (r, g, b))."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if not height or not width:
        raise ValueError("a PNG needs at least one pixel")
    raw = b"".join(b"\x00" + bytes(c for pixel in row for c in pixel) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def heatmap_uri(matrix: list[list[float]], vmax: float) -> str:
    """A `data:image/png;base64,...` URI of `matrix`, colored by sqrt(value / vmax).

    The square root spreads the small weights of long rows (about 1/seq each)
    over the scale instead of leaving them all at the dark end.
    """
    scale = 1.0 / vmax if vmax > 0 else 0.0
    pixels = [[color(max(0.0, v * scale) ** 0.5) for v in row] for row in matrix]
    return "data:image/png;base64," + base64.b64encode(encode_png(pixels)).decode("ascii")
