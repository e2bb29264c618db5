"""Rotary embeddings applied after the heads transpose (issue 32), in four spellings of the
field, three with tables built before the trace opens; and the correct rotaries beside them.

Code written for `[B, T, H, D]` reads `T = x.size(1)`; on `[B, H, T, D]` that is the heads,
so the table is cut to the head count and its positions meet the heads: each head gets one
rotation for all its tokens. The table's rows are positions by its values (row r is the
rotation by r steps, `_rotary_values`), the axis they meet is the heads by the projection's
provenance: no size decides, and the bug is found at the coincident sizes too.
"""

import warnings

import bug_zoo as zoo
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

SETTING = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
STYLES = ("stacked", "complex", "rotate_half", "position_ids")
MAX_POSITIONS = 128


def inv_freq(dim: int) -> torch.Tensor:
    return 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))


def angles(dim: int, positions: int = MAX_POSITIONS) -> torch.Tensor:
    return torch.outer(torch.arange(positions).float(), inv_freq(dim))  # [T, dim / 2]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rope(nn.Module):
    """A rotary table in one of four spellings: built once in `__init__` as lit-llama's
    stacked cos/sin `[T, D/2, 2]`, llama's complex `freqs_cis` `[T, D/2]`, or the older
    transformers' `cos_cached`/`sin_cached` `[T, D]` with `rotate_half`; or computed in the
    forward from position ids, as transformers does now. `apply(x, seq_axis)` rotates
    x along the axis it is told holds the positions, as code written for one layout does."""

    def __init__(self, style: str, dim: int):
        super().__init__()
        self.style = style
        a = angles(dim)
        if style == "stacked":
            self.register_buffer("cache", torch.stack([a.cos(), a.sin()], -1), persistent=False)
        elif style == "complex":
            self.register_buffer("cache", torch.polar(torch.ones_like(a), a), persistent=False)
        elif style == "position_ids":
            self.register_buffer("inv_freq", inv_freq(dim), persistent=False)
        else:
            emb = torch.cat((a, a), dim=-1)
            self.register_buffer("cos_cached", emb.cos(), persistent=False)
            self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def apply(self, x, seq_axis: int, start: int = 0):
        T = x.size(seq_axis)
        shape = [1] * x.dim()
        shape[seq_axis] = T
        if self.style == "stacked":
            xs = x.float().reshape(*x.shape[:-1], -1, 2)
            c = self.cache[start : start + T].view(*shape[:-1], xs.size(-2), 2)
            out = torch.stack(
                [
                    xs[..., 0] * c[..., 0] - xs[..., 1] * c[..., 1],
                    xs[..., 1] * c[..., 0] + xs[..., 0] * c[..., 1],
                ],
                -1,
            )
            return out.flatten(-2).type_as(x)
        if self.style == "complex":
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            freqs = self.cache[start : start + T].view(*shape[:-1], xc.size(-1))
            return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)
        if self.style == "position_ids":
            # transformers' rotary: cos and sin computed in the forward from position ids.
            position_ids = torch.arange(start, start + T)[None]  # [1, T]
            freqs = self.inv_freq[None, :, None] @ position_ids[:, None, :].float()
            emb = torch.cat((freqs, freqs), dim=1).transpose(1, 2)  # [1, T, D]
            cos, sin = emb.cos().view(*shape[:-1], -1), emb.sin().view(*shape[:-1], -1)
        else:
            cos = self.cos_cached[start : start + T].view(*shape[:-1], x.size(-1))
            sin = self.sin_cached[start : start + T].view(*shape[:-1], x.size(-1))
        return x * cos + rotate_half(x) * sin


class RopeAttention(nn.Module):
    """Causal self-attention with a rotary table. `order`: "before" the heads transpose on
    [B, T, H, D] (right), "after" it on [B, H, T, D] with the table on axis 2 (right),
    "bug": after it, with the code written for [B, T, H, D] (positions read from axis 1)."""

    def __init__(self, sizes, style: str, order: str):
        super().__init__()
        self.h, self.d = sizes.heads, sizes.rope_d_k
        self.order = order
        width = self.h * self.d
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.rope = Rope(style, self.d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, self.d) for t in self.qkv(x).split(C, dim=2))
        if self.order == "before":
            q, k = self.rope.apply(q, 1), self.rope.apply(k, 1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.order == "after":
            q, k = self.rope.apply(q, 2), self.rope.apply(k, 2)
        elif self.order == "bug":
            q, k = self.rope.apply(q, 1), self.rope.apply(k, 1)  # <- rotary_axis
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def findings(model, *args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args, mode="warn").findings


def tokens(sizes):
    torch.manual_seed(0)
    return torch.randn(sizes.batch, sizes.seq, sizes.heads * sizes.rope_d_k)


def messages(found) -> list[str]:
    return [f"[{f.kind}] {f.message}" for f in found]


# -- the bug ---------------------------------------------------------------------------------
@SETTING
@pytest.mark.parametrize("style", STYLES)
def test_rotary_after_the_transpose_is_found(style, sizes):
    found = findings(RopeAttention(sizes, style, "bug"), tokens(sizes))
    assert found and {f.kind for f in found} == {"rotary_axis"}, messages(found)
    first = found[0]
    h = sizes.heads
    assert f"line up with {first.operands[0].name} axis -3 ({h}), not with its sequence axis" in (
        first.message
    )
    assert "each head gets one position's rotation" in first.message
    assert first.hint.startswith("apply the rotary before the heads transpose")
    assert ".size(2) rows (not .size(1))" in first.hint
    assert "test_domain_rope.py" in first.location


def test_the_message_names_the_table_and_its_operands():
    sizes = zoo.DISTINCT
    found = findings(RopeAttention(sizes, "rotate_half", "bug"), tokens(sizes))
    first = found[0]
    assert first.message.splitlines()[0] == (
        "q * cos: the positions of cos (axis -3, size 3) line up with q axis -3 (3), not with "
        "its sequence axis: each head gets one position's rotation"
    )
    assert [o.name for o in first.operands] == ["q", "cos"]
    assert first.hint == (
        "apply the rotary before the heads transpose, on [batch, seq, heads, d_k]; or put the "
        "positions of cos on axis 2 of [batch, ?, seq, ?], the sequence: q.size(2) rows (not "
        ".size(1)) shaped [..., seq, d_k] for [batch, heads, seq, d_k] (unsqueeze_dim=1)"
    )


def test_the_reproducer_is_found():
    """The field report's own file (repro-domains/rope_after_transpose.py), rebuilt here."""
    sizes = zoo.Sizes("report", 2, 4, 5, 16, 5, 1, 3, 2, (5, 5))
    found = findings(RopeAttention(sizes, "stacked", "bug"), torch.randn(2, 5, 64))
    assert {f.kind for f in found} == {"rotary_axis"}, messages(found)


# -- what is right stays silent ----------------------------------------------------------------
@SETTING
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("order", ("before", "after"))
def test_rotary_on_the_positions_is_clean(order, style, sizes):
    assert findings(RopeAttention(sizes, style, order), tokens(sizes)) == []


class PartialRotary(nn.Module):
    """GPT-NeoX's partial rotary: the first rotary_dim features of each head rotate, the rest
    pass through; or GPT-J's interleaved pairs (`rotate_every_two`, cos repeated per pair)."""

    def __init__(self, sizes, interleaved: bool):
        super().__init__()
        self.h, self.d, self.interleaved = sizes.heads, sizes.rope_d_k, interleaved
        self.rot = self.d if interleaved else max(2, self.d // 2 - (self.d // 2) % 2)
        a = angles(self.rot)
        table = a.repeat_interleave(2, -1) if interleaved else torch.cat((a, a), -1)
        self.register_buffer("cos", table.cos(), persistent=False)
        self.register_buffer("sin", table.sin(), persistent=False)
        self.qkv = nn.Linear(self.h * self.d, 3 * self.h * self.d)

    def rotate(self, x):
        T = x.size(2)
        cos, sin = self.cos[None, None, :T], self.sin[None, None, :T]
        x_rot, x_pass = x[..., : self.rot], x[..., self.rot :]
        if self.interleaved:
            turned = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), -1).flatten(-2)
        else:
            turned = rotate_half(x_rot)
        return torch.cat((x_rot * cos + turned * sin, x_pass), -1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, self.d).transpose(1, 2) for t in self.qkv(x).split(C, dim=2)
        )
        y = F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, C)


@SETTING
@pytest.mark.parametrize("interleaved", (False, True), ids=("neox_partial", "gptj"))
def test_partial_and_interleaved_rotary_are_clean(interleaved, sizes):
    assert findings(PartialRotary(sizes, interleaved), tokens(sizes)) == []


class AxialRope(nn.Module):
    """2-D rotary over a vision model's patch grid (EVA, pixart): half of each head rotates
    by the patch's row, half by its column; the table [rows * cols, D] is built in __init__."""

    def __init__(self, sizes):
        super().__init__()
        self.h, self.d = sizes.heads, 2 * sizes.rope_d_k
        rows, cols = sizes.grid
        half = self.d // 2
        ar, ac = angles(half, rows), angles(half, cols)
        grid = torch.cat(
            (ar[:, None, :].expand(rows, cols, -1), ac[None, :, :].expand(rows, cols, -1)), -1
        ).reshape(rows * cols, half)
        table = torch.cat((grid, grid), -1)
        self.register_buffer("cos", table.cos(), persistent=False)
        self.register_buffer("sin", table.sin(), persistent=False)
        self.qkv = nn.Linear(self.h * self.d, 3 * self.h * self.d)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = (
            t.view(B, N, self.h, self.d).transpose(1, 2) for t in self.qkv(x).split(C, dim=2)
        )
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        y = F.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(B, N, C)


@SETTING
def test_axial_vision_rotary_is_clean(sizes):
    rows, cols = sizes.grid
    x = torch.randn(sizes.batch, rows * cols, sizes.heads * 2 * sizes.rope_d_k)
    assert findings(AxialRope(sizes), x) == []


class CachedRope(nn.Module):
    """A decode step: the new tokens' rotary rows start at the number of cached tokens."""

    def __init__(self, sizes, style: str):
        super().__init__()
        self.h, self.d = sizes.heads, sizes.rope_d_k
        width = self.h * self.d
        self.qkv = nn.Linear(width, 3 * width)
        self.rope = Rope(style, self.d)

    def forward(self, x, k_cache, v_cache):
        B, T, C = x.shape
        start = k_cache.size(2)
        q, k, v = (t.view(B, T, self.h, self.d) for t in self.qkv(x).split(C, dim=2))
        q, k = self.rope.apply(q, 1, start), self.rope.apply(k, 1, start)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k, v = torch.cat((k_cache, k), 2), torch.cat((v_cache, v), 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(B, T, C)


@SETTING
@pytest.mark.parametrize("style", STYLES)
def test_a_cached_step_with_position_offsets_is_clean(style, sizes):
    cached = sizes.seq_k - 1
    shape = (sizes.batch, sizes.heads, cached, sizes.rope_d_k)
    x = torch.randn(sizes.batch, 1, sizes.heads * sizes.rope_d_k)
    found = findings(CachedRope(sizes, style), x, torch.randn(shape), torch.randn(shape))
    assert found == [], messages(found)


# -- what the values say --------------------------------------------------------------------
def test_only_rotations_from_position_zero_are_read_as_positions():
    from shapeguard.checks._rotary_values import positions_axis

    a = angles(8, 6)
    assert positions_axis(a.cos(), 0)
    assert positions_axis(torch.polar(torch.ones_like(a), a), 0)
    assert not positions_axis(a.cos(), 1)  # the frequencies are no positions
    assert not positions_axis(a[2:].cos(), 0)  # rows from position 2: a cached step's
    assert not positions_axis(torch.ones(6, 4), 0)  # a gate: ones turn nothing
    assert not positions_axis(a.sin(), 0)
    assert not positions_axis(a.cos()[:2], 0)  # two rows cannot show a repeated step
    assert not positions_axis(torch.rand(6, 4), 0)


def test_a_decay_near_one_is_no_rotation_and_a_scaled_rope_table_is():
    """Per-head decays of a linear attention (bailing_hybrid's exp(g), near 1) obey the cos
    recurrence within tolerance while they barely move: they must not read as positions. A
    RoPE cos table, also with position interpolation by 8, must."""
    from shapeguard.checks._rotary_values import positions_axis

    slopes = torch.arange(4, dtype=torch.float32)[:, None] * 1e-4  # head h decays h * 1e-4
    decay = torch.exp(-slopes * torch.ones(1, 16))  # [heads, d], row 0 all ones
    assert not positions_axis(decay, 0)
    theta = 10000 ** (-torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    for scale in (1, 8):
        table = torch.cos(torch.arange(6, dtype=torch.float32)[:, None] / scale * theta)
        assert positions_axis(table, 0)
