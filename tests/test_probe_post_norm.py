"""The batch probes hold on a Swin-v2-style res-post-norm block, and fail on its bugs (issue 32).

Swin-v2 normalises the attention's output before the residual (`x + norm1(attn(x))`) and
timm starts those norms' weights at zero, so the block returns its input: every probe of
its output passes whatever the attention does. `check` measures where the attention's
effect stops instead, at the input of `norm1`, through the window partition and reverse
(`[batch * windows, tokens, d]` read back per example). The probes hold on the block as
written, zero-initialised or not, and fail on a copy that mixes examples:
- `window_reverse_order`: the reverse unfolds `[batch * windows]` with the batch as its
  inner factor (the trace sees the order too);
- `shift_batch`: the shifted block rolls the batch and the rows (`dims=(0, 1)`) where the
  rows and columns are meant (`dims=(1, 2)`): only the probes see it.
"""

import math

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
PATCH = 2


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """[B, H, W, C] -> [B * H/w * W/w, w * w, C]."""
    B, H, W, C = x.shape
    x = x.view(B, H // w, w, W // w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, w * w, C)


def window_reverse(windows: torch.Tensor, w: int, H: int, W: int, bug: str) -> torch.Tensor:
    C = windows.shape[-1]
    if bug == "window_reverse_order":
        x = windows.view(H // w, W // w, -1, w, w, C)  # the batch read as the inner factor
        return x.permute(2, 0, 3, 1, 4, 5).contiguous().view(-1, H, W, C)
    x = windows.view(-1, H // w, W // w, w, w, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


class WindowAttentionV2(nn.Module):
    """Scaled cosine attention with a learned temperature and a bias per head."""

    def __init__(self, d_model: int, heads: int, tokens: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads, 1, 1)))
        self.position_bias = nn.Parameter(0.02 * torch.randn(heads, tokens, tokens))
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        attn = (attn + self.position_bias).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


class SwinV2Block(nn.Module):
    """Shifted-window attention and an MLP, each normalised after it (res-post-norm)."""

    def __init__(self, d_model: int, heads: int, w: int, shift: int, zero: bool, bug: str):
        super().__init__()
        self.w, self.shift, self.bug = w, shift, bug
        self.attn = WindowAttentionV2(d_model, heads, w * w)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model)
        )
        self.norm2 = nn.LayerNorm(d_model)
        if zero:  # timm's SwinTransformerV2Block._init_respostnorm
            nn.init.zeros_(self.norm1.weight)
            nn.init.zeros_(self.norm2.weight)

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        s = self.shift
        dims = (0, 1) if self.bug == "shift_batch" else (1, 2)
        shifted = torch.roll(x, shifts=(-s, -s), dims=dims) if s else x
        out = self.attn(window_partition(shifted, self.w))
        back = window_reverse(out, self.w, H, W, self.bug)
        return torch.roll(back, shifts=(s, s), dims=(1, 2)) if s else back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.norm1(self._attn(x))
        return x + self.norm2(self.mlp(x))


class SwinV2Style(nn.Module):
    """A patch embedding, then a block without and one with a shift."""

    def __init__(self, heads: int, d_k: int, w: int, zero: bool, bug: str) -> None:
        super().__init__()
        d_model = heads * d_k
        self.patch_embed = nn.Conv2d(3, d_model, PATCH, stride=PATCH)
        self.blocks = nn.Sequential(
            SwinV2Block(d_model, heads, w, 0, zero, bug),
            SwinV2Block(d_model, heads, w, w // 2, zero, bug),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.patch_embed(image).permute(0, 2, 3, 1))


def build(size: str, zero: bool = True, bug: str = "") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    batch, heads, d_k, window, windows = SIZES[size]
    side = PATCH * window * windows
    model = SwinV2Style(heads, d_k, window, zero, bug).eval()
    return model, torch.randn(batch, 3, side, side)


BUGS = ["window_reverse_order", "shift_batch"]
MEASURED = "measured on the input of blocks.0.norm1 (LayerNorm) at tests/test_probe_post_norm.py:"


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("zero", [True, False], ids=["zero-post-norm", "post-norm"])
def test_trace_is_silent_on_the_correct_block(zero, size):
    model, image = build(size, zero)
    t = shapeguard.trace(model, image, mode="warn")
    assert not t.findings, [f.message for f in t.findings]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("zero", [True, False], ids=["zero-post-norm", "post-norm"])
def test_batch_probes_hold_on_the_correct_block(zero, size):
    model, image = build(size, zero)
    batch = SIZES[size][0]
    report = check(model, image)
    assert report.passed, str(report)
    results = {r.name: r for r in report.results}
    said = {
        "batch independence": f"changing example {batch - 1} of {batch} (image) left the "
        "other examples' outputs unchanged (deviation 0.0e+00)",
        "sub-batch consistency": f"running the first {batch - 1} of {batch} examples alone "
        "left their outputs unchanged",
    }
    for name, text in said.items():
        assert results[name].status == "passed", results[name].message
        assert results[name].message.startswith(text), results[name].message
        # Zero-initialised, the block's output is its input: the pass is measured where
        # the attention's effect stops, and says so.
        assert (MEASURED in results[name].message) == zero, results[name].message
        if zero:
            assert (
                "because the output does not depend on the attention (all-zero weights: "
                "blocks.0.norm1.weight, blocks.0.norm2.weight, blocks.1.norm1.weight and 1 "
                "more, as zero_module and adaLN-Zero start)"
            ) in results[name].message


FAILED_SAYS = {
    "batch independence": "changing example {last} of {batch} (image) moved the other "
    "examples' outputs by ",
    "sub-batch consistency": "running the first {last} of {batch} examples alone moved "
    "their outputs by ",
}


@pytest.mark.parametrize("size", list(SIZES))
def test_batch_probes_fail_on_a_zero_initialised_block_that_shifts_along_the_batch(size):
    model, image = build(size, True, "shift_batch")
    batch = SIZES[size][0]
    report = check(model, image)
    assert not report.passed
    results = {r.name: r for r in report.results}
    assert results["shape checks"].status == "passed", results["shape checks"].message
    # (At realistic sizes the shift by half a window, 4, rolls a batch of 4 onto itself:
    # only running fewer examples shows it.)
    failed = [name for name in FAILED_SAYS if results[name].status == "failed"]
    assert failed, str(report)
    for name in failed:
        message = results[name].message
        assert message.startswith(FAILED_SAYS[name].format(last=batch - 1, batch=batch))
        assert "of the output's scale (tolerance" in message
        assert MEASURED in message, message


@pytest.mark.parametrize("size", list(SIZES))
def test_a_reversed_window_unfold_fails_and_no_batch_probe_passes(size):
    """The trace names the unfold; where the reversed windows then carry no batch axis
    (the engine cannot tell which factor holds the examples), the batch probes say so
    and never pass."""
    model, image = build(size, True, "window_reverse_order")
    report = check(model, image)
    assert not report.passed
    results = {r.name: r for r in report.results}
    assert results["shape checks"].status == "failed"
    assert "(batch_mixing)" in results["shape checks"].message
    for name in FAILED_SAYS:
        assert results[name].status != "passed", results[name].message


def test_the_trace_sees_the_window_reverse_order_and_not_the_shift():
    model, image = build("distinct", True, "window_reverse_order")
    with pytest.warns(shapeguard.ShapeWarning):
        t = shapeguard.trace(model, image, mode="warn")
    assert {f.kind for f in t.findings} == {"batch_mixing"}
    assert "in another order than it was folded" in t.findings[0].message
    model, image = build("distinct", True, "shift_batch")
    assert not shapeguard.trace(model, image, mode="warn").findings
