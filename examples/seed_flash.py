"""The self-attention tutorial's FlashAttention snippet, corrected and guarded.

The tutorial writes

    from flash_attn import flash_attention
    def forward(self, Q, K, V):
        return flash_attention(Q, K, V, causal=True)

flash-attn has no `flash_attention` (its function is `flash_attn_func`), and
`flash_attn_func` takes [batch, seq, heads, head_dim], not the tutorial's
[batch, heads, seq, d_k]: fed the tutorial's Q it attends across heads instead of
positions. This version projects straight into flash-attn's layout (no transpose)
and calls `shapeguard.attention.flash_attention`, which checks flash-attn's
contract, runs flash-attn on an Ampere-or-newer GPU, and falls back to torch's
SDPA with the same semantics elsewhere (with one FlashFallbackWarning):

    python examples/seed_flash.py
"""

import torch
from torch import nn

import shapeguard
from shapeguard.attention import flash_attention


@shapeguard.guard
class FlashSelfAttention(nn.Module):
    def __init__(self, d_model=512, n_heads=8):
        super().__init__()
        if d_model % n_heads:  # a real check: `assert` vanishes under python -O
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        # [batch, seq, d_model] -> [batch, seq, heads, d_k]: flash-attn's layout, no transpose
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k)
        K = self.W_k(x).view(B, T, self.n_heads, self.d_k)
        V = self.W_v(x).view(B, T, self.n_heads, self.d_k)
        context = flash_attention(Q, K, V, causal=True)  # [batch, seq, heads, d_k]
        return self.out(context.reshape(B, T, self.d_model))


def example_inputs(batch: int = 2, seq: int = 16, d_model: int = 512, device=None, dtype=None):
    """One batch of token embeddings, [batch, seq, d_model]."""
    x = torch.randn(batch, seq, d_model, device=device, dtype=dtype)
    return (x,), {}


def build_model():
    return FlashSelfAttention(d_model=512, n_heads=8)


if __name__ == "__main__":
    torch.manual_seed(0)
    # flash-attn runs float16/bfloat16 on CUDA; on a CPU the fallback runs float32.
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    model = build_model().to(device=device, dtype=dtype)
    args, kwargs = example_inputs(device=device, dtype=dtype)
    trace = shapeguard.trace(model, *args, **kwargs)
    print(trace.table())
