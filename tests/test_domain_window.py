"""Axes through windows and patches (issue 32): `check` on a Swin block, and vision
attention that the trace must leave alone.

A Swin block written from scratch after microsoft/Swin-Transformer (window partition,
window attention with its relative position bias and the shifted-window mask, reverse,
MLP). Its window partition folds the batch with the window grid into one axis
(`[batch * windows, tokens, C]`); provenance keeps the batch as that axis's outermost
factor, so the batch probes read each example's rows from it, hold on the correct block
and fail on a batch-mixing one. Next to it, the correct counterparts the issue lists stay
silent at the three size settings: ViT attention on a conv's patch tokens, a conv feature
map's attention (channels first and channels last), an einops patchify, and video attention
over frames x patches.
"""

import math
import warnings

import pytest
import torch
from einops import rearrange
from torch import nn

import shapeguard
from shapeguard import ShapeWarning
from shapeguard._probes.check import check
from shapeguard._probes.layout_records import example_rows

pytestmark = pytest.mark.no_shapeguard

# batch, heads, d_k; window side ws (ws * ws tokens a window), image height and width, shift.
# For patch tokens: an image (height, width), its patch side and a video's frames.
SIZES = {
    "distinct": dict(
        batch=3, heads=4, d_k=16, ws=3, hw=(9, 6), shift=1, img=(14, 10), p=2, frames=5
    ),
    "coincident": dict(
        batch=4, heads=4, d_k=4, ws=2, hw=(4, 4), shift=1, img=(4, 4), p=2, frames=4
    ),
    # 64 tokens (8 x 8) in windows of 16: a Swin stage's proportions at a size CI can probe.
    "realistic": dict(
        batch=4, heads=8, d_k=64, ws=4, hw=(8, 8), shift=2, img=(32, 32), p=4, frames=8
    ),
}
sizes = pytest.mark.parametrize("z", list(SIZES.values()), ids=list(SIZES))


def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W, interleave=False):
    B = int(windows.shape[0] / (H * W / ws / ws))
    if interleave:  # the window grid unfolded before the batch it was folded after
        x = windows.view(H // ws, W // ws, B, ws, ws, -1).permute(2, 0, 3, 1, 4, 5)
    else:
        x = windows.view(B, H // ws, W // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5)
    return x.contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, ws, num_heads, mask_bug=False):
        super().__init__()
        self.num_heads, self.mask_bug = num_heads, mask_bug
        self.scale = (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * ws - 1) ** 2, num_heads) * 0.02
        )
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij"))
        flat = torch.flatten(coords, 1)
        rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1
        rel[:, :, 1] += ws - 1
        rel[:, :, 0] *= 2 * ws - 1
        self.register_buffer("relative_position_index", rel.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        index = self.relative_position_index.view(-1)
        bias = self.relative_position_bias_table[index].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            if self.mask_bug:  # windows read as the outer factor: masks land on other windows
                attn = attn.view(nW, B_ // nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(
                    1
                )
            else:
                attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(
                    0
                )
            attn = attn.view(-1, self.num_heads, N, N)
        attn = attn.softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


def shifted_mask(H, W, ws, shift):
    img_mask = torch.zeros((1, H, W, 1))
    cnt = 0
    for h in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for w in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img_mask[:, h, w, :] = cnt
            cnt += 1
    windows = window_partition(img_mask, ws).view(-1, ws * ws)
    am = windows.unsqueeze(1) - windows.unsqueeze(2)
    return am.masked_fill(am != 0, -100.0).masked_fill(am == 0, 0.0)


class SwinBlock(nn.Module):
    def __init__(self, dim, hw, num_heads, ws, shift, bug=None):
        super().__init__()
        (self.H, self.W), self.ws, self.shift, self.bug = hw, ws, shift, bug
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, num_heads, mask_bug=bug == "mask")
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        mask = shifted_mask(*hw, ws, shift) if shift else None
        self.register_buffer("attn_mask", mask)

    def forward(self, x):
        H, W, ws = self.H, self.W, self.ws
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        windows = window_partition(x, ws).view(-1, ws * ws, C)
        windows = self.attn(windows, mask=self.attn_mask).view(-1, ws, ws, C)
        x = window_reverse(windows, ws, H, W, interleave=self.bug == "interleave")
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class WindowsOut(nn.Module):
    """The field report's module: [B, H, W, C] in, attention's windows out
    ([B * windows, ws * ws, C]): no output axis is the batch alone."""

    def __init__(self, dim, hw, num_heads, ws, shift, bug=None):
        super().__init__()
        self.ws = ws
        self.attn = WindowAttention(dim, ws, num_heads, mask_bug=bug == "mask")
        self.register_buffer("attn_mask", shifted_mask(*hw, ws, shift) if shift else None)

    def forward(self, x):
        C = x.shape[-1]
        windows = window_partition(x, self.ws).view(-1, self.ws * self.ws, C)
        return self.attn(windows, mask=self.attn_mask)


def _block(cls, z, shift=True, bug=None):
    torch.manual_seed(0)
    dim = z["heads"] * z["d_k"]
    model = cls(dim, z["hw"], z["heads"], z["ws"], z["shift"] if shift else 0, bug)
    H, W = z["hw"]
    shape = (z["batch"], H * W, dim) if cls is SwinBlock else (z["batch"], H, W, dim)
    return model, torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def statuses(report):
    return {r.name: r.status for r in report.results}


def result(report, name):
    return next(r for r in report.results if r.name == name)


BATCH_PROBES = ("batch independence", "sub-batch consistency")


@sizes
@pytest.mark.parametrize(
    ("cls", "shift"),
    [(SwinBlock, True), (SwinBlock, False), (WindowsOut, True)],
    ids=["block-shifted", "block-plain", "windows-out"],
)
def test_the_batch_probes_hold_on_a_correct_swin_block(z, cls, shift):
    report = check(*_block(cls, z, shift))
    got = statuses(report)
    assert report.passed, report.render(width=200)
    assert all(got[name] == "passed" for name in BATCH_PROBES), report.render(width=200)
    assert report.findings == [], [f.message for f in report.findings]


@sizes
def test_a_window_reverse_that_interleaves_examples_fails_batch_independence(z):
    report = check(*_block(SwinBlock, z, bug="interleave"))
    got = result(report, "batch independence")
    assert got.status == "failed", report.render(width=200)
    assert got.message.startswith(f"changing example {z['batch'] - 1} of {z['batch']} (x)")


@sizes
def test_a_shifted_window_mask_broadcast_over_the_wrong_factor_is_found(z):
    """Swin's mask added to `attn.view(nW, B_ // nW, ...)`: the view unfolds the windows
    in another order than the partition folded them, so masks land on other windows and
    which one a window gets depends on the batch size: the trace finds it (the batch
    factor is carried through the partition), and `check` fails."""
    report = check(*_block(WindowsOut, z, bug="mask"))
    assert not report.passed, report.render(width=200)
    n = z["batch"] * math.prod(z["hw"]) // z["ws"] ** 2
    if n // z["batch"] == z["batch"]:
        # As many windows as examples: the view has the fold's sizes, only the mask's
        # broadcast is wrong, and the probe sees it.
        assert report.findings == []
        assert result(report, "sub-batch consistency").status == "failed"
        return
    (found,) = report.findings
    assert found.kind == "batch_mixing"
    assert found.message.startswith(
        f"attn.view({n // z['batch']}, {z['batch']}, {z['heads']}, {z['ws'] ** 2}, "
        f"{z['ws'] ** 2}): unfolds [batch * "
    )


@sizes
def test_the_reach_probe_names_the_fold_it_saw_on_windows_out(z):
    report = check(*_block(WindowsOut, z))
    got = result(report, "reach")
    assert got.status == "skipped"
    n = z["batch"] * math.prod(z["hw"]) // z["ws"] ** 2
    windows = n // z["batch"]
    assert got.message.splitlines()[0] == (
        f"the first output has no batch axis of its own: its axis 0 ({n}) folds the batch "
        f"with other factors (1 outside it, {windows} inside: [batch * windows] after a window "
        "partition, for one), so the reach cannot be laid out per example; the batch probes "
        "read the examples' rows from it"
    )


@pytest.mark.parametrize(
    ("outer", "inner", "rows"),
    [(1, 3, [3, 4, 5, 9, 10, 11]), (2, 1, [1, 3, 5, 7]), (2, 2, [2, 3, 6, 7, 10, 11, 14, 15])],
)
def test_example_rows_pick_each_examples_rows_of_a_folded_axis(outer, inner, rows):
    examples, batch = [1, 3], 4
    got = example_rows(examples, batch, outer, inner).tolist()
    assert got == rows
    flat = torch.arange(outer * batch * inner).view(outer, batch, inner)
    assert got == flat[:, examples].reshape(-1).tolist()


# -- correct vision attention: the trace says nothing -------------------------------------
def silent(model, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model.eval(), *args, mode="warn")
    assert not trace.internal_errors, trace.internal_errors
    assert trace.findings == [], [f.message for f in trace.findings]


class Attention(nn.Module):
    """timm's ViT attention on [B, N, C] tokens."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1) * (C // self.heads) ** -0.5).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class PatchTokens(nn.Module):
    """ViT / DeiT: patches made by a conv whose stride is its kernel, or by einops."""

    def __init__(self, dim, heads, p, style):
        super().__init__()
        self.p, self.style = p, style
        if style == "conv":
            self.embed = nn.Conv2d(3, dim, kernel_size=p, stride=p)
        else:
            self.embed = nn.Linear(3 * p * p, dim)
        self.attn = Attention(dim, heads)

    def forward(self, img):
        if self.style == "conv":
            x = self.embed(img).flatten(2).transpose(1, 2)
        else:
            p = self.p
            x = self.embed(rearrange(img, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p))
        return x + self.attn(x)


class FeatureMapAttention(nn.Module):
    """A conv feature map's attention block (a UNet's spatial self-attention), its tokens
    taken channels first or channels last, and put back."""

    def __init__(self, dim, heads, style):
        super().__init__()
        self.style = style
        self.conv = nn.Conv2d(3, dim, 3, padding=1)
        self.attn = Attention(dim, heads)

    def forward(self, img):
        x = self.conv(img)
        B, C, H, W = x.shape
        if self.style == "first":
            tokens = x.flatten(2).transpose(1, 2)
        else:
            tokens = x.permute(0, 2, 3, 1).reshape(B, H * W, C)
        out = self.attn(tokens)
        return x + out.transpose(1, 2).reshape(B, C, H, W)


class VideoAttention(nn.Module):
    """TimeSformer's divided attention on [B, T, C, H, W] clips: over each frame's patches,
    then over the frames at each patch."""

    def __init__(self, dim, heads, p):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=p, stride=p)
        self.space = Attention(dim, heads)
        self.time = Attention(dim, heads)

    def forward(self, clip):
        b, t = clip.shape[:2]
        x = self.embed(rearrange(clip, "b t c h w -> (b t) c h w")).flatten(2).transpose(1, 2)
        x = x + self.space(x)  # [(b t), n, d]
        n = x.shape[1]
        x = rearrange(x, "(b t) n d -> (b n) t d", b=b, t=t)
        x = x + self.time(x)
        return rearrange(x, "(b n) t d -> b (t n) d", b=b, n=n)


def _img(z, *lead):
    return torch.randn(*lead, 3, *z["img"])


@sizes
@pytest.mark.parametrize("style", ["conv", "einops"])
def test_attention_on_patch_tokens_is_silent(z, style):
    silent(PatchTokens(z["heads"] * z["d_k"], z["heads"], z["p"], style), _img(z, z["batch"]))


@sizes
@pytest.mark.parametrize("style", ["first", "last"])
def test_a_feature_maps_attention_is_silent(z, style):
    h, w = z["img"][0] // z["p"], z["img"][1] // z["p"]
    model = FeatureMapAttention(z["heads"] * z["d_k"], z["heads"], style)
    silent(model, torch.randn(z["batch"], 3, h, w))


@sizes
def test_video_attention_over_frames_and_patches_is_silent(z):
    model = VideoAttention(z["heads"] * z["d_k"], z["heads"], z["p"])
    silent(model, _img(z, z["batch"], z["frames"]))


@sizes
@pytest.mark.parametrize("shift", [True, False], ids=["shifted", "plain"])
def test_a_swin_block_traces_silent(z, shift):
    silent(*_block(SwinBlock, z, shift))
