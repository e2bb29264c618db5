"""Hints that know the domain (issue 32): a heads merge gets the merge hint wherever it
sits, heads taken from a conv's channels get the fold hint, and the patchify hint only
where an image is cut into patches.

Each bug is written after the field report's reproducers (`repro-domains/
window_attention_merge_hint.py`: Swin's window attention, microsoft/Swin-Transformer; a
guided-diffusion `QKVAttentionLegacy`; a PaLM-style multi-query block), and each hint is
held to what it says: the code it spells out is the module's `fixed` variant, which runs
silent at the three size settings. The message prints the user's expression with its
parentheses (`(attn @ v).reshape(...)`, not `attn @ v.reshape(...)`).
"""

import ast
import math
import warnings

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard import ShapeWarning
from shapeguard._source_ast import describe_node

pytestmark = pytest.mark.no_shapeguard

# batch, heads, d_k, and the positions: window side (windows of ws * ws tokens) and image
# height and width for the window attention, a sequence length for the others.
SIZES = {
    "distinct": dict(batch=3, heads=4, d_k=16, ws=3, hw=(9, 6), seq=7),
    "coincident": dict(batch=4, heads=4, d_k=4, ws=2, hw=(4, 4), seq=4),
    "realistic": dict(batch=4, heads=8, d_k=64, ws=8, hw=(16, 16), seq=64),
}
sizes = pytest.mark.parametrize("z", list(SIZES.values()), ids=list(SIZES))


def findings(model, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model.eval(), *args, mode="warn")
    assert not trace.internal_errors, trace.internal_errors
    return trace.findings


def only(found, kind):
    assert len(found) == 1 and found[0].kind == kind, [f.message for f in found]
    return found[0]


def silent(model, *args):
    found = findings(model, *args)
    assert found == [], [f.message for f in found]


def window_partition(x, ws):  # [B, H, W, C] -> [B * nW, ws * ws, C]
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, C)


class WindowAttention(nn.Module):
    """Swin's window attention on [B, H, W, C] (the reproducer's module)."""

    def __init__(self, dim, n_heads, ws, variant=None):
        super().__init__()
        self.h, self.ws, self.variant = n_heads, ws, variant
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        win = window_partition(x, self.ws)
        B_, N, C = win.shape
        q, k, v = self.qkv(win).reshape(B_, N, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) * (C // self.h) ** -0.5).softmax(dim=-1)
        if self.variant == "bug":
            out = (attn @ v).reshape(B_, N, C)  # the transpose is missing
        elif self.variant == "fixed":  # the hint's code, word for word
            out = (attn @ v).transpose(1, 2).contiguous().view(B_, N, C)
        else:
            out = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(out)


class LegacyQKV(nn.Module):
    """guided-diffusion's AttentionBlock with QKVAttentionLegacy: a 1x1 conv makes q, k and
    v as channels, and the heads are folded into the batch."""

    def __init__(self, channels, n_heads, variant=None):
        super().__init__()
        self.n_heads, self.variant = n_heads, variant
        self.norm = nn.GroupNorm(1, channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        if self.variant == "bug":  # the heads folded into the positions
            q, k, v = qkv.reshape(bs, ch * 3, self.n_heads * length).split(ch, dim=1)
            q, k, v = (t.reshape(bs * self.n_heads, ch, length) for t in (q, k, v))
        elif self.variant == "chunk":  # the hint's other order: [3, heads, ch]
            q, k, v = (t.reshape(bs * self.n_heads, ch, length) for t in qkv.chunk(3, dim=1))
        else:
            q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale).softmax(dim=-1)
        a = torch.einsum("bts,bcs->bct", weight, v)
        h = self.proj_out(a.reshape(bs, -1, length))
        return (x + h).reshape(b, c, *spatial)


class MultiQuery(nn.Module):
    """PaLM-style multi-query attention: one key and value head for every query head."""

    def __init__(self, d_model, n_heads, variant=None):
        super().__init__()
        self.n_heads, self.d_k, self.variant = n_heads, d_model // n_heads, variant
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * self.d_k)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        k, v = self.kv(x).split(self.d_k, dim=-1)
        scores = q @ k.unsqueeze(1).transpose(-2, -1) / math.sqrt(self.d_k)
        ctx = scores.softmax(dim=-1) @ v.unsqueeze(1)
        if self.variant == "bug":
            ctx = ctx.reshape(B, S, self.n_heads * self.d_k)  # the transpose is missing
        elif self.variant == "fixed":
            ctx = ctx.transpose(1, 2).contiguous().view(B, S, self.n_heads * self.d_k)
        else:
            ctx = ctx.transpose(1, 2).reshape(B, S, self.n_heads * self.d_k)
        return self.out(ctx)


def _window(z, variant=None):
    dim = z["heads"] * z["d_k"]
    model = WindowAttention(dim, z["heads"], z["ws"], variant)
    return model, torch.randn(z["batch"], *z["hw"], dim)


def _image(z):
    side = math.isqrt(z["seq"])
    return (side, side) if side * side == z["seq"] else (z["seq"], 1)


@sizes
def test_a_window_attention_heads_merge_gets_the_merge_hint(z):
    model, x = _window(z, "bug")
    found = only(findings(model, x), "view_mixes_axes")
    b_, n, d = z["batch"] * math.prod(z["hw"]) // z["ws"] ** 2, z["ws"] ** 2, z["d_k"]
    h = z["heads"]
    first = found.message.splitlines()[0]
    assert first.startswith(f"(attn @ v).reshape({b_}, {n}, {h * d}): merges heads back before")
    assert "so each output token holds pieces of other tokens" in first
    assert found.hint == (
        "transpose first: (attn @ v).transpose(1, 2).contiguous().view(batch, seq, heads * d_k)"
        f", i.e. .transpose(1, 2).reshape({b_}, {n}, {h * d})"
    )
    assert "nn.Conv2d" not in found.message and "patch" not in found.message


@sizes
@pytest.mark.parametrize("variant", [None, "fixed"])
def test_a_window_attention_merged_after_its_transpose_is_silent(z, variant):
    silent(*_window(z, variant))


@sizes
def test_heads_folded_into_the_positions_of_a_legacy_qkv_get_the_fold_hint(z):
    h, ch = z["heads"], z["d_k"]
    x = torch.randn(z["batch"], h * ch, *_image(z))
    found = only(findings(LegacyQKV(h * ch, h, "bug"), x), "view_mixes_axes")
    b, length = z["batch"], z["seq"]
    assert found.message.splitlines()[0].startswith(
        f"qkv.reshape({b}, {3 * ch}, {h * length}): regroups"
    )
    assert found.hint == (
        "heads are a factor of the channels: fold them into the batch, not into the positions: "
        f"qkv.reshape({b} * {h}, {3 * ch}, {length}) takes them as the outer factor of the "
        "channels ([heads, 3 * ch], guided-diffusion's legacy order); where the channels are "
        "[3, heads, ch], split q, k and v first (.chunk(3, dim=1)) and fold each"
    )
    assert "conv" not in found.hint and "patch" not in found.hint


@sizes
@pytest.mark.parametrize("variant", [None, "chunk"])
def test_a_legacy_qkv_folded_either_way_the_hint_says_is_silent(z, variant):
    h, ch = z["heads"], z["d_k"]
    silent(LegacyQKV(h * ch, h, variant), torch.randn(z["batch"], h * ch, *_image(z)))


@sizes
def test_a_multi_query_heads_merge_gets_the_merge_hint(z):
    h, d, b, s = z["heads"], z["d_k"], z["batch"], z["seq"]
    found = only(findings(MultiQuery(h * d, h, "bug"), torch.randn(b, s, h * d)), "view_mixes_axes")
    assert found.message.splitlines()[0].startswith(
        f"ctx.reshape({b}, {s}, {h * d}): merges heads back before moving them next to"
    )
    assert found.hint == (
        "transpose first: ctx.transpose(1, 2).contiguous().view(batch, seq, heads * d_k), "
        f"i.e. .transpose(1, 2).reshape({b}, {s}, {h * d})"
    )


@sizes
@pytest.mark.parametrize("variant", [None, "fixed"])
def test_a_multi_query_merge_after_its_transpose_is_silent(z, variant):
    h, d = z["heads"], z["d_k"]
    silent(MultiQuery(h * d, h, variant), torch.randn(z["batch"], z["seq"], h * d))


@pytest.mark.parametrize(
    ("source", "receiver"),
    [
        ("(attn @ v).reshape(2, 3)", "(attn @ v)"),
        ("(-x).softmax(-1)", "(-x)"),
        ("(a + b)[0]", "(a + b)"),
        ("(mask == 0).T", "(mask == 0)"),
        ("x.view(2, 3)", "x"),
        ("self.proj(x).view(2, 3)", "self.proj(x)"),
        ("torch.cat([a, b]).view(2)", "torch.cat([a, b])"),
    ],
)
def test_a_receiver_keeps_the_parentheses_the_user_wrote(source, receiver):
    node = ast.parse(source, mode="eval").body
    assert describe_node(node)[1] == receiver


def test_arguments_are_printed_as_written():
    node = ast.parse("torch.matmul(a + b, c)", mode="eval").body
    assert describe_node(node) == ("matmul", "", ("a + b", "c"))
