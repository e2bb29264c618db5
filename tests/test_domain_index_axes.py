"""Which axis an index or a tiled mask stands for, read from structure (issue 32).

- `gather_axis`: MAE's random masking with `argsort(noise, dim=0)`: the values are positions
  along the batch, and `torch.gather(x, dim=1, ...)` reads them along the tokens. The
  evidence is the argsort's explicit `dim=` and the gather's, never the sizes.
- `batch_mixing` at a mask's use: a padding mask tiled for heads folded into the batch with
  its per-head copies where the fold has the batch (einops `(h b)` against `(b h)`,
  `repeat(h, 1, 1)` against a batch-major fold). The heads of the fold are established by
  the projection they were split from; the copies are counted by the module's head count.

Each bug is found, and each correct idiom is silent, at the three size settings.
"""

import warnings

import einops
import pytest
import torch
from einops import rearrange
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

# (batch, heads, tokens, d_k): pairwise distinct; all equal; one layer of a real model.
SIZES = {"distinct": (3, 4, 7, 16), "coincident": (4, 4, 4, 4), "realistic": (4, 8, 64, 64)}
SETTINGS = pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))


def traced(module, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(module, *inputs, mode="warn")
    return trace.findings


def messages(found) -> str:
    return "\n".join(f"[{f.kind}] {f.message}" for f in found)


# -- an argsort's positions gathered along another axis -------------------------------------
class RandomMasking(nn.Module):
    """MAE's random_masking on patch tokens (a conv whose stride is its kernel: batch and
    tokens by structure): keep the tokens of the lowest noise, in a random order per
    example. `how` picks the indices."""

    def __init__(self, d_model, how):
        super().__init__()
        self.how = how
        self.patch_embed = nn.Conv2d(3, d_model, 2, stride=2)

    def forward(self, img, noise):
        x = self.patch_embed(img).flatten(2).transpose(1, 2)
        B, L, D = x.shape
        keep = max(L // 2, 1)
        if self.how == "argsort_batch":
            ids = torch.argsort(noise, dim=0)  # ranks among the examples
        elif self.how == "sort_batch":
            ids = noise.sort(dim=0).indices
        elif self.how == "argsort_tokens":
            ids = torch.argsort(noise, dim=1)
        elif self.how == "topk_tokens":
            ids = noise.topk(keep, dim=1).indices
        elif self.how == "sorted_last":
            ids = noise.sort(dim=-1).indices
        else:  # indices handed in from elsewhere
            ids = torch.randint(0, L, (B, L))
        kept = ids[:, :keep].unsqueeze(-1).repeat(1, 1, D)
        return torch.gather(x, dim=1, index=kept)


def masking_inputs(sizes):
    """Images of 1 x tokens patches, and the noise."""
    batch, _, tokens, _ = sizes
    torch.manual_seed(0)
    return torch.randn(batch, 3, 2, 2 * tokens), torch.rand(batch, tokens)


@SETTINGS
@pytest.mark.parametrize("how", ["argsort_batch", "sort_batch"])
def test_argsort_along_the_batch_gathered_along_the_tokens(sizes, how):
    batch, heads, tokens, d_k = sizes
    found = traced(RandomMasking(heads * d_k, how), *masking_inputs(sizes))
    assert [f.kind for f in found] == ["gather_axis"], messages(found)
    (f,) = found
    assert f.headline == (
        "output = torch.gather(x, dim=1, kept): the values of kept are positions along its "
        f"axis 0, its batch ({batch}) (an argsort or sort along dim=0 made them), but gather "
        f"reads them along x's width ({tokens}) and lines up axis 0 of kept with axis 0 of x: "
        "each row picks by its rank along axis 0, not by its own order"
    ), f.headline
    assert f.hint == (
        "sort along the axis the gather reads: argsort (or sort) with dim=1, so that the "
        "values are positions along axis 1 of x, not dim=0"
    )
    assert f.location.endswith(
        f"test_domain_index_axes.py:{_line('return torch.gather(x, dim=1, index=kept)')}"
    )


@SETTINGS
@pytest.mark.parametrize("how", ["argsort_tokens", "topk_tokens", "sorted_last", "elsewhere"])
def test_gathers_along_the_axis_the_indices_address_are_silent(sizes, how):
    _, heads, _, d_k = sizes
    found = traced(RandomMasking(heads * d_k, how), *masking_inputs(sizes))
    assert not found, messages(found)


class Nearest(nn.Module):
    """Each point's neighbours by a distance matrix of the points against themselves, ranked
    down its columns and gathered along its rows: one axis on both sides, nothing claimed."""

    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        h = self.proj(x)
        d = torch.cdist(h, h)  # [B, N, N]
        ids = torch.argsort(d, dim=1)
        return torch.gather(d, dim=2, index=ids)


@SETTINGS
def test_one_axis_ranked_and_gathered_against_itself_is_silent(sizes):
    batch, heads, tokens, d_k = sizes
    found = traced(Nearest(heads * d_k), torch.randn(batch, tokens, heads * d_k))
    assert not found, messages(found)


# -- a mask tiled over [batch * heads] --------------------------------------------------------
class FoldedAttention(nn.Module):
    """Heads folded into the batch, batch-major (`(b h)`) or heads-major (`(h b)`), and a
    [batch, seq] keep-mask tiled to the fold by `tile`."""

    def __init__(self, d_model, n_heads, fold="b h", tile="einops (b h)"):
        super().__init__()
        self.n_heads, self.fold, self.tile = n_heads, fold, tile
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)

    def forward(self, x, mask):
        h, (B, S, _) = self.n_heads, x.shape
        fold = self.fold
        q, k, v = (
            rearrange(t, f"b n (h d) -> ({fold}) n d", h=h) for t in self.to_qkv(x).chunk(3, -1)
        )
        sim = torch.einsum("b i d, b j d -> b i j", q, k)
        if self.tile == "einops (h b)":
            keep = einops.repeat(mask, "b j -> (h b) () j", h=h)
        elif self.tile == "einops (b h)":
            keep = einops.repeat(mask, "b j -> (b h) () j", h=h)
        elif self.tile == "repeat":
            keep = mask[:, None, :].repeat(self.n_heads, 1, 1)
        elif self.tile == "repeat_interleave":
            keep = mask[:, None, :].repeat_interleave(self.n_heads, dim=0)
        else:  # expand + reshape, each example's copies adjacent
            keep = mask[:, None, None, :].expand(B, h, 1, S).reshape(B * h, 1, S)
        sim = sim.masked_fill(~keep, float("-inf"))
        return torch.einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)


def fold_inputs(sizes):
    batch, heads, tokens, d_k = sizes
    torch.manual_seed(0)
    lengths = torch.tensor([tokens - (i * (tokens - 1)) // (batch + 1) for i in range(batch)])
    return torch.randn(batch, tokens, heads * d_k), torch.arange(tokens) < lengths[:, None]


@SETTINGS
@pytest.mark.parametrize(
    ("fold", "tile", "hint"),
    [
        ("b h", "einops (h b)", 'tile mask in the fold\'s order, (b h): "b j -> (b h) () j"'),
        ("b h", "repeat", "mask.repeat_interleave({heads}, dim=0)"),
        ("h b", "repeat_interleave", "mask.repeat({heads}, 1, 1)"),
        ("h b", "expand", "mask.repeat({heads}, 1, 1)"),
    ],
)
def test_a_mask_tiled_against_the_fold_is_batch_mixing(sizes, fold, tile, hint):
    batch, heads, _, d_k = sizes
    found = traced(FoldedAttention(heads * d_k, heads, fold, tile), *fold_inputs(sizes))
    assert [f.kind for f in found] == ["batch_mixing"], messages(found)
    (f,) = found
    names = {"b": f"batch={batch}", "h": f"heads={heads}"}
    order = " * ".join(names[letter] for letter in fold.split())
    assert f.message.startswith("masked_fill: axis 0 of ~keep is tiled ["), f.message
    assert f"but axis 0 of sim is [{order}]: the heads copies sit where sim has the batch" in (
        f.message
    )
    assert "most heads of each example get another example's rows" in f.message
    assert hint.format(heads=heads).replace("mask", "keep") in f.hint, f.hint
    assert f.location.endswith(f"test_domain_index_axes.py:{_line('sim = sim.masked_fill(~keep')}")


@SETTINGS
@pytest.mark.parametrize(
    ("fold", "tile"),
    [
        ("b h", "einops (b h)"),
        ("b h", "repeat_interleave"),
        ("b h", "expand"),
        ("h b", "repeat"),
        ("h b", "einops (h b)"),
    ],
)
def test_a_mask_tiled_in_the_folds_order_is_silent(sizes, fold, tile):
    _, heads, _, d_k = sizes
    found = traced(FoldedAttention(heads * d_k, heads, fold, tile), *fold_inputs(sizes))
    assert not found, messages(found)


class PerHeadBias(nn.Module):
    """A per-head bias [heads, seq] tiled over the batch (`(b h)`, copies counted by the
    batch read from x): copies outermost, as the fold has the batch. Correct."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.bias = nn.Parameter(torch.zeros(n_heads, 1))

    def forward(self, x):
        B, S, _ = x.shape
        h = self.n_heads
        q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=h) for t in self.to_qkv(x).chunk(3, -1))
        sim = torch.einsum("b i d, b j d -> b i j", q, k)
        bias = self.bias.expand(h, S)
        sim = sim + einops.repeat(bias, "h j -> (b h) () j", b=B)
        return torch.einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)


@SETTINGS
def test_a_per_head_bias_tiled_over_the_batch_is_silent(sizes):
    batch, heads, tokens, d_k = sizes
    found = traced(PerHeadBias(heads * d_k, heads), torch.randn(batch, tokens, heads * d_k))
    assert not found, messages(found)


class UnknownFold(nn.Module):
    """Queries and keys handed in already folded ([batch * heads, seq, d_k], made outside
    the trace): which factor of their first axis is the heads is not established."""

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, q, k, mask):
        sim = torch.einsum("b i d, b j d -> b i j", q, k)
        keep = einops.repeat(mask, "b j -> (h b) () j", h=self.n_heads)
        return sim.masked_fill(~keep, float("-inf")).softmax(dim=-1)


@SETTINGS
def test_a_fold_of_unknown_order_is_silent(sizes):
    batch, heads, tokens, d_k = sizes
    _, mask = fold_inputs(sizes)
    q, k = torch.randn(2, batch * heads, tokens, d_k)
    found = traced(UnknownFold(heads), q, k, mask)
    assert not found, messages(found)


def _line(text: str) -> int:
    with open(__file__) as f:
        lines = [n for n, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]
