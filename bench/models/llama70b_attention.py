"""A Llama-70B-shaped decoder stack: 80 blocks of GQA attention (SDPA) and a SwiGLU MLP.

d_model 8192, 64 query heads, 8 key/value heads (head_dim 128), MLP width 28672,
bfloat16 weights; no embedding or rotary embedding, since the input is already
hidden states. Far too big for a laptop on cpu (about 137 GB of weights), which
is the point: `shapeguard trace --device meta` checks it with no memory.

    shapeguard trace bench/models/llama70b_attention.py --device meta
"""

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL = 8192
N_HEADS = 64
N_KV_HEADS = 8
N_LAYERS = 80
FFN_DIM = 28672
SEQ = 8192
BATCH = 1
DTYPE = torch.bfloat16


class GQAttention(nn.Module):
    """Grouped-query self-attention: 64 query heads share 8 key/value heads."""

    def __init__(self, d_model=D_MODEL, n_heads=N_HEADS, n_kv_heads=N_KV_HEADS, dtype=DTYPE):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        kv_dim = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(d_model, d_model, bias=False, dtype=dtype)

    def forward(self, x):
        B, T, _ = x.shape
        # [batch, seq, d_model] -> [batch, heads, seq, head_dim]
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        context = context.transpose(1, 2).reshape(B, T, self.d_model)
        return self.o_proj(context)


class SwiGLU(nn.Module):
    def __init__(self, d_model=D_MODEL, ffn_dim=FFN_DIM, dtype=DTYPE):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, ffn_dim, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(d_model, ffn_dim, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(ffn_dim, d_model, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dtype=DTYPE):
        super().__init__()
        self.attn_norm = nn.RMSNorm(D_MODEL, dtype=dtype)
        self.attn = GQAttention(dtype=dtype)
        self.mlp_norm = nn.RMSNorm(D_MODEL, dtype=dtype)
        self.mlp = SwiGLU(dtype=dtype)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama70BStack(nn.Module):
    """80 decoder blocks; input and output are hidden states [batch, seq, d_model]."""

    def __init__(self, n_layers=N_LAYERS, dtype=DTYPE):
        super().__init__()
        self.d_model = D_MODEL
        self.blocks = nn.ModuleList(Block(dtype=dtype) for _ in range(n_layers))
        self.norm = nn.RMSNorm(D_MODEL, dtype=dtype)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def build_model(n_layers: int = N_LAYERS):
    return Llama70BStack(n_layers=n_layers)


def example_inputs(batch: int = BATCH, seq: int = SEQ):
    # Made under the caller's default device: meta for `--device meta`.
    return (torch.randn(batch, seq, D_MODEL, dtype=DTYPE),)
