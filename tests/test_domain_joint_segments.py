"""A slice of a concatenated token axis whose bound is one part's length, taking another part.

SD3 and Flux joint attention concatenate the text tokens, then the image tokens, attend
over both and split the output back. Split with the image first (`out[:, :N]`, N the
image tokens) the slice cuts across the text/image boundary where the lengths differ, and
is exactly the text where they coincide, handed on as the image output: nothing fails.
`torch.cat` records the parts it joined (`Dim.joined`); a slice bound read from one part's
shape (`N = x.shape[1]`) says which part it means (`checks/segments.py`, `segment_slice`).
Silent: the split in the order of the join, from either end, a class token's prefix cut
by a constant, a KV cache's last keys cut by the new tokens' length, a cache trimmed to a
declared window, at the three size settings.
"""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trace_helpers import describe, findings

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose


@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    heads: int
    d_k: int
    text: int
    grid: int  # the image's latent side: grid * grid image tokens

    @property
    def d_model(self) -> int:
        return self.heads * self.d_k

    @property
    def image(self) -> int:
        return self.grid * self.grid


SETTINGS = [
    Setting("distinct", 3, 4, 8, 5, 3),
    Setting("coincident", 4, 4, 4, 4, 2),  # batch == heads == d_k == text == image tokens
    Setting("realistic", 4, 8, 64, 77, 8),
]
SETTING = pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)


class JointAttention(nn.Module):
    """MM-DiT joint attention: image latents patchified by a conv, text tokens, one
    attention over text then image, the output split back per stream. `split` is how:
    "start" (`[:S]`, `[S:]`), "end" (`[:-N]`, `[-N:]`), or a bug: "image_first"
    (`[:N]`, `[N:]`), "text_last" (`[-S:]` taken as the text)."""

    def __init__(self, s: Setting, split="start"):
        super().__init__()
        self.h, self.d_k, self.split = s.heads, s.d_k, split
        self.embed = nn.Conv2d(4, s.d_model, 1)
        self.img_qkv = nn.Linear(s.d_model, 3 * s.d_model)
        self.txt_qkv = nn.Linear(s.d_model, 3 * s.d_model)
        self.img_out = nn.Linear(s.d_model, s.d_model)
        self.txt_out = nn.Linear(s.d_model, s.d_model)

    def forward(self, latents, txt):
        x = self.embed(latents).flatten(2).transpose(1, 2)  # [B, N, d]
        B, N, S = x.shape[0], x.shape[1], txt.shape[1]
        qi, ki, vi = self.img_qkv(x).view(B, N, 3, self.h, self.d_k).unbind(2)
        qt, kt, vt = self.txt_qkv(txt).view(B, S, 3, self.h, self.d_k).unbind(2)
        q, k, v = (torch.cat(p, dim=1).transpose(1, 2) for p in ((qt, qi), (kt, ki), (vt, vi)))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S + N, -1)
        if self.split == "image_first":
            img, text = out[:, :N], out[:, N:]
        elif self.split == "text_last":
            text = out[:, -S:]
            img = out[:, :-S]
        elif self.split == "end":
            text, img = out[:, :-N], out[:, -N:]
        else:
            text, img = out[:, :S], out[:, S:]
        return self.img_out(img), self.txt_out(text)


def inputs(s: Setting):
    return torch.randn(s.batch, 4, s.grid, s.grid), torch.randn(s.batch, s.text, s.d_model)


def _held(s: Setting, start: int, stop: int) -> str:
    parts, held, offset = (("seq", s.text), ("height*width", s.image)), [], 0
    for name, size in parts:
        a, b = max(start, offset), min(stop, offset + size)
        if a < b:
            held.append(f"all of {name}={size}" if b - a == size else f"{b - a} of {name}={size}")
        offset += size
    return " and ".join(held)


@SETTING
def test_the_output_split_with_the_image_first_is_found_at_the_slice(s):
    torch.manual_seed(0)
    found = findings(JointAttention(s, "image_first"), *inputs(s))
    assert [f.kind for f in found] == ["segment_slice"], describe(found)
    first = found[0]
    total, n, t = s.text + s.image, s.image, s.text
    assert first.relation == (
        f"out[:, :N] takes positions 0:{n} of dim -2 (seq_q={total}), which torch.cat joined "
        f"from [seq={t}, height*width={n}] in that order; N is the length of the second part "
        f"(height*width={n}), as if it were the first, but those positions hold "
        f"{_held(s, 0, n)}"
    )
    assert first.source == "img, text = out[:, :N], out[:, N:]"
    assert [o.name for o in first.operands] == ["out"]
    assert first.hint == (
        f"the second part (height*width) is positions {t}:{total} and the first (seq) 0:{t}: "
        "slice by the part you mean, or torch.cat the parts in the order this slice assumes"
    )
    assert first.severity == "warning"


@SETTING
def test_the_text_taken_from_the_end_is_found(s):
    torch.manual_seed(0)
    found = findings(JointAttention(s, "text_last"), *inputs(s))
    assert [f.kind for f in found] == ["segment_slice"], describe(found)
    total, t = s.text + s.image, s.text
    assert found[0].relation.startswith(
        f"out[:, -S:] takes positions {total - t}:{total} of dim -2 (seq_q={total})"
    )
    assert "S is the length of the first part (seq=" in found[0].relation
    assert "as if it were the second" in found[0].relation
    assert found[0].source == "text = out[:, -S:]"


@SETTING
@pytest.mark.parametrize("split", ["start", "end"])
def test_the_output_split_in_the_order_of_the_join_is_silent(s, split):
    torch.manual_seed(0)
    assert describe(findings(JointAttention(s, split), *inputs(s))) == ""


class PrefixAndCache(nn.Module):
    """A class token joined before the patches and cut off by a constant; a KV cache joined
    before the new keys, split off by the new tokens' length (bug="front": from the front,
    where the cached keys are), trimmed to a declared window, shifted and rolled (one piece
    each, cut by a part's length: by design)."""

    def __init__(self, d_model, heads, window, bug=None):
        super().__init__()
        self.h, self.window, self.bug = heads, window, bug
        self.cls = nn.Parameter(torch.randn(1, 1, d_model))
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, past_k):
        B, T, C = x.shape
        tokens = torch.cat((self.cls.expand(B, -1, -1), x), dim=1)
        patches = tokens[:, 1:]
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).unbind(2)
        keys = torch.cat((past_k, k), dim=1)
        if self.bug == "front":  # the split with the new keys first
            new, cache = keys[:, :T], keys[:, T:]
        else:
            new, cache = keys[:, -T:], keys[:, :-T]
        kept = keys[:, -self.window :]  # a sliding window across the cache and the new keys
        P = past_k.shape[1]
        joined = torch.cat((past_k, k), dim=1)
        shifted = joined[:, :T]  # one piece: a shift, by design
        rolled = joined[:, -P:]  # one piece: a rolling state, by design
        pieces = (patches, new, cache, kept, shifted, rolled, q, v)
        return sum(t.sum() for t in pieces)


def cached(s: Setting):
    x = torch.randn(s.batch, s.image, s.d_model)
    return x, torch.randn(s.batch, s.text, s.heads, s.d_k)


@SETTING
def test_prefix_tokens_and_a_cache_cut_by_their_lengths_are_silent(s):
    torch.manual_seed(0)
    model = PrefixAndCache(s.d_model, s.heads, window=s.text + 1)
    assert describe(findings(model, *cached(s))) == ""


@SETTING
def test_the_new_keys_read_from_the_front_of_the_cache_are_found(s):
    torch.manual_seed(0)
    found = findings(PrefixAndCache(s.d_model, s.heads, s.text + 1, "front"), *cached(s))
    assert [f.kind for f in found] == ["segment_slice"], describe(found)
    assert found[0].relation.startswith(f"keys[:, :T] takes positions 0:{s.image} of dim -3")
    assert "T is the length of the second part" in found[0].relation
