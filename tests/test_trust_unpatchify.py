"""An image transformer's unpatchify is a layout, whichever way the permute is written
(issue 32, the world corpus' DiT and SD3 blocks).

diffusers' DiT and SD3 end with `reshape(n, h, w, p, q, c)`, `einsum("nhwpqc->nchpwq")`,
`reshape(n, c, h * p, w * q)`: each patch's pixels (features of its token) become positions
of the image. The einsum is a permute written with subscripts, so the merge after it is laid
out as deliberately as one after `permute`; the same unpatchify without its permute, which
puts pixels of one patch into rows of another, is still found. Three size settings: pairwise
distinct, coincident (batch == heads == tokens == d_k) and realistic.
"""

import math
import warnings

import pytest
import torch
from einops import rearrange
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard

SIZES = {
    "distinct": (2, 3, 5, 11),  # batch, heads, tokens, d_k
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
sizes = pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
PATCH, CHANNELS = 2, 3


def _grid(tokens):
    rows = max(r for r in range(1, math.isqrt(tokens) + 1) if tokens % r == 0)
    return rows, tokens // rows


class Unpatchify(nn.Module):
    """Self-attention over the patch tokens, a projection to each patch's pixels, and the
    tokens put back as an image ([n, h * w, p * q * c] -> [n, c, h * p, w * q])."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.attn = nn.MultiheadAttention(heads * d_k, heads, batch_first=True)
        self.proj_out = nn.Linear(heads * d_k, PATCH * PATCH * CHANNELS)
        self.style = style

    def forward(self, x, rows, cols):
        x = self.attn(x, x, x, need_weights=False)[0]
        x = self.proj_out(x)
        p, c = PATCH, CHANNELS
        if self.style == "einops":
            return rearrange(x, "n (h w) (p q c) -> n c (h p) (w q)", h=rows, p=p, q=p)
        x = x.reshape(-1, rows, cols, p, p, c)
        if self.style == "einsum":  # diffusers' DiT and SD3
            x = torch.einsum("nhwpqc->nchpwq", x)
        elif self.style == "permute":
            x = x.permute(0, 5, 1, 3, 2, 4)
        return x.reshape(-1, c, rows * p, cols * p)


def _findings(size, style):
    batch, heads, tokens, d_k = size
    torch.manual_seed(0)
    model = Unpatchify(heads, d_k, style).eval()
    x = torch.randn(batch, tokens, heads * d_k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model, x, *_grid(tokens), mode="warn")
    assert not trace.internal_errors, trace.internal_errors
    return trace.findings


@sizes
@pytest.mark.parametrize("style", ["einsum", "permute", "einops"])
def test_an_unpatchify_with_its_permute_is_silent(size, style):
    found = _findings(size, style)
    assert found == [], [f.message for f in found]


@sizes
def test_an_unpatchify_without_its_permute_is_still_found(size):
    """The same reshapes with no permute between them: pixels of one patch land in rows of
    another (the finding names the axes it regroups, where, and the source line)."""
    found = _findings(size, "none")
    assert found and {f.kind for f in found} == {"view_mixes_axes"}, [f.message for f in found]
    message = found[0].message
    first = message.splitlines()[0]
    assert first.startswith(f"x.reshape(-1, {CHANNELS}, ") and ": regroups [" in first, first
    assert "x.reshape(-1, c, rows * p, cols * p)" in message, message
