"""Ready-made shape contracts for the common attention layouts.

Each name is a jaxtyping annotation, so it goes straight into a signature::

    from shapeguard.contracts import Tokens, Mask

    @shapeguard.guard
    class SelfAttention(nn.Module):
        def forward(self, x: Tokens, mask: Mask | None = None) -> Tokens: ...

The axis names are the ones shapeguard binds to module attributes and uses in
its messages: `batch`, `seq` (self-attention) or `seq_q`/`seq_k` (queries and
keys), `d_model` (bound to `self.d_model`, `self.embed_dim`, `self.n_embd`, ...),
`heads` (`self.n_heads`, `self.num_heads`, ...), `kv_heads`
(`self.n_kv_heads`, `self.num_key_value_heads`, ...) and `d_k` (`self.d_k`,
`self.head_dim`, or d_model // heads). Values use `d_k` too: attention code
almost always gives V the head size of K.

Importing this module imports torch (the annotations name `torch.Tensor`);
`import shapeguard` alone does not.
"""

from jaxtyping import Float, Shaped
from torch import Tensor

__all__ = [
    "Context",
    "FlashK",
    "FlashKVHeads",
    "FlashQ",
    "FlashV",
    "GQAK",
    "GQAV",
    "HeadsK",
    "HeadsQ",
    "HeadsV",
    "KeyTokens",
    "Mask",
    "PaddingMask",
    "QueryTokens",
    "Scores",
    "Tokens",
]

# -- token layouts: [batch, seq, d_model] ---------------------------------------------

#: Self-attention input and output.
Tokens = Float[Tensor, "batch seq d_model"]
#: Cross-attention queries (the decoder side).
QueryTokens = Float[Tensor, "batch seq_q d_model"]
#: Cross-attention keys and values (the encoder memory).
KeyTokens = Float[Tensor, "batch seq_k d_model"]

# -- per-head layout: [batch, heads, seq, d_k] (torch SDPA, the tutorials) --------------

HeadsQ = Float[Tensor, "batch heads seq_q d_k"]
HeadsK = Float[Tensor, "batch heads seq_k d_k"]
HeadsV = Float[Tensor, "batch heads seq_k d_k"]
#: Attention scores and weights, `Q @ K^T` and its softmax.
Scores = Float[Tensor, "batch heads seq_q seq_k"]
#: `weights @ V`, before the heads are merged back.
Context = Float[Tensor, "batch heads seq_q d_k"]

# -- flash layout: [batch, seq, heads, d_k] (flash-attn, xformers) ----------------------

FlashQ = Float[Tensor, "batch seq_q heads d_k"]
FlashK = Float[Tensor, "batch seq_k heads d_k"]
FlashV = Float[Tensor, "batch seq_k heads d_k"]
#: Keys or values with fewer heads than the queries (GQA/MQA), flash layout.
FlashKVHeads = Float[Tensor, "batch seq_k kv_heads d_k"]

# -- grouped-query attention, per-head layout -------------------------------------------

GQAK = Float[Tensor, "batch kv_heads seq_k d_k"]
GQAV = Float[Tensor, "batch kv_heads seq_k d_k"]

# -- masks: bool (True = attend) or additive float (0 / -inf) ---------------------------

#: A mask shared by all heads, one row per query: `[batch, 1, seq_q, seq_k]`.
Mask = Shaped[Tensor, "batch 1 seq_q seq_k"]
#: A key padding mask, one flag per key: `[batch, seq_k]`.
PaddingMask = Shaped[Tensor, "batch seq_k"]
