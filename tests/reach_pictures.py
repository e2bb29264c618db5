"""Real traces with a reach to draw, and a page of one site's reach section alone: for the
browser test (tests/test_report_html.py) and for docs/reach.png, which is made by

    python tests/reach_pictures.py /tmp/reach.html
    chromium --headless --screenshot=docs/reach.png --window-size=720,330 /tmp/reach.html
"""

import math
import sys

import torch
from torch import nn

import shapeguard
from shapeguard.report._html_reach import reach_section
from shapeguard.report._reach_view import matching
from shapeguard.report.html import CSS

BATCH, SEQ, D_MODEL = 3, 9, 32


class Attention(nn.Module):
    """Causal self-attention over the keys `keep` marks real."""

    def __init__(self, d_model=D_MODEL, n_heads=4):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, keep):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~(causal & keep[:, None, None, :]), float("-inf"))
        return (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)


def left_padded_trace() -> shapeguard.Trace:
    """The trace of one causal layer whose example 1 is left-padded by two tokens."""
    torch.manual_seed(0)
    keep = torch.ones(BATCH, SEQ, dtype=torch.bool)
    keep[1, :2] = False
    return shapeguard.trace(Attention(), torch.randn(BATCH, SEQ, D_MODEL), keep)


def llama_trace() -> shapeguard.Trace:
    """A tiny transformers Llama (SDPA) on a left-padded batch, as `generate` pads it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=D_MODEL,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :2] = 0
    ids = torch.randint(3, 64, (BATCH, SEQ))
    return shapeguard.trace(model, input_ids=ids, attention_mask=mask)


def reach_page(trace, layer: str | None = None) -> str:
    """The reach section of `trace`'s sites in `layer` (all without it) as a page of its
    own, with the report's styles."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>reach</title>'
        f"<style>{CSS}</style></head><body><main>{reach_section(trace, matching(trace, layer))}</main></body></html>"
    )


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        out.write(reach_page(llama_trace(), "model.layers.0.self_attn"))
