"""Why the sequence probes do not apply where no output keeps the tokens' axis: the reason
names what the trace saw (issue 30; nanoGPT's `logits[:, [-1], :]` was told "patches,
strided frames"): the op that picked, pooled or convolved the positions, with its shapes,
or the output axis they were merged into.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

# batch, heads, seq, d_k: pairwise distinct; batch == heads == seq == d_k; realistic.
SIZES = {
    "distinct": (3, 4, 7, 16),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
VOCAB = 50
HERE = os.path.relpath(__file__)  # locations are relative to the working directory


def line_of(text: str) -> int:
    """The line of this file that holds `text` (the op the reason must point at)."""
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "line_of" not in line)


class GPT(nn.Module):
    """nanoGPT's shape: causal self-attention, then the logits; `out` says what it returns:
    "last" (`logits[:, [-1], :]` at inference, no targets), "flat" (logits flattened to
    [batch*seq, vocab]), "pooled" (the mean over the tokens), "all" (every position)."""

    def __init__(self, heads, d_k, out):
        super().__init__()
        C = heads * d_k
        self.h, self.out = heads, out
        self.wte, self.wpe = nn.Embedding(VOCAB, C), nn.Embedding(128, C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.lm_head = nn.Linear(C, VOCAB, bias=False)

    def forward(self, idx):
        B, T = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(T))
        C = x.size(-1)
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        if self.out == "last":
            return self.lm_head(x[:, [-1], :])  # inference: only the last position
        if self.out == "flat":
            return self.lm_head(x).view(B * T, VOCAB)
        if self.out == "pooled":
            return self.lm_head(x.mean(dim=1))
        return self.lm_head(x)


def reasons(size, out):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(0)
    model = GPT(h, dk, out).eval()
    report = check(model, torch.randint(1, VOCAB, (b, s)))
    assert report.failed == [], report.render(width=300)
    return {r.name: r for r in report.results}


@pytest.mark.parametrize("size", SIZES)
def test_a_gpt_returning_its_last_position_is_told_it_keeps_1_of_them(size):
    b, h, s, dk = SIZES[size]
    got = reasons(size, "last")
    causality = got["causality"]
    assert causality.status == "skipped" and not causality.applicable
    assert causality.message == (
        "the outputs keep none of the inputs' token axes (seq of idx): __getitem__ at "
        f"{HERE}:{line_of('x[:, [-1], :]')} (GPT) takes [{b}, {s}, {h * dk}] to "
        f"[{b}, 1, {h * dk}]: it keeps 1 of the {s} positions"
    )
    assert "patches" not in got["length change"].message
    assert got["length change"].message == causality.message


def test_flattened_logits_are_said_merged_with_the_batch():
    b, h, s, dk = SIZES["distinct"]
    message = reasons("distinct", "flat")["causality"].message
    assert message == (
        "the outputs keep none of the inputs' token axes (seq of idx): the output "
        f"[{b * s}, {VOCAB}] holds its {s} positions only merged into axis 0, "
        f"{b * s} = batch {b} x seq {s}"
    )


def test_pooled_positions_are_said_reduced():
    b, h, s, dk = SIZES["distinct"]
    message = reasons("distinct", "pooled")["causality"].message
    assert message == (
        "the outputs keep none of the inputs' token axes (seq of idx): mean at "
        f"{HERE}:{line_of('x.mean(dim=1)')} (GPT) takes [{b}, {s}, {h * dk}] to "
        f"[{b}, {h * dk}]: it reduces the {s} positions to one"
    )


def test_a_gpt_returning_every_position_is_probed():
    got = reasons("distinct", "all")
    assert got["causality"].status == "passed", got["causality"].message


class Patches(nn.Module):
    """A ViT's patch embedding: the positions are made inside, by a strided conv."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.patch = nn.Conv2d(3, heads * d_k, 4, stride=4)
        self.attn = nn.MultiheadAttention(heads * d_k, heads, batch_first=True)

    def forward(self, pixel_values):
        x = self.patch(pixel_values).flatten(2).transpose(1, 2)
        return self.attn(x, x, x, need_weights=False)[0]


def test_patches_are_said_made_by_the_conv_that_makes_them():
    torch.manual_seed(0)
    report = check(Patches(4, 8), torch.randn(3, 3, 12, 20))
    message = next(r for r in report.results if r.name == "length change").message
    assert message == (
        "the outputs keep none of the inputs' token axes (height of pixel_values, width of "
        "pixel_values): conv2d at "
        f"{HERE}:{line_of('self.patch(pixel_values)')} (patch) takes [3, 3, 12, 20] to "
        "[3, 32, 3, 5]: it makes new positions from the 12 (patches, strided frames)"
    )
