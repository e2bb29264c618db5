"""Bugs for the rules that tests/bug_zoo.py's silent bugs do not reach, and their fixes.

The zoo holds the silent bugs of whole attention modules; these are mostly loud ones, which
torch would also reject (or, for a bool mask added to the scores, compute wrongly), found by
a rule that names the user's axes and says the fix before torch fails. Like the zoo's, every module takes its
sizes as constructor arguments and a `bug` (None: the fix), so tests/test_rule_registry.py
runs each bug and its fix at the three size settings. The line where a bug bites ends in
`# <- name`.

    mask_not_bool     HF's [batch, seq] 0/1 attention mask used as the boolean mask
                      (masked_fill, torch.where) or added to the scores as a bool
    mask_polarity     a masked softmax helper whose mask hides the real tokens
    project_heads     the output projection applied per head, before the heads are merged
    view_transposed   heads merged with .view after the transpose (not contiguous)
    unsplit_qkv       a fused q/k/v projection viewed as heads without splitting it
    positions_unsliced  a learned position table added whole, not cut to the sequence
    gather_axis       MAE's random masking gathering the kept patches along the features
    rope_late         a rotary written for [batch, seq, heads, d_k] (its cos table, a buffer
                      built in __init__, cut by x.size(1)) applied after the heads transpose
    bias_per_head     a per-head [heads, seq, seq] bias added to [batch * heads] scores
    kv_heads          grouped-query keys and values given to SDPA without repeating them
    memory_mask       cross-attention given the queries' padding mask for the memory's keys
    cache_axis        a decode step's keys appended to the cache along the heads
    mask_new_only     a decode step's causal mask over the new tokens only, not the cache
    flash_layout      flash_attention given [batch, heads, seq, d_k] for its [b, s, h, d]
    block_mask_reused a FlexAttention block mask made once for the longest sequence and
                      reused for shorter ones
    aggregation_axis  attention weights summed over the queries, not over the keys their
                      softmax normalised: guided-diffusion's legacy QKV attention with the
                      transposed einsum, a dense graph attention (GAT) with `attn^T @ Wh`
    reach             a causal decoder's mask, in four styles, that lets a real query see a
                      padded key, a later position, a key outside its window, or another
                      packed document (the reach's invariants, found at the softmax); and a
                      cached step's mask built from positions that restart at 0
    edge_softmax      a GAT layer over edge_index whose softmax is grouped by the sources
                      and whose messages are summed into the targets, or the other way round
    latents_axis      Perceiver's latents copied along a new second axis ("n d -> n b d"),
                      so the product pairs the latents with the examples
    queries_batch     DETR's object queries and memory passed batch-first to a seq-first
                      nn.MultiheadAttention, which reads the queries' own rows as the batch
The last two are silent only where two sizes coincide (latents == batch, queries ==
positions); their modules are built with those sizes equal at every setting.
"""

import math
import warnings

import einops
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard.attention import flash_attention


def _heads(t, B, S, h):
    return t.view(B, S, h, -1).transpose(1, 2)


class Masked(nn.Module):
    """The tutorial's attention over a right-padded batch; `masking` is how the 0/1
    attention mask hides the padding: "masked_fill", "where", or "added" to the scores."""

    def __init__(self, d_model, n_heads, masking="masked_fill", bug=None):
        super().__init__()
        self.n_heads, self.masking, self.bug = n_heads, masking, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask):
        B, S, d_model = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        mask = attention_mask[:, None, None, :]  # [B, 1, 1, S_k], 1 for real tokens
        if self.bug == "mask_not_bool":
            if self.masking == "masked_fill":
                scores = scores.masked_fill(mask, float("-inf"))  # <- mask_not_bool
            elif self.masking == "where":
                scores = torch.where(mask, scores, float("-inf"))  # <- mask_not_bool
            else:
                scores = scores + (mask == 0)  # <- mask_not_bool
        elif self.masking == "masked_fill":
            scores = scores.masked_fill(mask == 0, float("-inf"))
        elif self.masking == "where":
            scores = torch.where(mask == 1, scores, float("-inf"))
        else:
            scores = scores + (mask == 0) * torch.finfo(scores.dtype).min
        context = scores.softmax(dim=-1) @ v
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


class MaskedSoftmax(nn.Module):
    """A masked softmax over scores computed elsewhere (a library's `masked_softmax(scores,
    mask)`): with no product in sight, what the mask means is settled by the softmax."""

    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug

    def forward(self, scores, attention_mask):
        if self.bug == "mask_polarity":
            hide = attention_mask[:, None, None, :] == 1  # <- mask_polarity
        else:
            hide = attention_mask[:, None, None, :] == 0  # padding hides keys
        return scores.masked_fill(hide, float("-inf")).softmax(dim=-1)  # <- mask_polarity


def scores_padded(s):
    """Scores [B, h, S, S] and the [B, S] 0/1 attention mask of a right-padded batch."""
    from bug_zoo import attention_mask

    return torch.randn(s.batch, s.heads, s.seq, s.seq), attention_mask(s)


class Merged(nn.Module):
    """Self-attention whose bugs are in the head split, the merge, or the output projection,
    applied as the Linear (`project="linear"`) or as a product with its weight ("matmul",
    "einsum")."""

    def __init__(self, d_model, n_heads, project="linear", bug=None):
        super().__init__()
        self.n_heads, self.project, self.bug = n_heads, project, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def output(self, t):
        if self.project == "linear":
            return self.out(t)  # <- project_heads
        if self.project == "einsum":
            weight, bias = self.out.weight, self.out.bias
            return torch.einsum("...i,oi->...o", t, weight) + bias  # <- project_heads
        return t @ self.out.weight.t() + self.out.bias  # <- project_heads

    def forward(self, x):
        B, S, d_model = x.shape
        if self.bug == "unsplit_qkv":
            qkv = self.qkv(x).view(B, S, self.n_heads, d_model // self.n_heads)  # <- unsplit_qkv
            q, k, v = qkv.transpose(1, 2).chunk(3, dim=-1)
        else:
            q, k, v = self.qkv(x).view(B, S, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        context = scores.softmax(dim=-1) @ v  # [B, h, S, d_k]
        if self.bug == "project_heads":
            return self.output(context)
        if self.bug == "view_transposed":
            context = context.transpose(1, 2).view(B, S, d_model)  # <- view_transposed
        else:
            context = context.transpose(1, 2).reshape(B, S, d_model)
        return self.output(context)


class Positioned(nn.Module):
    """Learned absolute positions, a table of max_len rows added to the token embeddings,
    then self-attention."""

    def __init__(self, d_model, n_heads, max_len, bug=None):
        super().__init__()
        self.bug = bug
        self.positions = nn.Embedding(max_len, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x):
        table = self.positions.weight
        if self.bug != "positions_unsliced":
            table = table[: x.shape[1]]
        x = x + table  # <- positions_unsliced
        out, _ = self.attn(x, x, x, need_weights=False)
        return out


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LateRope(nn.Module):
    """Causal self-attention whose q and k (one batch of both) are rotated by a helper written
    for [batch, seq, heads, d_k]: it reads the positions from axis 1. The fix applies it
    before the heads transpose; the bug after it, where axis 1 holds the heads."""

    def __init__(self, heads, d_k, max_len, bug=None):
        super().__init__()
        self.heads, self.d_k, self.bug = heads, d_k, bug
        self.qkv = nn.Linear(heads * d_k, 3 * heads * d_k)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d_k, 2).float() / d_k))
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)  # [max_len, d_k]
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def rope(self, x):  # x: [batch, seq, heads, d_k]
        T = x.size(1)
        cos = self.cos_cached[:T].view(1, T, 1, x.size(-1))
        sin = self.sin_cached[:T].view(1, T, 1, x.size(-1))
        return x * cos + _rotate_half(x) * sin  # <- rope_late

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = (t.view(B, S, self.heads, self.d_k) for t in self.qkv(x).split(C, dim=2))
        if self.bug != "rope_late":
            q, k = self.rope(torch.cat((q, k))).chunk(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.bug == "rope_late":
            q, k = self.rope(torch.cat((q, k))).chunk(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, S, C)


class RandomMasking(nn.Module):
    """A patch embedding, then MAE's random masking: the kept patches gathered by token ids
    from an argsort of noise, the index copied along the features. The bug gathers along
    them (dim=2), which runs while d_model >= the number of patches."""

    def __init__(self, d_model, bug=None):
        super().__init__()
        self.bug = bug
        self.embed = nn.Linear(d_model, d_model)

    def forward(self, x):
        x = self.embed(x)
        N, L, D = x.shape
        ids_keep = torch.argsort(torch.rand(N, L), dim=1)[:, : max(1, L // 2)]
        index = ids_keep.unsqueeze(-1).repeat(1, 1, D)
        dim = 2 if self.bug == "gather_axis" else 1
        return torch.gather(x, dim, index)  # <- gather_axis


class Biased(nn.Module):
    """Attention on torch.baddbmm with heads folded into the batch ([batch * heads, seq, d_k],
    example-major) and a per-head distance bias [heads, seq, seq], tiled over the batch."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.slopes = nn.Parameter(torch.linspace(0.5, 0.05, n_heads))

    def forward(self, x):
        B, S, d_model = x.shape
        h = self.n_heads
        q, k, v = (_heads(t, B, S, h).reshape(B * h, S, -1) for t in self.qkv(x).chunk(3, dim=-1))
        distance = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).abs()
        bias = -self.slopes[:, None, None] * distance  # [h, S, S]
        if self.bug != "bias_per_head":
            bias = bias.repeat(B, 1, 1)  # [B * h, S, S]: row b * h + i is head i
        scale = 1 / math.sqrt(q.size(-1))
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)  # <- bias_per_head
        context = torch.bmm(scores.softmax(dim=-1), v).view(B, h, S, -1)
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


class Grouped(nn.Module):
    """Grouped-query attention: kv_heads key/value heads shared by the query heads."""

    def __init__(self, d_model, n_heads, kv_heads, bug=None):
        super().__init__()
        self.n_heads, self.kv_heads, self.bug = n_heads, kv_heads, bug
        self.d_k = d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * kv_heads * self.d_k)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, d_model = x.shape
        q = _heads(self.q(x), B, S, self.n_heads)
        k, v = (_heads(t, B, S, self.kv_heads) for t in self.kv(x).chunk(2, dim=-1))
        if self.bug != "kv_heads":
            groups = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        context = F.scaled_dot_product_attention(q, k, v)  # <- kv_heads
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


class CrossMHA(nn.Module):
    """nn.MultiheadAttention from padded queries to a padded memory (`padded_memory`)."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.bug = bug
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x, x_padding, memory, memory_padding):
        padding = x_padding if self.bug == "memory_mask" else memory_padding
        out, _ = self.attn(x, memory, memory, key_padding_mask=padding)  # <- memory_mask
        return out


def padded_memory(s):
    """x [B, S, d_model] and memory [B, S_k, d_model], each with its [B, length] padding
    mask, True at padding (nn.MultiheadAttention's key_padding_mask)."""
    from bug_zoo import Sizes, attention_mask

    memory_sizes = Sizes(**{**s.__dict__, "seq": s.seq_k})
    x, memory = torch.randn(s.batch, s.seq, s.d_model), torch.randn(s.batch, s.seq_k, s.d_model)
    return x, attention_mask(s) == 0, memory, attention_mask(memory_sizes) == 0


class Decoding(nn.Module):
    """One decoding step: the new tokens' keys and values appended to the cache
    (past_key, past_value: [B, h, S_past, d_k]), then SDPA aligned bottom-right."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, past_key, past_value):
        B, S, d_model = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        axis = 1 if self.bug == "cache_axis" else 2
        k = torch.cat([past_key, k], dim=axis)  # <- cache_axis
        v = torch.cat([past_value, v], dim=axis)  # <- cache_axis
        if self.bug == "mask_new_only":
            keep = torch.ones(S, S, dtype=torch.bool).tril()  # <- mask_new_only
        else:
            keep = torch.ones(S, k.size(2), dtype=torch.bool).tril(k.size(2) - S)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # <- mask_new_only
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


class Flash(nn.Module):
    """flash-attn's layout [batch, seq, heads, d_k], through shapeguard.attention (SDPA
    off the GPU)."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, d_model = x.shape
        q, k, v = (t.view(B, S, self.n_heads, -1) for t in self.qkv(x).chunk(3, dim=-1))
        if self.bug == "flash_layout":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        context = flash_attention(q, k, v, causal=True, backend="sdpa")  # <- flash_layout
        if self.bug == "flash_layout":
            context = context.transpose(1, 2)
        return self.out(context.reshape(B, S, d_model))


class Flex(nn.Module):
    """Causal FlexAttention; the bug makes its block mask once, for `max_seq` positions, and
    reuses it whatever the sequence (torch refuses it too, without the names)."""

    def __init__(self, d_model, n_heads, max_seq, bug=None):
        super().__init__()
        from torch.nn.attention.flex_attention import create_block_mask

        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.made = create_block_mask(_causal, None, None, max_seq, max_seq, device="cpu")

    def forward(self, x):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        B, S, d_model = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        if self.bug == "block_mask_reused":
            block_mask = self.made
        else:
            block_mask = create_block_mask(_causal, None, None, S, S, device="cpu")
        with warnings.catch_warnings():  # eager flex_attention warns that it is unfused
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
            context = flex_attention(q, k, v, block_mask=block_mask)  # <- block_mask_reused
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Reaching(nn.Module):
    """A causal decoder layer (`is_causal = True`) over `inputs_embeds`, its mask built from
    the inputs as transformers gives them: the 0/1 attention_mask, `sliding_window` keys
    per query where set, and for the "documents" style a block per packed document, read
    from position ids that restart. `style` says which part the bug breaks; the finding
    is at the softmax that reads the mask."""

    is_causal = True

    def __init__(self, d_model, n_heads, style, sliding_window=None, bug=None):
        super().__init__()
        self.n_heads, self.style, self.bug = n_heads, style, bug
        self.sliding_window = sliding_window
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, inputs_embeds, attention_mask, position_ids):
        B, S, d_model = inputs_embeds.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(inputs_embeds).chunk(3, -1))
        i = torch.arange(S)
        shift = 1 if self.bug and self.style == "future" else 0
        keep = i[None, :] <= i[:, None] + shift  # [S_q, S_k]
        if self.sliding_window is not None:
            w = self.sliding_window + (1 if self.bug and self.style == "window" else 0)
            keep = keep & (i[None, :] > i[:, None] - w)
        keep = keep[None, None]  # [1, 1, S_q, S_k]
        if self.style == "documents" and not self.bug:
            document = (position_ids == 0).cumsum(-1)  # [B, S]
            keep = keep & (document[:, None, :, None] == document[:, None, None, :])
        if not (self.bug and self.style == "padded_key"):
            keep = keep & attention_mask.bool()[:, None, None, :]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        context = scores.softmax(dim=-1) @ v  # <- reach
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


class CachedStep(nn.Module):
    """A causal decoder's cached step (`is_causal = True`): the new tokens' keys and values
    joined to the cache (past_key, past_value: [B, h, S_past, d_k]) with torch.cat, and a
    boolean mask from the positions (query i at past + i sees keys 0..past + i); the bug
    restarts the queries' positions at 0, so they miss the cache and their own keys."""

    is_causal = True

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, past_key, past_value):
        B, S, d_model = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        past = past_key.size(2)
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        start = 0 if self.bug else past
        query_positions = torch.arange(start, start + S)  # <- reach
        keep = torch.arange(k.size(2))[None, :] <= query_positions[:, None]  # [S, past + S]
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # <- reach
        return self.out(context.transpose(1, 2).reshape(B, S, d_model))


def reach_window(s):
    """The window `Reaching` keeps: a third of the sequence, at least 2."""
    return max(2, s.seq // 3)


def left_padded_embeds(s):
    """inputs_embeds [B, S, d_model], a left-padded 0/1 attention_mask (generation's
    layout), and the position ids transformers makes for it (pads at 1)."""
    from bug_zoo import attention_mask

    mask = attention_mask(s).flip(-1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return torch.randn(s.batch, s.seq, s.d_model), mask, positions


def packed_embeds(s, documents=2):
    """`documents` documents packed in each row (position ids restart at 0 where each
    starts); no padding."""
    cut = max(1, s.seq // documents)
    positions = torch.cat([torch.arange(cut), torch.arange(s.seq - cut)])
    if documents == 1:
        positions = torch.arange(s.seq)
    mask = torch.ones(s.batch, s.seq, dtype=torch.long)
    return torch.randn(s.batch, s.seq, s.d_model), mask, positions.expand(s.batch, -1)


def unpadded_embeds(s):
    """One document per row, no padding."""
    return packed_embeds(s, documents=1)


class LegacyQKV(nn.Module):
    """guided-diffusion's QKVAttentionLegacy on a [B, d_model, tokens] feature map: q, k, v
    as [batch * heads, channels, tokens], the scores by an einsum of the transposed layout."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Conv1d(d_model, 3 * d_model, 1)
        self.proj = nn.Conv1d(d_model, d_model, 1)

    def forward(self, x):
        qkv = self.qkv(x)
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale).softmax(dim=-1)
        if self.bug == "aggregation_axis":
            a = torch.einsum("bst,bcs->bct", weight, v)  # <- aggregation_axis
        else:
            a = torch.einsum("bts,bcs->bct", weight, v)
        return x + self.proj(a.reshape(bs, -1, length))


def feature_map(s):
    """A [B, d_model, seq] feature map (a conv's channels first)."""
    return (torch.randn(s.batch, s.d_model, s.seq),)


class DenseGAT(nn.Module):
    """A multi-head graph attention layer written densely: scores are the node axis
    broadcast against itself, softmax over each node's neighbours."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        d_k = d_model // n_heads
        self.W = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))
        self.a_dst = nn.Parameter(torch.randn(n_heads, d_k, 1) / math.sqrt(d_k))
        self.a_src = nn.Parameter(torch.randn(n_heads, d_k, 1) / math.sqrt(d_k))

    def forward(self, x, adj):  # x [nodes, d_model], adj [nodes, nodes]
        N = x.shape[0]
        Wh = (x @ self.W).view(N, self.n_heads, -1).transpose(0, 1)  # [heads, nodes, d_k]
        e = F.leaky_relu(Wh @ self.a_dst + (Wh @ self.a_src).transpose(-2, -1), 0.2)
        attn = e.masked_fill(adj == 0, float("-inf")).softmax(dim=-1)
        weights = attn.transpose(-2, -1) if self.bug == "aggregation_axis" else attn
        out = weights @ Wh  # <- aggregation_axis
        return out.transpose(0, 1).reshape(N, -1)


def graph(s):
    """Node features [seq, d_model] and a 0/1 adjacency [seq, seq] with self-loops."""
    adj = (torch.rand(s.seq, s.seq) < 0.5) | torch.eye(s.seq, dtype=torch.bool)
    return torch.randn(s.seq, s.d_model), adj.float()


class GraphAttention(nn.Module):
    """A GAT layer from scratch over `edge_index` [2, edges]: edge scores, a softmax over the
    edges that share a target (sums scattered by the targets, read back by them) and the
    weighted messages summed into the targets. `style` is how the rows and the sums are
    written: "index_add" (`edge_index[0]`, `index_add_`), or "scatter_add" (`src, dst =
    edge_index`, an expanded index and `scatter_add_`, as torch_geometric writes it);
    the bug groups the softmax by the sources ("scatter_add") or sums into the sources
    ("index_add")."""

    def __init__(self, d_model, heads, style="index_add", bug=None):
        super().__init__()
        self.heads, self.d_k, self.style, self.bug = heads, d_model // heads, style, bug
        self.lin = nn.Linear(d_model, d_model, bias=False)
        self.att_src = nn.Parameter(torch.randn(1, heads, self.d_k))
        self.att_dst = nn.Parameter(torch.randn(1, heads, self.d_k))

    def _sums(self, values, index, nodes):
        if self.style == "index_add":
            return values.new_zeros(nodes, *values.shape[1:]).index_add_(0, index, values)
        wide = index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
        return values.new_zeros(nodes, *values.shape[1:]).scatter_add_(0, wide, values)

    def forward(self, x, edge_index):
        nodes = x.shape[0]
        h = self.lin(x).view(nodes, self.heads, self.d_k)
        if self.style == "index_add":
            src, dst = edge_index[0], edge_index[1]
        else:
            src, dst = edge_index
        a_src, a_dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)  # [nodes, heads]
        e = F.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), 0.2)
        group = src if self.bug and self.style == "scatter_add" else dst
        e_max = e.new_full((nodes, self.heads), float("-inf")).scatter_reduce(
            0, group.unsqueeze(-1).expand_as(e), e, reduce="amax", include_self=True
        )
        w = (e - e_max.index_select(0, group)).exp()
        alpha = w / self._sums(w, group, nodes).index_select(0, group)  # [edges, heads]
        msg = h.index_select(0, src) * alpha.unsqueeze(-1)  # [edges, heads, d_k]
        into = src if self.bug and self.style == "index_add" else dst
        empty = msg.new_zeros(nodes, self.heads, self.d_k)
        if self.style == "index_add":
            out = empty.index_add_(0, into, msg)  # <- edge_softmax
        else:
            out = empty.scatter_add_(0, into.view(-1, 1, 1).expand_as(msg), msg)  # <- edge_softmax
        return out.reshape(nodes, self.heads * self.d_k)


def graph_inputs(s):
    """Node features [nodes, d_model] (nodes = seq) and edge_index [2, edges]: a directed
    ring, plus `batch` chords where batch differs from seq, so nodes, edges, heads and d_k
    are pairwise distinct at the distinct setting and all equal at the coincident one."""
    nodes = s.seq
    ring = torch.arange(nodes)
    extra = s.batch if s.batch != s.seq else 0
    chords = torch.arange(extra) % nodes
    src = torch.cat([ring, chords])
    dst = torch.cat([(ring + 1) % nodes, (chords + 2) % nodes])
    return torch.randn(nodes, s.d_model), torch.stack([src, dst])


# -- axes lined up where their sizes coincide -------------------------------------------
class Latents(nn.Module):
    """Perceiver's cross-attention: as many learned latents as examples attend to the data;
    style "einops" copies them with einops.repeat, "expand" with unsqueeze + expand."""

    def __init__(self, d_model, n_heads, n_latents, style, bug=None):
        super().__init__()
        self.heads, self.style, self.bug = n_heads, style, bug
        self.latents = nn.Parameter(torch.randn(n_latents, d_model) * 0.02)
        self.to_q, self.to_kv = nn.Linear(d_model, d_model), nn.Linear(d_model, 2 * d_model)

    def forward(self, data):
        B = data.shape[0]
        if self.style == "einops" and self.bug == "latents_axis":
            x = einops.repeat(self.latents, "n d -> n b d", b=B)
        elif self.style == "einops":
            x = einops.repeat(self.latents, "n d -> b n d", b=B)
        elif self.bug == "latents_axis":
            x = self.latents.unsqueeze(1).expand(-1, B, -1)
        else:
            x = self.latents.unsqueeze(0).expand(B, -1, -1)
        q = einops.rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.heads)
        k, v = (
            einops.rearrange(t, "b n (h d) -> b h n d", h=self.heads)
            for t in self.to_kv(data).chunk(2, dim=-1)
        )
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k)  # <- latents_axis
        attn = (sim * q.shape[-1] ** -0.5).softmax(dim=-1)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        return einops.rearrange(out, "b h n d -> b n (h d)")


class ObjectQueries(nn.Module):
    """DETR's cross-attention: learned object queries (as many as the feature map's
    positions) attend to a conv feature map through a seq-first nn.MultiheadAttention."""

    def __init__(self, d_model, n_heads, n_queries, bug=None):
        super().__init__()
        self.bug = bug
        self.backbone = nn.Conv1d(d_model, d_model, 1)
        self.queries = nn.Embedding(n_queries, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads)

    def forward(self, signal):
        features = self.backbone(signal)  # [B, d_model, L]
        B = features.shape[0]
        if self.bug == "queries_batch":
            memory = features.transpose(1, 2)
            query = self.queries.weight.unsqueeze(0).repeat(B, 1, 1)
        else:
            memory = features.permute(2, 0, 1)  # [L, B, d_model]
            query = self.queries.weight.unsqueeze(1).repeat(1, B, 1)  # [Q, B, d_model]
        return self.attn(query, memory, memory, need_weights=False)[0]  # <- queries_batch


class DeformWeights(nn.Module):
    """Multi-scale deformable attention's weighting (levels * points = 6 sampled values per
    head and query, made by a Linear): values [batch * heads, d_k, queries, 6] times
    weights [batch * heads, 1, queries, 6], summed over the 6."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.h, self.bug = n_heads, bug
        self.attention_weights = nn.Linear(d_model, n_heads * 6)
        self.sampled = nn.Linear(d_model, d_model * 6)

    def forward(self, query):
        B, Lq, C = query.shape
        h = self.h
        sampled = self.sampled(query).view(B, Lq, h, C // h, 6).permute(0, 2, 3, 1, 4)
        if self.bug == "aggregation_axis":
            weights = self.attention_weights(query).softmax(-1).view(B, Lq, h, 6)
        else:
            weights = self.attention_weights(query).view(B, Lq, h, 6).softmax(-1)
        weights = weights.transpose(1, 2).reshape(B * h, 1, Lq, 6)
        weighted = sampled.reshape(B * h, C // h, Lq, 6) * weights
        return weighted.sum(-1).view(B, C, Lq)  # <- aggregation_axis


class JointSplit(nn.Module):
    """SD3/Flux joint attention: text tokens, then image tokens, one attention over both;
    the bug takes the image output from the front, where the text is."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.h, self.bug = n_heads, bug
        self.img_qkv = nn.Linear(d_model, 3 * d_model)
        self.txt_qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, img, txt):  # [B, N, d], [B, S, d]
        B, N, S = img.shape[0], img.shape[1], txt.shape[1]
        qi, ki, vi = self.img_qkv(img).view(B, N, 3, self.h, -1).unbind(2)
        qt, kt, vt = self.txt_qkv(txt).view(B, S, 3, self.h, -1).unbind(2)
        q, k, v = (torch.cat(p, dim=1).transpose(1, 2) for p in ((qt, qi), (kt, ki), (vt, vi)))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S + N, -1)
        if self.bug == "segment_slice":
            img_out, txt_out = out[:, :N], out[:, N:]  # <- segment_slice
        else:
            txt_out, img_out = out[:, :S], out[:, S:]
        return img_out, txt_out


def image_and_text(s):
    """Image tokens [batch, seq, d_model] and text tokens [batch, seq_k, d_model]."""
    return torch.randn(s.batch, s.seq, s.d_model), torch.randn(s.batch, s.seq_k, s.d_model)
