"""The batch probes hold on a MaxViT-style grid-partition block, and fail on its bugs (issue 32).

timm's MaxViT pads its input "same" (`F.pad`, then a strided conv), runs block (window)
and grid attention over windows folded into the batch (`[batch * windows, tokens, d]`),
reverses both with `view(-1, ...)`, and pools the feature map away at its head
(`adaptive_avg_pool2d`). The pad and the pool made new axes, the batch too, so every batch
probe was n/a ("no output has a batch axis"); now the pad keeps the axes it does not pad
and the pool keeps batch and channels, and the batch probes hold on the block as written
and fail on a copy that mixes examples:
- `grid_reverse_order`: the grid reverse unfolds `[batch * grid cells]` with the batch as
  its inner factor (the trace sees the order too);
- `shift_batch`: a shift that rolls the batch and the rows (`dims=(0, 1)`) where the rows
  and columns are meant (`dims=(1, 2)`), as a shifted-window block does.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

# batch, heads, d_k, window side (its tokens are the sequence), windows per image side:
# pairwise distinct (batch 3, heads 4, 9 window tokens, d_k 16, 2 x 2 windows);
# coincident (batch == heads == window tokens == d_k == 4); realistic (batch 4, heads 8,
# 64 window tokens, d_k 64).
SIZES = {
    "distinct": (3, 4, 16, 3, 2),
    "coincident": (4, 4, 4, 2, 2),
    "realistic": (4, 8, 64, 8, 2),
}


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """[B, H, W, C] -> [B * H/w * W/w, w, w, C]: each w x w block of neighbors a window."""
    B, H, W, C = x.shape
    x = x.view(B, H // w, w, W // w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, w, w, C)


def window_reverse(windows: torch.Tensor, w: int, H: int, W: int) -> torch.Tensor:
    C = windows.shape[-1]
    x = windows.view(-1, H // w, W // w, w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


def grid_partition(x: torch.Tensor, g: int) -> torch.Tensor:
    """[B, H, W, C] -> [B * H/g * W/g, g, g, C]: each window a g x g grid strided over the
    whole image (MaxViT's grid attention)."""
    B, H, W, C = x.shape
    x = x.view(B, g, H // g, g, W // g, C)
    return x.permute(0, 2, 4, 1, 3, 5).contiguous().view(-1, g, g, C)


def grid_reverse(windows: torch.Tensor, g: int, H: int, W: int, bug: str) -> torch.Tensor:
    C = windows.shape[-1]
    if bug == "grid_reverse_order":
        x = windows.view(H // g, W // g, -1, g, g, C)  # the batch read as the inner factor
        return x.permute(2, 3, 0, 4, 1, 5).contiguous().view(-1, H, W, C)
    x = windows.view(-1, H // g, W // g, g, g, C)
    return x.permute(0, 3, 1, 4, 2, 5).contiguous().view(-1, H, W, C)


class PartitionAttention(nn.Module):
    """Pre-norm attention within windows (`grid=False`) or grids of one side `size`."""

    def __init__(self, d_model: int, heads: int, size: int, grid: bool, bug: str) -> None:
        super().__init__()
        self.heads, self.size, self.grid, self.bug = heads, size, grid, bug
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        s = self.size
        shifted = self.norm(x)
        if not self.grid:
            dims = (0, 1) if self.bug == "shift_batch" else (1, 2)
            shifted = torch.roll(shifted, shifts=(-(s // 2), -(s // 2)), dims=dims)
        parts = grid_partition(shifted, s) if self.grid else window_partition(shifted, s)
        n, d_k = s * s, C // self.heads
        q, k, v = self.qkv(parts.view(-1, n, C)).view(-1, n, 3, self.heads, d_k).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        out = self.proj(out.transpose(1, 2).reshape(-1, s, s, C))
        if self.grid:
            return x + grid_reverse(out, s, H, W, self.bug)
        back = window_reverse(out, s, H, W)
        return x + torch.roll(back, shifts=(s // 2, s // 2), dims=(1, 2))


class MaxViTStyle(nn.Module):
    """A "same"-padded strided stem, block then grid attention, a pooled head."""

    def __init__(self, heads: int, d_k: int, size: int, bug: str = "") -> None:
        super().__init__()
        d_model = heads * d_k
        self.stem = nn.Conv2d(3, d_model, 3, stride=2)
        self.block = PartitionAttention(d_model, heads, size, grid=False, bug=bug)
        self.grid = PartitionAttention(d_model, heads, size, grid=True, bug=bug)
        self.head = nn.Linear(d_model, d_model)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(F.pad(image, (0, 1, 0, 1)))  # timm's Conv2dSame at stride 2
        x = self.grid(self.block(x.permute(0, 2, 3, 1)))
        pooled = F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1)
        return self.head(pooled)


def build(size: str, bug: str = "") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    batch, heads, d_k, window, windows = SIZES[size]
    side = 2 * window * windows  # the stem halves it
    return MaxViTStyle(heads, d_k, window, bug).eval(), torch.randn(batch, 3, side, side)


BUGS = ["grid_reverse_order", "shift_batch"]


@pytest.mark.parametrize("size", list(SIZES))
def test_trace_is_silent_on_the_correct_block(size):
    model, image = build(size)
    t = shapeguard.trace(model, image, mode="warn")
    assert not t.findings, [f.message for f in t.findings]


@pytest.mark.parametrize("size", list(SIZES))
def test_batch_probes_hold_on_the_correct_block(size):
    model, image = build(size)
    batch = SIZES[size][0]
    report = check(model, image)
    assert report.passed, str(report)
    results = {r.name: r for r in report.results}
    held = results["batch independence"]
    assert held.status == "passed", held.message
    assert held.message.startswith(
        f"changing example {batch - 1} of {batch} (image) left the other examples' "
        "outputs unchanged (deviation 0.0e+00)"
    ), held.message
    sub = results["sub-batch consistency"]
    assert sub.status == "passed", sub.message
    assert sub.message.startswith(
        f"running the first {batch - 1} of {batch} examples alone left their outputs unchanged"
    ), sub.message


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("bug", BUGS)
def test_batch_probes_fail_on_a_block_that_mixes_examples(bug, size):
    model, image = build(size, bug)
    batch = SIZES[size][0]
    report = check(model, image)
    assert not report.passed
    results = {r.name: r for r in report.results}
    said = {
        # (At realistic sizes the shift by half a window, 4, rolls a batch of 4 onto
        # itself: only running fewer examples shows it.)
        "batch independence": f"changing example {batch - 1} of {batch} (image) moved the "
        "other examples' outputs by ",
        "sub-batch consistency": f"running the first {batch - 1} of {batch} examples alone "
        "moved their outputs by ",
    }
    failed = [name for name in said if results[name].status == "failed"]
    assert failed, str(report)
    for name in failed:
        assert results[name].message.startswith(said[name]), results[name].message
        assert "of the output's scale (tolerance" in results[name].message


def test_the_trace_sees_the_grid_reverse_order_and_not_the_shift():
    """The shift along the batch is a bug only the probes find: `torch.roll` moves values,
    and no shape says which axis it should have moved them along."""
    model, image = build("distinct", "grid_reverse_order")
    with pytest.warns(shapeguard.ShapeWarning):
        t = shapeguard.trace(model, image, mode="warn")
    assert [f.kind for f in t.findings] == ["batch_mixing"]
    assert "in another order than it was folded" in t.findings[0].message
    model, image = build("distinct", "shift_batch")
    assert not shapeguard.trace(model, image, mode="warn").findings


def named_outputs(t, op: str) -> list[str]:
    return [r.named_shape for e in t.events if e.op == op for r in e.outputs]


def test_pad_keeps_the_axes_it_does_not_pad_and_pooling_keeps_batch_and_channels():
    model, image = build("distinct")
    t = shapeguard.trace(model, image, mode="warn")
    # The image's batch and channels through the pad; its rows and columns are new ones
    # (of 13, named by the conv that reads them).
    assert named_outputs(t, "pad") == ["[batch=3, channels=3, height=13, width=13]"]
    assert named_outputs(t, "adaptive_avg_pool2d") == ["[batch=3, channels=64, 1, 1]"]
    assert named_outputs(t, "linear")[-1].startswith("[batch=3, ")


class PooledTokens(nn.Module):
    """Attention over a feature map smoothed by a stride-1 max pool (the same grid, each
    position mixed with its neighbors): the pooled positions are new, so no probe
    permutes the tokens through the pool."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, d_model, 1)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv(image), 3, stride=1, padding=1)
        tokens = x.flatten(2).transpose(1, 2)
        return self.attn(tokens, tokens, tokens, need_weights=False)[0]


@pytest.mark.parametrize("size", list(SIZES))
def test_a_pool_that_keeps_the_grid_makes_no_token_probe_fail(size):
    torch.manual_seed(0)
    batch, heads, d_k, window, windows = SIZES[size]
    side = window * windows
    model = PooledTokens(heads * d_k, heads).eval()
    report = check(model, torch.randn(batch, 3, side, side))
    assert report.passed, str(report)
    results = {r.name: r for r in report.results}
    assert results["batch independence"].status == "passed"
    permutation = results["token-permutation equivariance"]
    assert permutation.status == "skipped", permutation.message
    assert permutation.message.startswith("the outputs keep none of the inputs' token axes")
